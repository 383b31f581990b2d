// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"errors"
	"fmt"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
)

// sender is the outbound pipeline: lanes on the group's relays, publishing
// queued Pieces into them, reaping completions, and sending direct what
// cannot go through a relay. The pump holds it; nothing else touches it.
type sender struct {
	s   *shared
	reg Registry

	lanes []*senderLane
	// attachPending is set when the last listing left an attach to a
	// relay undone because the registry was busy (its lock held, or the
	// relay's arena descriptor not yet served): the pump lists again at
	// its next heartbeat interval rather than at its next idle beat.
	attachPending bool
	// zombies are retired lanes that may still have copies or doorbells
	// in flight into the relay's memory: their mapping and host
	// registration are released only after the copier has drained.
	zombies []*senderLane
	// planBuf and copyBuf hold the plan entries and the first-hop copies
	// of the Piece being published.
	planBuf  []staging.PlanEntry
	copyBuf  []CopyEntry
	peersOff bool
	// noSend is set when the pump cannot use the copier: no lanes.
	noSend bool
	// recheck asks the next round to check the lanes' relays.
	recheck bool
}

// busy reports whether a lane has Pieces published or queued.
func (sn *sender) busy() bool {
	for _, sl := range sn.lanes {
		if sl.tx.InFlight() || sl.queued() {
			return true
		}
	}
	return false
}

// inflightBytes sums the bytes of the Pieces published and not yet reaped,
// on every lane, until the sum passes limit.
func (sn *sender) inflightBytes(limit uint64) uint64 {
	var n uint64
	for _, sl := range sn.lanes {
		for seq := sl.tx.Reaped() + 1; seq <= sl.tx.Published() && n <= limit; seq++ {
			if pr := sl.inflight[staging.SlotOf(seq)]; pr.g != nil {
				n += pr.g.pieceLen(pr.i)
			}
		}
	}
	return n
}

// errRelayGone fails Pieces published to a relay that died or restarted.
var errRelayGone = errors.New("relay gone before completing the piece")

// ticketTimeout bounds how long the oldest published ticket of a lane may
// go without a completion. A relay that runs but never completes it (a hung
// second hop, a lost doorbell or completion) would otherwise hold the
// tickets forever; past it they fail and the lane is not used again.
const ticketTimeout = 30 * time.Second

// errTicketTimeout fails the published Pieces of a lane whose relay made no
// progress for ticketTimeout.
var errTicketTimeout = fmt.Errorf("relay made no progress on the piece: %w", ErrTimedOut)

func (sn *sender) ticketTimeout() time.Duration {
	if st := sn.s.steer; st != nil && st.ticketLimit() > 0 {
		return st.ticketLimit()
	}
	return ticketTimeout
}

func (sn *sender) publishAll(now time.Time) bool {
	progressed := false
	for _, sl := range sn.lanes {
		if sn.publish(sl, now) {
			progressed = true
		}
	}
	return progressed
}

func (sn *sender) reapAll(now time.Time) bool {
	progressed := false
	for _, sl := range sn.lanes {
		if sn.reap(sl, now) {
			progressed = true
		}
	}
	return progressed
}

