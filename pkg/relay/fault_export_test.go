// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"time"

	"github.com/pxn-project/pxn/pkg/engineconfig"
)

// FaultHooks are the engine's test hooks as the fault tests set them.
type FaultHooks struct {
	// LastSeq ends every epoch of the sender's lanes there instead of at
	// staging.MaxLaneSeq.
	LastSeq uint64
	// TicketTimeout replaces the published-ticket timeout.
	TicketTimeout time.Duration
	// PartsWait replaces how long a Piece taken on its first part waits
	// for the rest.
	PartsWait time.Duration
	// ManualPump leaves the pump unstarted: the test drives it with
	// RunRound from one goroutine.
	ManualPump bool
	// SeparateSlots publishes every Piece in a slot of its own.
	SeparateSlots bool
	// GoStarted, when set, is called for each goroutine the engine
	// starts, before it starts.
	GoStarted func()
}

// OpenWithFaultHooks is Open with test hooks in place before the pump starts.
func OpenWithFaultHooks(cfg engineconfig.Config, deps Deps, h FaultHooks) (*Engine, error) {
	return open(cfg, deps, &hooks{
		laneEnd:     h.LastSeq,
		ticketLimit: h.TicketTimeout,
		partsLimit:  h.PartsWait,
		manual:      h.ManualPump,
		separate:    h.SeparateSlots,
		goStarted:   h.GoStarted,
	})
}

// RunRound runs one round of a ManualPump engine's pump on the calling
// goroutine and reports whether it made progress.
func (e *Engine) RunRound() bool { return e.pump.round(time.Now()) }

// RunRoundAt is RunRound with the round's clock reading given: the
// decisions a round takes by time (credit and ticket timeouts, heartbeats)
// follow now rather than the wall clock.
func (e *Engine) RunRoundAt(now time.Time) bool { return e.pump.round(now) }

// PumpShallow reports whether the pump would poll through its spin window
// rather than nap now (pump.shallow).
func (e *Engine) PumpShallow() bool { return e.pump.shallow() }

// UnresolvedFor is how long a lane remembers a session whose lookup failed.
const UnresolvedFor = unresolvedFor

// LookupWait is how long a Piece waits for its lane's lookup.
const LookupWait = lookupWait

// LookupSettled reports whether inbound lane i has no lookup running: none
// was handed to its resolver, or its answer is in. Only for a ManualPump
// engine, between rounds.
func (e *Engine) LookupSettled(i int) bool {
	lr := &e.pump.rly.lk[i]
	return !lr.busy || lr.look.done.Load()
}
