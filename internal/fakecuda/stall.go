// SPDX-License-Identifier: Apache-2.0

package fakecuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

static int fakecuda_stall(const char *lib, uintptr_t s, int on)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL)
		return -1;
	int (*stall)(void *, int) = (int (*)(void *, int))dlsym(h, "pxn_fakecuda_stall");
	int r = stall == NULL ? -2 : stall((void *)s, on);
	dlclose(h);
	return r;
}
*/
import "C"

import (
	"testing"
	"unsafe"
)

// Stall wedges stream (a cuda.Stream of the fake driver lib, loaded
// already) as a kernel that never ends would: nothing enqueued on it from
// now on runs or completes, and neither does a stream that waits for an
// event recorded on it. release lets the stall go, so that code blocked on
// it returns; a test calls it only once that code can no longer touch
// what the test frees after it (a test whose code under test hung leaves
// the stall, and the hung goroutine, in place).
func Stall(t testing.TB, lib string, stream uintptr) (release func()) {
	t.Helper()
	if r := stall(lib, stream, true); r != 0 {
		t.Fatalf("stalling stream %#x of %s: result %d", stream, lib, r)
	}
	return func() { stall(lib, stream, false) }
}

func stall(lib string, stream uintptr, on bool) int {
	p := C.CString(lib)
	defer C.free(unsafe.Pointer(p))
	o := C.int(0)
	if on {
		o = 1
	}
	return int(C.fakecuda_stall(p, C.uintptr_t(stream), o))
}
