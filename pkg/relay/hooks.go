// SPDX-License-Identifier: Apache-2.0

package relay

import "time"

// hooks change what production keeps fixed. Only the package's tests supply
// them (fault_export_test.go), before the pump starts; a production engine
// has none, so each use costs one nil check.
type hooks struct {
	// laneEnd, when non-zero, is the last seq the sender takes in every
	// epoch of its lanes, in place of staging.MaxLaneSeq: a test runs a
	// lane to the end of its epoch and through the new claim that follows.
	// The relay needs none: it follows whatever epoch its lane holds.
	laneEnd uint64
	// ticketLimit, when non-zero, replaces ticketTimeout.
	ticketLimit time.Duration
	// partsLimit, when non-zero, replaces partsWaitLimit.
	partsLimit time.Duration
	// manual leaves the pump's goroutine unstarted: the test runs its
	// rounds on its own goroutine, and Close fails what is left at once.
	manual bool
	// separate publishes every Piece in a slot of its own (sender.join
	// joins none): tests that count seqs or fill a ring Piece by Piece.
	separate bool
	// goStarted, when set, is called for each goroutine the engine
	// starts, before it starts: tests count what the engine started, not
	// what the process runs.
	goStarted func()
}

// joining reports whether the sender joins queued Pieces into one slot.
func (s *shared) joining() bool { return s.hooks == nil || !s.hooks.separate }

// exhausted reports whether sl has used the last seq of its epoch.
func (s *shared) exhausted(sl *senderLane) bool {
	if h := s.hooks; h != nil && h.laneEnd != 0 && sl.tx.Next() > h.laneEnd {
		return true
	}
	return sl.tx.Exhausted()
}

// partsWait is how long a Piece taken on its first part waits for the rest.
func (s *shared) partsWait() time.Duration {
	if h := s.hooks; h != nil && h.partsLimit != 0 {
		return h.partsLimit
	}
	return partsWaitLimit
}

func (s *shared) manualPump() bool { return s.hooks != nil && s.hooks.manual }
