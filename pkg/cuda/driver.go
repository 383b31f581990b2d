// SPDX-License-Identifier: Apache-2.0

// Package cuda is the CUDA driver API, loaded at run time with
// dlopen("libcuda.so.1"): nothing of CUDA is needed to build or link a
// binary that imports it, and a machine without a driver gets an error from
// Load instead of a link failure.
//
// Every entry point but cuGetProcAddress, cuDriverGetVersion and cuInit is
// resolved through cuGetProcAddress at a pinned CUDA version, so the ABI we
// call is the one we declared even where a newer driver changed the
// function behind the plain name. docs/cuda.md lists each pinned version. An
// entry point the driver lacks is reported as ErrNotAvailable by the call
// that needs it.
//
// Handles (contexts, streams, events, modules, functions) are plain
// integers on the Go side: they are never Go pointers.
package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// LibraryName is the driver library Load opens.
const LibraryName = "libcuda.so.1"

var (
	// ErrNoDriver is returned by Load when the driver library is missing.
	ErrNoDriver = errors.New("cuda: no driver")
	// ErrNotAvailable is returned by a call whose entry point the driver
	// does not provide.
	ErrNotAvailable = errors.New("cuda: not available in this driver")
)

// Device is a CUdevice ordinal handle.
type Device int32

// Context is a CUcontext.
type Context uintptr

// Stream is a CUstream. Zero is the legacy default stream (CU_STREAM_LEGACY).
type Stream uintptr

// StreamPerThread is CU_STREAM_PER_THREAD, the calling thread's default
// stream.
const StreamPerThread Stream = 0x2

// Event is a CUevent.
type Event uintptr

// DevicePtr is a CUdeviceptr.
type DevicePtr uint64

// Module is a CUmodule.
type Module uintptr

// Function is a CUfunction.
type Function uintptr

// IPCMemHandle is a CUipcMemHandle: 64 opaque bytes.
type IPCMemHandle [64]byte

// Driver is a loaded libcuda. Its methods may be called from any goroutine;
// those that need a current context say so. It owns its table of entry
// points, C memory, until Close.
type Driver struct {
	t       *C.pxn_cu_table
	version int
	procV2  bool
}

// Symbol is one driver entry point as Load resolved it.
type Symbol struct {
	Name string
	// Version is the CUDA version whose ABI is asked of cuGetProcAddress.
	Version int
	// MinDriver is the driver version below which the entry is not asked
	// for at all (0: always asked).
	MinDriver int
	Loaded    bool
}

// Load opens libcuda.so.1, initializes the driver and resolves every entry
// point this package calls. Without a driver the error wraps ErrNoDriver and
// says libcuda.so.1 was not found.
func Load() (*Driver, error) { return LoadLibrary(LibraryName) }

// LoadLibrary is Load with another library name or path.
func LoadLibrary(name string) (*Driver, error) {
	t := (*C.pxn_cu_table)(C.calloc(1, C.size_t(unsafe.Sizeof(C.pxn_cu_table{}))))
	if t == nil {
		return nil, errors.New("cuda: out of memory for the driver table")
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var res C.CUresult
	var msg [512]C.char
	step := C.pxn_cu_load(t, cname, &res, &msg[0], C.size_t(len(msg)))
	d := &Driver{t: t, version: int(t.driver_version), procV2: t.proc_v2 != 0}
	if step == 0 {
		return d, nil
	}
	detail := C.GoString(&msg[0])
	var err error
	switch step {
	case -1:
		err = fmt.Errorf("%w: %s was not found (%s)", ErrNoDriver, name, detail)
	case -2:
		err = fmt.Errorf("cuda: %s has neither cuGetProcAddress_v2 nor cuGetProcAddress (driver older than 11.3?): %s", name, detail)
	case -3:
		err = fmt.Errorf("cuda: %s lacks cuDriverGetVersion or cuInit: %s", name, detail)
	case -4:
		err = d.errorf(Result(res), "cuDriverGetVersion")
	default:
		err = d.errorf(Result(res), "cuInit(0)")
	}
	C.free(unsafe.Pointer(t))
	return nil, err
}

// Close frees the driver's table of entry points; libcuda itself stays
// loaded (pxn_cu_unload says why). Everything made through d must be
// released first, and d is not used afterwards.
func (d *Driver) Close() {
	if d.t == nil {
		return
	}
	C.pxn_cu_unload(d.t)
	C.free(unsafe.Pointer(d.t))
	d.t = nil
}

// Version is the driver's CUDA version, 1000×major + 10×minor (13000 for
// 13.0).
func (d *Driver) Version() int { return d.version }

// ProcAddressV2 reports whether entry points came from cuGetProcAddress_v2
// (CUDA 12.0 drivers and later) rather than the 11.3 cuGetProcAddress.
func (d *Driver) ProcAddressV2() bool { return d.procV2 }

// Symbols lists every entry point of the table in a fixed order.
func (d *Driver) Symbols() []Symbol {
	out := make([]Symbol, 0, int(C.PXN_CU_NSYM))
	for i := 0; i < int(C.PXN_CU_NSYM); i++ {
		out = append(out, Symbol{
			Name:      C.GoString(C.pxn_cu_symbol_name(C.int(i))),
			Version:   int(C.pxn_cu_symbol_version(C.int(i))),
			MinDriver: int(C.pxn_cu_symbol_min_driver(C.int(i))),
			Loaded:    d.t.fn[i] != nil,
		})
	}
	return out
}

func (d *Driver) has(i C.int) bool { return d.t.fn[i] != nil }

// HasBatchV13000 reports whether the 8-argument cuMemcpyBatchAsync of CUDA
// 13.0 is loaded.
func (d *Driver) HasBatchV13000() bool { return d.has(C.PXN_cuMemcpyBatchAsync_v13000) }

// HasBatchV12080 reports whether the 9-argument cuMemcpyBatchAsync of CUDA
// 12.8 (with failIdx) is loaded.
func (d *Driver) HasBatchV12080() bool { return d.has(C.PXN_cuMemcpyBatchAsync_v12080) }

// HasStreamWriteValue64 reports whether cuStreamWriteValue64 is loaded.
// Whether it works on a device is another matter: probe it.
func (d *Driver) HasStreamWriteValue64() bool { return d.has(C.PXN_cuStreamWriteValue64) }

// WithContext runs fn on one OS thread with ctx current, and puts back
// whatever context that thread had. Use it for calls that need a current
// context outside a thread bound with CtxSetCurrent.
func (d *Driver) WithContext(ctx Context, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev, err := d.CtxGetCurrent()
	if err != nil {
		return err
	}
	if prev != ctx {
		if err := d.CtxSetCurrent(ctx); err != nil {
			return err
		}
		defer d.CtxSetCurrent(prev)
	}
	return fn()
}
