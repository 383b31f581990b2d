// SPDX-License-Identifier: Apache-2.0

package cuda

// What only the package's own tests call. It needs cgo, which go test does
// not run on _test.go files, so it lives here, unexported
// (docs/testing.md).

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import "unsafe"

// eventSynchronize is cuEventSynchronize.
func (d *Driver) eventSynchronize(e Event) error {
	return d.check(C.pxn_cuEventSynchronize(d.t, C.pxn_handle(e)), "cuEventSynchronize(%#x)", uintptr(e))
}

// withoutEntryPoint returns a driver whose table lacks name's entries, as an
// old driver's would (for tests of the "not available" path). It shares
// nothing mutable with d.
func (d *Driver) withoutEntryPoint(name string) *Driver {
	t := (*C.pxn_cu_table)(C.calloc(1, C.size_t(unsafe.Sizeof(C.pxn_cu_table{}))))
	if t == nil {
		return nil
	}
	*t = *d.t
	for i := 0; i < int(C.PXN_CU_NSYM); i++ {
		if C.GoString(C.pxn_cu_symbol_name(C.int(i))) == name {
			t.fn[i] = nil
		}
	}
	return &Driver{t: t, version: d.version, procV2: d.procV2}
}
