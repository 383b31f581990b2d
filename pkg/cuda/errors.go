// SPDX-License-Identifier: Apache-2.0

package cuda

/*
#include "shim.h"
*/
import "C"

import "fmt"

// Result is a CUresult.
type Result int

// The results this module tests for.
const (
	Success                     Result = 0
	ErrorInvalidValue           Result = 1
	ErrorOutOfMemory            Result = 2
	ErrorNotInitialized         Result = 3
	ErrorNoDevice               Result = 100
	ErrorInvalidDevice          Result = 101
	ErrorInvalidContext         Result = 201
	ErrorInvalidHandle          Result = 400
	ErrorNotFound               Result = 500
	ErrorNotReady               Result = 600
	ErrorPeerAccessAlreadyOn    Result = 704
	ErrorHostMemoryRegistered   Result = 712
	ErrorHostMemoryUnregistered Result = 713
	ErrorNotSupported           Result = 801
	// NotAvailable is this package's own result for an entry point the
	// driver did not provide.
	NotAvailable Result = C.PXN_CU_NOT_AVAILABLE
)

// Error makes a Result usable with errors.Is: errors.Is(err,
// cuda.ErrorNotReady).
func (r Result) Error() string { return fmt.Sprintf("CUresult %d", int(r)) }

// Error is a failed driver call.
type Error struct {
	// Call names the entry point and its arguments.
	Call string
	Code Result
	// Name and Desc come from cuGetErrorName and cuGetErrorString where
	// the driver knows the code.
	Name string
	Desc string
}

func (e *Error) Error() string {
	if e.Code == NotAvailable {
		return fmt.Sprintf("cuda: %s: %v", e.Call, ErrNotAvailable)
	}
	if e.Name != "" {
		return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Call, e.Name, int(e.Code), e.Desc)
	}
	return fmt.Sprintf("cuda: %s: CUresult %d", e.Call, int(e.Code))
}

// Unwrap returns ErrNotAvailable for a missing entry point and the Result
// otherwise.
func (e *Error) Unwrap() error {
	if e.Code == NotAvailable {
		return ErrNotAvailable
	}
	return e.Code
}

// ErrorName returns cuGetErrorName's name for r, or "" when unknown.
func (d *Driver) ErrorName(r Result) string {
	var s *C.char
	if C.pxn_cuGetErrorName(d.t, C.CUresult(r), &s) != 0 || s == nil {
		return ""
	}
	return C.GoString(s)
}

// ErrorString returns cuGetErrorString's description of r, or "".
func (d *Driver) ErrorString(r Result) string {
	var s *C.char
	if C.pxn_cuGetErrorString(d.t, C.CUresult(r), &s) != 0 || s == nil {
		return ""
	}
	return C.GoString(s)
}

// errorf builds the error of a failed call; call and args name it.
func (d *Driver) errorf(r Result, call string, args ...any) error {
	if len(args) > 0 {
		call = fmt.Sprintf(call, args...)
	}
	// Call is a format only when args are given: a step name passed alone
	// may hold a literal '%'.
	e := &Error{Call: call, Code: r}
	if r != NotAvailable {
		e.Name = d.ErrorName(r)
		e.Desc = d.ErrorString(r)
	}
	return e
}

// check returns nil for success and the call's error otherwise. The format
// is only expanded on failure.
func (d *Driver) check(r C.CUresult, call string, args ...any) error {
	if r == 0 {
		return nil
	}
	return d.errorf(Result(r), call, args...)
}
