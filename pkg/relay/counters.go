// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"sync/atomic"

	"github.com/pxn-project/pxn/pkg/staging"
)

// Counters are the engine's running totals, ready for metrics.
type Counters struct {
	relayedBytes  atomic.Uint64
	relayedPieces atomic.Uint64
	joinedPieces  atomic.Uint64
	// fallbackBytes and fallbackPieces count by reason
	// (staging.FallbackCreditTimeout and the rest).
	fallbackBytes  [staging.FallbackReasons]atomic.Uint64
	fallbackPieces [staging.FallbackReasons]atomic.Uint64
	directBytes    atomic.Uint64
	creditWaits    atomic.Uint64
	secondHopFails atomic.Uint64
	forwardedBytes atomic.Uint64
	forwardedPiece atomic.Uint64
	invalidDescs   atomic.Uint64
	failedPieces   atomic.Uint64
	laneQuarantine atomic.Uint64
	routeResolves  atomic.Uint64
	routeDrops     atomic.Uint64
	pumpSleeps     atomic.Uint64
	pumpWakes      atomic.Uint64
	wakeCalls      atomic.Uint64
	relayWakeCalls atomic.Uint64
	contended      atomic.Uint64
	outOfTurn      atomic.Uint64
	arenaByFD      atomic.Uint64
	arenaByHandle  atomic.Uint64
	configRefused  atomic.Uint64
}

// CounterSnapshot is a copy of the counters at one moment.
type CounterSnapshot struct {
	// RelayedBytes and RelayedPieces were staged in a relay and completed
	// by it (sender side).
	RelayedBytes  uint64 `json:"relayed_bytes"`
	RelayedPieces uint64 `json:"relayed_pieces"`
	// JoinedPieces were published in a slot behind another Piece, sharing
	// its Desc, first-hop copy, doorbell and second hop (sender side): the
	// relay counts such a slot as one forwarded Piece.
	JoinedPieces uint64 `json:"joined_pieces"`
	// FallbackBytes and FallbackPieces were meant for a relay but went
	// direct before their doorbell; the ByReason counts split them by
	// cause.
	FallbackBytes          uint64                 `json:"fallback_bytes"`
	FallbackPieces         uint64                 `json:"fallback_pieces"`
	FallbackBytesByReason  staging.FallbackCounts `json:"fallback_bytes_by_reason"`
	FallbackPiecesByReason staging.FallbackCounts `json:"fallback_pieces_by_reason"`
	// DirectBytes went direct at classification.
	DirectBytes uint64 `json:"direct_bytes"`
	// CreditWaits counts pump rounds in which a lane had work but no credit.
	CreditWaits uint64 `json:"credit_waits"`
	// SecondHopFailures counts relayed Pieces whose second hop failed.
	SecondHopFailures uint64 `json:"second_hop_failures"`
	// ForwardedBytes and ForwardedPieces were forwarded by this rank as a
	// relay.
	ForwardedBytes  uint64 `json:"forwarded_bytes"`
	ForwardedPieces uint64 `json:"forwarded_pieces"`
	InvalidDescs    uint64 `json:"invalid_descs"`
	// FailedPieces were published and then failed (relay failure, second
	// hop, invalid Desc).
	FailedPieces    uint64 `json:"failed_pieces"`
	LaneQuarantines uint64 `json:"lane_quarantines"`
	// RouteResolves counts the relay's route-cache misses: target sessions
	// it resolved through the directory. RouteDrops counts routes dropped
	// after a second-hop failure, a destination outside the cached ranges,
	// or InvalidateTarget.
	RouteResolves uint64 `json:"route_resolves"`
	RouteDrops    uint64 `json:"route_drops"`
	// PumpSleeps counts the pump's sleeps on its wake word; PumpWakes
	// those a waker ended (the others ran to their timeout).
	PumpSleeps uint64 `json:"pump_sleeps"`
	PumpWakes  uint64 `json:"pump_wakes"`
	// WakeCalls counts the system calls (a futex wake or an eventfd
	// write) this process's callers made to wake its pump: a wake costs
	// one only while the pump has announced its sleep and no other waker
	// has ended it yet. RelayWakeCalls counts the eventfd writes of this
	// rank's sender to wake its relays' pumps, the same way.
	WakeCalls      uint64 `json:"wake_calls"`
	RelayWakeCalls uint64 `json:"relay_wake_calls"`
	// InboundContended counts the Pieces this relay took from a lane while
	// another inbound lane also had a ticket ready. InboundOutOfTurn counts
	// those taken from a lane that had already been served since another
	// lane's ticket became ready, while that ticket still waited: with
	// inbound lanes served in turn it stays 0.
	InboundContended uint64 `json:"inbound_contended"`
	InboundOutOfTurn uint64 `json:"inbound_out_of_turn"`
	// ArenasByFD and ArenasByHandle count the lanes attached on
	// relays, by how the relay's arena was mapped: a descriptor from its
	// arena socket, or the handle in its header.
	ArenasByFD     uint64 `json:"arenas_by_fd"`
	ArenasByHandle uint64 `json:"arenas_by_handle"`
	// ConfigRefused counts the MC_PXN_* values the host refused when it
	// opened the engine (Deps.ConfigRefused); any is why PXN is off.
	ConfigRefused uint64 `json:"config_refused"`
}

