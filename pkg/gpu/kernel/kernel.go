// SPDX-License-Identifier: Apache-2.0

// Package kernel holds PXN's CUDA kernels as PTX, embedded in the binary and
// JIT-compiled by the driver when pkg/gpu loads them (cuModuleLoadData).
// The PTX is generated from the .cu sources by hack/gen-ptx.sh with nvcc
// and committed; nothing here needs CUDA to build.
package kernel

import _ "embed"

//go:embed gather.ptx
var gatherPTX []byte

// GatherEntry is the gather kernel's name in GatherPTX:
// pxn_gather(const entry *plan, const u64 *prefix, u32 n, const u64 *cuts,
// u32 parts, u32 *arrived, u64 *words, u64 seq), where an entry is
// {src, dst, len} (three u64, the layout of relay.CopyEntry); the Piece is
// copied in parts ending at cuts, the end of each part but the last
// signalled by a store of seq into words (null: none).
const GatherEntry = "pxn_gather"

// GatherInlineEntry is the kernel that takes a plan of at most
// cuda.InlineEntries entries by value, pxn_gather_inline(pxn_inline_plan
// p): the plan, its prefix sums and the part arguments of GatherEntry in one
// parameter of 16 KiB (the layout of cuda's pxn_inline_plan).
const GatherInlineEntry = "pxn_gather_inline"

// GatherArch is the virtual architecture the PTX is generated for: the
// driver can JIT it for compute capability 9.0 (Hopper) and later.
const GatherArch = "compute_90"

// GatherPTX returns the gather kernel's PTX (a copy: the caller may keep
// or change it).
func GatherPTX() []byte { return append([]byte(nil), gatherPTX...) }
