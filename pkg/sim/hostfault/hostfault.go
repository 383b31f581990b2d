// SPDX-License-Identifier: Apache-2.0

// Package hostfault is a stand-in for tests and benchmarks: the
// cpucopy.ReadyHolder and cpucopy.CopyFaults that hold a host copier's
// source-ready events until a test releases them and fail the copies a
// test chooses. Nothing shipped links it.
package hostfault

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// Holder holds every source-ready event recorded while it is holding (from
// NewHolder on, until SetHolding(false)) until ReleaseReady or
// ReleaseAllReady completes it.
type Holder struct {
	off atomic.Bool

	mu      sync.Mutex
	release func(relay.Event) error
	held    map[relay.Event]struct{}
}

// NewHolder returns a Holder that holds every event.
func NewHolder() *Holder {
	return &Holder{held: make(map[relay.Event]struct{})}
}

// Attach takes the copier's release function.
func (h *Holder) Attach(release func(relay.Event) error) {
	h.mu.Lock()
	h.release = release
	h.mu.Unlock()
}

// Hold records ev as held while the Holder is holding.
func (h *Holder) Hold(ev relay.Event) bool {
	if h.off.Load() {
		return false
	}
	h.mu.Lock()
	h.held[ev] = struct{}{}
	h.mu.Unlock()
	return true
}

// SetHolding turns holding on or off for the events recorded next.
func (h *Holder) SetHolding(on bool) { h.off.Store(!on) }

// ReleaseReady completes ev. An event that is not held is the copier's
// error (wrapping cpucopy.ErrUnknownEvent).
func (h *Holder) ReleaseReady(ev relay.Event) error {
	h.mu.Lock()
	release := h.release
	delete(h.held, ev)
	h.mu.Unlock()
	if release == nil {
		return errors.New("hostfault: holder attached to no copier")
	}
	return release(ev)
}

// ReleaseAllReady completes every held event and returns how many there
// were.
func (h *Holder) ReleaseAllReady() int {
	evs := h.take()
	for _, ev := range evs {
		// Each was held and is released once: the copier knows it.
		_ = h.releaseOne(ev)
	}
	return len(evs)
}

// HeldReady returns the held events in the order they were recorded.
func (h *Holder) HeldReady() []relay.Event {
	h.mu.Lock()
	out := make([]relay.Event, 0, len(h.held))
	for ev := range h.held {
		out = append(out, ev)
	}
	h.mu.Unlock()
	slices.Sort(out)
	return out
}

func (h *Holder) take() []relay.Event {
	h.mu.Lock()
	evs := make([]relay.Event, 0, len(h.held))
	for ev := range h.held {
		evs = append(evs, ev)
	}
	clear(h.held)
	h.mu.Unlock()
	slices.Sort(evs)
	return evs
}

func (h *Holder) releaseOne(ev relay.Event) error {
	h.mu.Lock()
	release := h.release
	h.mu.Unlock()
	if release == nil {
		return errors.New("hostfault: holder attached to no copier")
	}
	return release(ev)
}

// Faults fails the next copy of a lane with the error a test chose.
type Faults struct {
	mu   sync.Mutex
	next [staging.LaneCount]error
}

// FailNextCopy makes the next Copy on lane return err without enqueueing
// anything.
func (f *Faults) FailNextCopy(lane int, err error) error {
	if lane < 0 || lane >= staging.LaneCount {
		return fmt.Errorf("hostfault: lane %d out of range [0, %d)", lane, staging.LaneCount)
	}
	if err == nil {
		return errors.New("hostfault: FailNextCopy needs a non-nil error")
	}
	f.mu.Lock()
	f.next[lane] = err
	f.mu.Unlock()
	return nil
}

// CopyFault returns, once, the error set for lane.
func (f *Faults) CopyFault(lane int) error {
	if lane < 0 || lane >= staging.LaneCount {
		return nil
	}
	f.mu.Lock()
	err := f.next[lane]
	f.next[lane] = nil
	f.mu.Unlock()
	return err
}
