// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"

	"github.com/pxn-project/pxn/pkg/relay"
)

// Result codes and task states as include/pxn.h defines them; exports.go
// asserts at compile time that both agree.
const (
	codeOK       int32 = 0
	codeInvalid  int32 = -1
	codeBusy     int32 = -2
	codeNotSup   int32 = -3
	codeClosed   int32 = -4
	codeIO       int32 = -5
	codeTimedOut int32 = -6
	codeInternal int32 = -7
	codeTooMany  int32 = -8
	codeStale    int32 = -9
)

const (
	taskWaiting   int32 = 0
	taskPending   int32 = 1
	taskInvalid   int32 = 2
	taskCanceled  int32 = 3
	taskCompleted int32 = 4
	taskTimeout   int32 = 5
	taskFailed    int32 = 6
)

// codedError is a failure with the result code a C caller sees.
type codedError struct {
	code int32
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

func fail(code int32, format string, args ...any) error {
	return &codedError{code: code, err: fmt.Errorf(format, args...)}
}

// codeOf is the result code of err: its own code when it carries one,
// PXN_ECLOSED for a closed engine, PXN_EIO otherwise.
func codeOf(err error) int32 {
	var ce *codedError
	switch {
	case err == nil:
		return codeOK
	case errors.As(err, &ce):
		return ce.code
	case errors.Is(err, relay.ErrClosed):
		return codeClosed
	}
	return codeIO
}

// guarded runs f and returns its result code and, on failure, the message
// for pxn_last_error. A panic in f becomes PXN_EINTERNAL.
func guarded(f func() error) (code int32, msg string) {
	defer func() {
		if r := recover(); r != nil {
			code, msg = codeInternal, fmt.Sprintf("libpxn internal error: %v", r)
		}
	}()
	if err := f(); err != nil {
		return codeOf(err), err.Error()
	}
	return codeOK, ""
}

// transportError is a failed completion reported by the host's transport.
type transportError struct {
	code int32
	msg  string
}

// Is makes a transport timeout a relay.ErrTimedOut, so that the relay
// reports a timed-out second hop as such to the sender, and a
// relay.ErrWriteHeld: the transport reports it while its NIC may still hold
// the op, and reports the op again once it is final.
func (e *transportError) Is(target error) bool {
	return (target == relay.ErrTimedOut || target == relay.ErrWriteHeld) && e.code == codeTimedOut
}

func (e *transportError) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("host transport: %s", codeName(e.code))
	}
	return fmt.Sprintf("host transport: %s (%s)", e.msg, codeName(e.code))
}

// taskState maps an engine task status onto PXN_TASK_*. An unfinished task
// is what abi.unfinished says. A timeout anywhere on the task's path (the
// host's transport, a relay's second hop, a relay that made no progress) is
// TIMEOUT; a transport completion of PXN_EINVAL is INVALID; every other
// failure FAILED.
func taskState(st relay.TaskStatus, abi hostABI) int32 {
	switch st.State {
	case relay.Pending:
		return abi.unfinished()
	case relay.Completed:
		return taskCompleted
	}
	if errors.Is(st.Err, relay.ErrTimedOut) {
		return taskTimeout
	}
	var te *transportError
	if errors.As(st.Err, &te) && te.code == codeInvalid {
		return taskInvalid
	}
	return taskFailed
}

// codeName names a result code the way pxn_strerror's callers see it.
func codeName(code int32) string {
	switch code {
	case codeOK:
		return "PXN_OK"
	case codeInvalid:
		return "PXN_EINVAL"
	case codeBusy:
		return "PXN_BUSY"
	case codeNotSup:
		return "PXN_ENOTSUP"
	case codeClosed:
		return "PXN_ECLOSED"
	case codeIO:
		return "PXN_EIO"
	case codeTimedOut:
		return "PXN_ETIMEDOUT"
	case codeInternal:
		return "PXN_EINTERNAL"
	case codeTooMany:
		return "PXN_ETOOMANY"
	case codeStale:
		return "PXN_ESTALE"
	}
	return fmt.Sprintf("code %d", code)
}
