// SPDX-License-Identifier: Apache-2.0

// Package testkernel holds the GPU kernels of tests that run on a real GPU.
// Only test files import it.
package testkernel

// SpinKernelPTX is a kernel for tests, in PTX that the driver compiles at
// load: spin_until_set(const volatile u32 *flag) returns once *flag is not
// 0. Launched on a stream, it holds everything behind it until the host
// sets a mapped word, which lets a test prove that nothing ran early.
const SpinKernelPTX = `.version 7.0
.target sm_75
.address_size 64

.visible .entry spin_until_set(
	.param .u64 spin_until_set_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [spin_until_set_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
$L__BB0_1:
	ld.volatile.global.u32 	%r1, [%rd2];
	setp.eq.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB0_1;
	ret;
}
`

// SpinKernelName is the entry of SpinKernelPTX.
const SpinKernelName = "spin_until_set"
