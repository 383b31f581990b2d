// SPDX-License-Identifier: Apache-2.0

package main

/*
#cgo CFLAGS: -I${SRCDIR} -I${SRCDIR}/../../include
#include <stdlib.h>
#include <string.h>
#include "shim.h"

size_t pxn_last_error(char *buf, size_t len);

static int seam_submit(void *user, const pxn_transport_op *ops, size_t count)
{
	(void)user; (void)ops; (void)count;
	return PXN_EIO;
}

static size_t seam_poll(void *user, pxn_transport_completion *out, size_t capacity)
{
	(void)user; (void)out; (void)capacity;
	return 0;
}

static int seam_submit_piece(void *user, const pxn_transport_op *ops, size_t count, uint64_t token)
{
	(void)user; (void)ops; (void)count; (void)token;
	return PXN_EIO;
}

static int seam_register(void *user, void *addr, uint64_t len, int kind, uint64_t *key)
{
	(void)user; (void)addr; (void)len; (void)kind;
	*key = 1;
	return PXN_OK;
}

static int seam_deregister(void *user, void *addr, uint64_t len, uint64_t key)
{
	(void)user; (void)addr; (void)len; (void)key;
	return PXN_OK;
}

static void seam_fill(pxn_options *o, pxn_transport *t, int submit, int poll, int piece, int reg, int dereg)
{
	t->submit = submit ? seam_submit : NULL;
	t->poll = poll ? seam_poll : NULL;
	t->submit_piece = piece ? seam_submit_piece : NULL;
	o->register_arena = reg ? seam_register : NULL;
	o->deregister_arena = dereg ? seam_deregister : NULL;
}
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// The calls below reach the exported functions the way a C host does,
// with arguments in C memory, for the package's tests: go test does not
// run cgo on test files. Nothing else calls them.

// seamOpenArgs is what a host puts in pxn_options and its pxn_transport.
// A nil hca is a NULL local_hca; hca gets a NUL after its bytes.
type seamOpenArgs struct {
	size, version             uint32
	hca                       []byte
	transport                 bool
	transportSize             uint32
	submit, poll, piece       bool
	register, deregister      bool
	copier, maxBatches, flags uint32
	device                    int32
}

// seamOpen calls pxn_open with a; it returns the call's code, the engine
// handle and, for a failure, pxn_last_error's message.
func seamOpen(a seamOpenArgs) (code int, h uint64, msg string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	o := (*C.pxn_options)(C.calloc(1, C.sizeof_pxn_options))
	defer C.free(unsafe.Pointer(o))
	t := (*C.pxn_transport)(C.calloc(1, C.sizeof_pxn_transport))
	defer C.free(unsafe.Pointer(t))
	o.struct_size, o.version = C.uint32_t(a.size), C.uint32_t(a.version)
	o.copier, o.max_batches, o.flags, o.cuda_device = C.uint32_t(a.copier), C.uint32_t(a.maxBatches), C.uint32_t(a.flags), C.int32_t(a.device)
	if a.hca != nil {
		s := (*C.char)(C.calloc(C.size_t(len(a.hca)+1), 1))
		defer C.free(unsafe.Pointer(s))
		if len(a.hca) > 0 {
			C.memcpy(unsafe.Pointer(s), unsafe.Pointer(&a.hca[0]), C.size_t(len(a.hca)))
		}
		o.local_hca = s
	}
	if a.transport {
		o.transport = t
	}
	t.struct_size = C.uint32_t(a.transportSize)
	C.seam_fill(o, t, cBool(a.submit), cBool(a.poll), cBool(a.piece), cBool(a.register), cBool(a.deregister))
	var out C.pxn_engine_t
	code = int(pxn_open(o, &out))
	if code != int(codeOK) {
		msg = seamLastError()
	}
	return code, uint64(out), msg
}

// seamClose calls pxn_close.
func seamClose(h uint64) int { return int(pxn_close(C.pxn_engine_t(h), 10000)) }

func seamLastError() string {
	var buf [C.PXN_ERROR_MAX]C.char
	n := C.pxn_last_error(&buf[0], C.size_t(len(buf)))
	return C.GoStringN(&buf[0], C.int(min(int(n), len(buf)-1)))
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Sizes and versions of the ABI, for the tests.
const (
	seamOptionsSize   = C.sizeof_pxn_options
	seamTransportSize = C.sizeof_pxn_transport
	seamOptionsV2     = C.PXN_OPTIONS_VERSION
	seamOpenCUDA      = C.PXN_OPEN_CUDA_DEVICE
)