// fallback counts one Piece of n bytes that went direct for reason.
func (c *Counters) fallback(reason fallbackReason, n uint64) {
	c.fallbackBytes[reason].Add(n)
	c.fallbackPieces[reason].Add(1)
}

func (c *Counters) snapshot() CounterSnapshot {
	s := CounterSnapshot{
		ConfigRefused:     c.configRefused.Load(),
		RelayedBytes:      c.relayedBytes.Load(),
		RelayedPieces:     c.relayedPieces.Load(),
		JoinedPieces:      c.joinedPieces.Load(),
		DirectBytes:       c.directBytes.Load(),
		CreditWaits:       c.creditWaits.Load(),
		SecondHopFailures: c.secondHopFails.Load(),
		ForwardedBytes:    c.forwardedBytes.Load(),
		ForwardedPieces:   c.forwardedPiece.Load(),
		InvalidDescs:      c.invalidDescs.Load(),
		FailedPieces:      c.failedPieces.Load(),
		LaneQuarantines:   c.laneQuarantine.Load(),
		RouteResolves:     c.routeResolves.Load(),
		RouteDrops:        c.routeDrops.Load(),
		PumpSleeps:        c.pumpSleeps.Load(),
		PumpWakes:         c.pumpWakes.Load(),
		WakeCalls:         c.wakeCalls.Load(),
		RelayWakeCalls:    c.relayWakeCalls.Load(),
		InboundContended:  c.contended.Load(),
		InboundOutOfTurn:  c.outOfTurn.Load(),
		ArenasByFD:        c.arenaByFD.Load(),
		ArenasByHandle:    c.arenaByHandle.Load(),
	}
	for r := range c.fallbackBytes {
		s.FallbackBytesByReason[r] = c.fallbackBytes[r].Load()
		s.FallbackPiecesByReason[r] = c.fallbackPieces[r].Load()
	}
	s.FallbackBytes = s.FallbackBytesByReason.Total()
	s.FallbackPieces = s.FallbackPiecesByReason.Total()
	return s
}

// fill copies the counters into st, the block the pump publishes for
// readers outside the process.
func (c *Counters) fill(st *staging.RankStats) {
	st.RelayedBytes = c.relayedBytes.Load()
	st.RelayedPieces = c.relayedPieces.Load()
	st.ForwardedBytes = c.forwardedBytes.Load()
	st.ForwardedPieces = c.forwardedPiece.Load()
	st.DirectBytes = c.directBytes.Load()
	st.FailedPieces = c.failedPieces.Load()
	st.SecondHopFailures = c.secondHopFails.Load()
	st.InvalidDescs = c.invalidDescs.Load()
	st.CreditWaits = c.creditWaits.Load()
	st.LaneQuarantines = c.laneQuarantine.Load()
	for r := range c.fallbackBytes {
		st.FallbackBytes[r] = c.fallbackBytes[r].Load()
		st.FallbackPieces[r] = c.fallbackPieces[r].Load()
	}
}
