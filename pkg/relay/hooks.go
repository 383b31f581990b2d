// SPDX-License-Identifier: Apache-2.0

package relay

import "time"

// testHooks steer what production never changes; they are set only by the
// package's tests, before the pump starts. The zero value is production.
type testHooks struct {
	// firstSeq, when above 1, is where the first epoch of a lane starts
	// instead of seq 1: on the sender, for the first lane this engine
	// attaches; on the relay, for the first epoch seen on each inbound
	// lane. It lets a test reach MaxLaneSeq.
	firstSeq uint64
	// ticketTimeout, when non-zero, replaces ticketTimeout.
	ticketTimeout time.Duration
	// manualPump leaves the pump's goroutine unstarted: the test runs its
	// rounds on its own goroutine, and Close fails what is left at once.
	manualPump bool
}
