// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	futexWait = 0
	futexWake = 1
)

// Announce is the waiter's first step: from here on wakers make the system
// call. It returns the Seq to pass to Sleep after the last check for work.
func (w *WakeWord) Announce() uint32 {
	atomic.StoreUint32(&w.Sleeping, 1)
	return atomic.LoadUint32(&w.Seq)
}

// Retract ends an Announce that found work and does not sleep.
func (w *WakeWord) Retract() { atomic.StoreUint32(&w.Sleeping, 0) }

// Sleep waits until Seq differs from seen, a Wake, or timeout (≤ 0: no
// timeout), then clears Sleeping. It reports whether Seq moved, that is
// whether a waker came rather than the timeout or a spurious return. Call
// it from a locked OS thread: it blocks that thread in the kernel.
func (w *WakeWord) Sleep(seen uint32, timeout time.Duration) (woken bool) {
	var ts *unix.Timespec
	var t unix.Timespec
	if timeout > 0 {
		t = unix.NsecToTimespec(timeout.Nanoseconds())
		ts = &t
	}
	futex(&w.Seq, futexWait, seen, ts)
	atomic.StoreUint32(&w.Sleeping, 0)
	return atomic.LoadUint32(&w.Seq) != seen
}

// Wake tells the waiter there is work; call it after the work is visible.
// It reports whether it made the system call (the waiter had announced).
func (w *WakeWord) Wake() bool {
	atomic.AddUint32(&w.Seq, 1)
	if atomic.LoadUint32(&w.Sleeping) == 0 {
		return false
	}
	futex(&w.Seq, futexWake, 1, nil)
	return true
}

// futex makes one futex call and retries it on EINTR only for a wake; a
// wait that returns early is the caller's to judge by Seq.
func futex(addr *uint32, op int, val uint32, ts *unix.Timespec) {
	for {
		_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(op), uintptr(val),
			uintptr(unsafe.Pointer(ts)), 0, 0)
		if e == 0 || op == futexWait || !errors.Is(e, unix.EINTR) {
			return
		}
	}
}

// SetTimerSlack sets the calling thread's timer slack, which the kernel
// adds to every timed sleep of that thread (50 µs by default). Call it on a
// locked OS thread that the goroutine never unlocks.
func SetTimerSlack(d time.Duration) error {
	return unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(max(d.Nanoseconds(), 1)), 0, 0, 0)
}
