// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A WakeWord has one waiter, a pump, and any number of wakers in the
// waiter's process: its callers (Submit and everything else that queues
// work for the pump). Seq is the futex word; Sleeping says the waiter may
// be in, or on its way into, FUTEX_WAIT. It is process-local memory, no
// part of the shared ABI: senders of other ranks wake a relay through its
// lanes' eventfds (EventWaiter, LaneWaker).
//
// Ordering rule (Go's atomics are sequentially consistent):
//
//   - the waiter stores Sleeping=1 (Announce), loads Seq, checks every
//     source of work once more, then waits while Seq still holds the value
//     it loaded (Sleep), and clears Sleeping when it is up again;
//   - a waker first makes its work visible (any store the waiter's check
//     reads), then adds 1 to Seq, then loads Sleeping and issues FUTEX_WAKE
//     only when it is set (Wake).
//
// Either the waker's load sees Sleeping=1, and its FUTEX_WAKE, or the Seq
// that no longer matches, ends the sleep; or that load came first, so the
// waiter's load of Seq reads the waker's add and its check sees the work.
// A waker pays a system call only while the waiter sleeps.
type WakeWord struct {
	Seq      uint32
	Sleeping uint32
	_        [56]byte
}

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

// EventWaiter is a relay pump's sleep over eventfds: one of its own, which
// its process's callers write (Wake), and one per claimed inbound lane,
// which the lane's holder writes (LaneWaker). It has the methods of
// WakeWord, with the same rule: the waiter stores its sleeping flags (its
// own, and RelayWake.Sleeping in the relay block of each lane it follows),
// checks every source of work once more, then sleeps in ppoll; a waker
// makes its work visible, then loads the flag and writes the eventfd only
// when it is set. An eventfd's count stays until it is read, so a write
// that comes before the ppoll ends it at once; and so a waker of the
// pump's process takes the pump's own flag as it writes (Wake), and a
// burst of wakes during one sleep costs one system call. Words of a claim the pump
// has not adopted yet start with Sleeping set, and the relay writes its
// own eventfd after each claim, so a new holder's first wake is never
// lost. Announce, Retract and Sleep are the pump's alone.
type EventWaiter struct {
	sleeping atomic.Uint32
	fd       int
	lanes    *[LaneCount]*RelayLane
	pfds     [LaneCount + 1]unix.PollFd
	buf      [8]byte
}

// NewEventWaiter makes the waiter's own eventfd; lanes are the relay's
// inbound endpoints.
func NewEventWaiter(lanes *[LaneCount]*RelayLane) (*EventWaiter, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &EventWaiter{fd: fd, lanes: lanes}, nil
}

// Announced reports whether the waiter's own sleeping flag is set: from
// its Announce until it runs again or a waker of its process takes it.
func (w *EventWaiter) Announced() bool { return w.sleeping.Load() != 0 }

// Close closes the waiter's own eventfd, after its last use.
func (w *EventWaiter) Close() error { return unix.Close(w.fd) }

func (w *EventWaiter) setSleeping(v uint32) {
	w.sleeping.Store(v)
	for _, l := range w.lanes {
		if l != nil && l.cur != nil {
			atomic.StoreUint32(&l.cur.Relay.Wake.Sleeping, v)
		}
	}
}

// Announce stores every sleeping flag; the caller then checks for work
// once more and calls Sleep or Retract. The value is for Sleep's
// signature alone.
func (w *EventWaiter) Announce() uint32 {
	w.setSleeping(1)
	return 0
}

// Retract clears the flags of an Announce that found work.
func (w *EventWaiter) Retract() { w.setSleeping(0) }

// Sleep waits in ppoll until an eventfd is written or timeout (≤ 0: none),
// clears the flags and reads the eventfds that were written; it reports
// whether one was.
func (w *EventWaiter) Sleep(_ uint32, timeout time.Duration) (woken bool) {
	n := 0
	w.pfds[n] = unix.PollFd{Fd: int32(w.fd), Events: unix.POLLIN}
	n++
	for _, l := range w.lanes {
		if l != nil && l.cur != nil && l.cur.WakeFD >= 0 {
			w.pfds[n] = unix.PollFd{Fd: int32(l.cur.WakeFD), Events: unix.POLLIN}
			n++
		}
	}
	var ts *unix.Timespec
	var t unix.Timespec
	if timeout > 0 {
		t = unix.NsecToTimespec(timeout.Nanoseconds())
		ts = &t
	}
	k, _ := unix.Ppoll(w.pfds[:n], ts, nil)
	w.setSleeping(0)
	if k <= 0 {
		return false
	}
	for i := range w.pfds[:n] {
		if w.pfds[i].Revents&unix.POLLIN != 0 {
			unix.Read(int(w.pfds[i].Fd), w.buf[:])
			woken = true
		}
	}
	return woken
}

// Wake tells the pump there is work, from its own process; it reports
// whether it wrote the eventfd. Only the first waker after an Announce
// writes: it clears the pump's own flag as it takes it, so the wakers
// after it, until the pump announces again, make no system call. The
// count it wrote stays in the eventfd until the pump's Sleep reads it, so
// that sleep ends (or does not begin), and the round after it finds their
// work, made visible before they found the flag clear.
func (w *EventWaiter) Wake() bool {
	if !w.sleeping.CompareAndSwap(1, 0) {
		return false
	}
	writeEvent(w.fd)
	return true
}

// WakeAlways writes the waiter's eventfd whatever the flags say: a new
// claim's words wait for the pump to adopt them.
func (w *EventWaiter) WakeAlways() { writeEvent(w.fd) }

// LaneWaker is a holder's wake of its lane's relay: after a Publish, it
// writes the claim's eventfd only while the relay block says the relay's
// pump may sleep.
type LaneWaker struct {
	lane *SenderLane
	fd   int
}

// NewLaneWaker wakes the relay behind lane through eventfd fd, which the
// caller keeps open while the waker is used.
func NewLaneWaker(lane *SenderLane, fd int) *LaneWaker { return &LaneWaker{lane: lane, fd: fd} }

// Wake reports whether it wrote the eventfd.
func (w *LaneWaker) Wake() bool {
	if !w.lane.RelaySleeping() {
		return false
	}
	writeEvent(w.fd)
	return true
}

var eventOne = [8]byte{1}

// writeEvent adds 1 to an eventfd; a full count (EAGAIN) already wakes.
func writeEvent(fd int) {
	for {
		_, err := unix.Write(fd, eventOne[:])
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}
