// SPDX-License-Identifier: Apache-2.0

package relay

import "time"

// steering changes what production keeps fixed; only the package's tests
// supply one (before the pump starts), and production engines have none.
type steering interface {
	// laneStart, when above 1, is where the first epoch of a lane starts
	// instead of seq 1: on the sender, for the first lane this engine
	// attaches; on the relay, for the first epoch seen on each inbound
	// lane. It lets a test reach MaxLaneSeq.
	laneStart() uint64
	// ticketLimit, when non-zero, replaces ticketTimeout.
	ticketLimit() time.Duration
	// manual leaves the pump's goroutine unstarted: the test runs its
	// rounds on its own goroutine, and Close fails what is left at once.
	manual() bool
}

func (s *shared) firstSeq() uint64 {
	if s.steer == nil {
		return 0
	}
	return s.steer.laneStart()
}

func (s *shared) manualPump() bool { return s.steer != nil && s.steer.manual() }