// publish stages one Piece into the relay's ring if the lane has credit.
// It returns true when it made progress.
func (sn *sender) publish(sl *senderLane, now time.Time) bool {
	s := sn.s
	if sl.broken || sl.gone.Load() {
		return false
	}
	pr := sl.front()
	if pr.g == nil {
		return false
	}
	if sl.stale.Load() {
		// A Piece without a ticket does not wait for a relay that may
		// never beat again: it goes direct.
		sl.pop()
		s.fallback(pr.g, pr.i, staging.FallbackRelayStale)
		return true
	}
	if s.exhausted(sl) {
		// The sequence space is exhausted: no new tickets on this lane;
		// the sender retires it once drained.
		return false
	}
	seq, ok := sl.tx.Ticket()
	if !ok {
		// No credit. The credit timeout measures a stalled relay, not a
		// busy one: it runs from the later of the moment the lane's head
		// first found no credit (not from enqueue: a long request queues
		// many Pieces that are not late) and the lane's last completion.
		// Once it has run out, every Piece queued behind goes direct too,
		// until the relay completes one again.
		if sl.waitSince.IsZero() {
			sl.waitSince = now
			s.counters.creditWaits.Add(1)
		} else if now.Sub(laterOf(sl.waitSince, sl.progressAt)) > s.cfg.CreditTimeout {
			sl.pop()
			s.fallback(pr.g, pr.i, staging.FallbackCreditTimeout)
			return true
		}
		return false
	}
	sl.waitSince = time.Time{}
	sl.pop()
	if !sl.tx.InFlight() {
		sl.progressAt = now
	}
	g, i := pr.g, pr.i
	slot := staging.SlotOf(seq)
	base := sl.link.Staging() + uintptr(slot)*staging.SlotSize
	plans, entries := sn.planBuf[:0], sn.copyBuf[:0]
	it := g.plan.PieceSlices(g.blocks, i)
	for c, ok := it.Next(); ok; c, ok = it.Next() {
		plans = append(plans, staging.PlanEntry{Dst: c.Dst, Len: c.Len})
		entries = append(entries, CopyEntry{Src: uintptr(c.Src), Dst: base + uintptr(c.Offset), Len: c.Len})
	}
	sn.planBuf, sn.copyBuf = plans, entries
	if err := sl.tx.Commit(seq, g.key.session, plans, g.pieceLen(i)); err != nil {
		s.fallback(g, i, staging.FallbackOther)
		return true
	}
	copyAt := s.sentTimes.now()
	if err := s.copier.Copy(sl.copierLane, g.ready, entries, sl.tx.ReadyWord(seq), seq); err != nil {
		// Before the doorbell: the Piece is still ours to send direct,
		// and the lane is quarantined.
		s.log.Error(err, "first-hop copy failed; lane quarantined", "relayPid", sl.peer.Pid, "lane", sl.link.LaneIndex(), "copierLane", sl.copierLane)
		s.counters.laneQuarantine.Add(1)
		sl.broken = true
		s.fallback(g, i, staging.FallbackLaneBroken)
		sl.drainTo(&s.fallbacks, staging.FallbackLaneBroken)
		return true
	}
	if err := sl.tx.Publish(seq); err != nil {
		// Unreachable while Ticket and Publish agree; should it happen,
		// the Piece fails rather than being sent twice, and the lane
		// takes no more tickets.
		s.log.Error(err, "publishing a ticket; lane quarantined", "relayPid", sl.peer.Pid, "lane", sl.link.LaneIndex())
		sl.broken = true
		s.counters.failedPieces.Add(1)
		g.finishPiece(i, err)
		s.pieceDone(g)
		sl.drainTo(&s.fallbacks, staging.FallbackLaneBroken)
		return true
	}
	pr.times = s.sentTimes.add(PieceTimes{Lane: sl.link.LaneIndex(), Seq: seq, Bytes: g.pieceLen(i), Submit: g.submitted, Copy: copyAt})
	sl.inflight[slot] = pr
	sl.relayWake.Wake()
	return true
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// reap takes the relay's completions in seq order. A Piece's slices are
// finished before the pump publishes again, so its slot is reused only
// afterwards.
func (sn *sender) reap(sl *senderLane, now time.Time) bool {
	progressed := false
	for {
		seq, status, ok := sl.tx.Reap()
		if !ok {
			break
		}
		slot := staging.SlotOf(seq)
		pr := sl.inflight[slot]
		sl.inflight[slot] = pieceRef{}
		sn.s.sentTimes.set(pr.times, stepReaped)
		sn.finishPublished(pr, status)
		progressed = true
	}
	if progressed {
		sl.progressAt = now
	}
	return progressed
}

func (sn *sender) finishPublished(pr pieceRef, status int32) {
	s := sn.s
	var err error
	if status != staging.CompletionOK {
		// A closing relay waits for its lanes: check them in the next
		// round rather than at the next heartbeat.
		sn.recheck = sn.recheck || status == staging.CompletionRelayClosing
		err = fmt.Errorf("relay completion status %d (%s)", status, completionReason(status))
		if status == staging.CompletionTimeout {
			err = fmt.Errorf("%w: %w", err, ErrTimedOut)
		}
		s.counters.failedPieces.Add(1)
		if status == staging.CompletionSecondHop || status == staging.CompletionTimeout {
			s.counters.secondHopFails.Add(1)
		}
	} else {
		s.counters.relayedBytes.Add(pr.g.pieceLen(pr.i))
		s.counters.relayedPieces.Add(1)
	}
	pr.g.finishPiece(pr.i, err)
	s.pieceDone(pr.g)
}

// failPublished fails, exactly once, every Piece published on a lane whose
// relay is gone.
func (sn *sender) failPublished(sl *senderLane, err error) {
	s := sn.s
	for {
		seq, ok := sl.tx.Abandon()
		if !ok {
			return
		}
		slot := staging.SlotOf(seq)
		pr := sl.inflight[slot]
		sl.inflight[slot] = pieceRef{}
		s.counters.failedPieces.Add(1)
		pr.g.finishPiece(pr.i, err)
		s.pieceDone(pr.g)
	}
}

func completionReason(status int32) string {
	switch status {
	case staging.CompletionInvalidDesc:
		return "invalid descriptor"
	case staging.CompletionSecondHop:
		return "second hop failed"
	case staging.CompletionTimeout:
		return "second hop timed out"
	case staging.CompletionUnresolved:
		return "target not resolvable on the relay's rail"
	case staging.CompletionRelayClosing:
		return "relay closing"
	}
	return "unknown"
}

// stop retires every lane, failing what they published with err, and
// returns the lanes whose release must wait for the copier to drain.
func (sn *sender) stop(err error) []*senderLane {
	for _, sl := range sn.lanes {
		sn.retire(sl, err, staging.FallbackNoLane)
	}
	sn.lanes = nil
	z := sn.zombies
	sn.zombies = nil
	return z
}
