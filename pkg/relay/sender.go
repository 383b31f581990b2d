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
	partBuf  []uint32
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
			if sp := &sl.inflight[staging.SlotOf(seq)]; len(sp.refs) > 0 {
				n += sp.bytes()
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
	if h := sn.s.hooks; h != nil && h.ticketLimit > 0 {
		return h.ticketLimit
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
	// room is the tickets the lane could still give after this one, less
	// those the unproven Pieces of its published slots hold (join).
	room := 0
	if ok {
		room = staging.SlotsPerLane - int(seq-sl.tx.Reaped()) - sn.held(sl)
		ok = room >= 0
	}
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
	g := pr.g
	slot := staging.SlotOf(seq)
	base := sl.link.Staging() + uintptr(slot)*staging.SlotSize
	sp := &sl.inflight[slot]
	sp.refs = append(sp.refs[:0], pr)
	sn.planBuf, sn.copyBuf = sn.planBuf[:0], sn.copyBuf[:0]
	n := sn.stage(pr, base, 0)
	n = sn.join(sl, sp, base, n, room)
	parts := sn.cutParts(sl, n)
	if err := sl.tx.Commit(seq, g.key.session, sn.planBuf, n, parts); err != nil {
		sn.fallbackSlot(sp, staging.FallbackOther)
		return true
	}
	copyAt := s.sentTimes.now()
	var err error
	if len(parts) > 0 {
		err = s.partCopier.CopyParts(sl.copierLane, g.ready, sn.copyBuf, parts, sl.tx.ReadyWord(seq), sl.tx.PartWords(seq), seq)
	} else {
		err = s.copier.Copy(sl.copierLane, g.ready, sn.copyBuf, sl.tx.ReadyWord(seq), seq)
	}
	if err != nil {
		// Before the doorbell: the Pieces are still ours to send direct,
		// and the lane is quarantined.
		s.log.Error(err, "first-hop copy failed; lane quarantined", "relayPid", sl.peer.Pid, "lane", sl.link.LaneIndex(), "copierLane", sl.copierLane)
		s.counters.laneQuarantine.Add(1)
		// Part of the copy may have been queued: the claim stays until
		// the copier's drain at stop.
		sl.broken, sl.keepClaim = true, true
		sn.fallbackSlot(sp, staging.FallbackLaneBroken)
		sl.drainTo(&s.fallbacks, staging.FallbackLaneBroken)
		return true
	}
	if err := sl.tx.Publish(seq); err != nil {
		// Unreachable while Ticket and Publish agree; should it happen,
		// the Pieces fail rather than being sent twice, and the lane
		// takes no more tickets.
		s.log.Error(err, "publishing a ticket; lane quarantined", "relayPid", sl.peer.Pid, "lane", sl.link.LaneIndex())
		sl.broken = true
		s.counters.failedPieces.Add(sp.pieces())
		sn.finishSlot(sp, err)
		sl.drainTo(&s.fallbacks, staging.FallbackLaneBroken)
		return true
	}
	s.counters.joinedPieces.Add(uint64(len(sp.refs) - 1))
	sp.refs[0].times = s.sentTimes.add(PieceTimes{Lane: sl.link.LaneIndex(), Seq: seq, Bytes: n, Submit: g.submitted, Copy: copyAt})
	if sl.relayWake.Wake() {
		s.counters.relayWakeCalls.Add(1)
	}
	return true
}

// minPartBytes is the least a part of a slot holds: below it the relay's
// hand-over of a part costs about what the overlap of the two hops buys.
const minPartBytes = 256 << 10

// cutParts returns the part ends (staging.Desc.PartEnds) of the slot being
// published on sl, n bytes of the plan in sn.planBuf, or none. A slot goes
// in parts only when the copier signals them and the lane has nothing else
// published or queued: a transfer bound by latency, whose relay would
// otherwise wait for the whole first hop before it starts the second.
// Behind other Pieces the relay has work while this one copies, and parts
// would only add hand-overs.
func (sn *sender) cutParts(sl *senderLane, n uint64) []uint32 {
	s := sn.s
	parts := min(s.cfg.SlotParts, int(n/minPartBytes))
	if s.partCopier == nil || parts < 2 || sl.tx.InFlight() || sl.front().g != nil {
		return nil
	}
	sn.partBuf = staging.CutParts(sn.partBuf[:0], sn.planBuf, n, parts)
	return sn.partBuf
}

// stage appends Piece pr's slices, staged from offset at of the slot at
// base, to the pump's plan and copy vectors, and returns the slot's bytes
// with them.
func (sn *sender) stage(pr pieceRef, base uintptr, at uint64) uint64 {
	it := pr.g.plan.PieceSlices(pr.g.blocks, pr.i)
	for c, ok := it.Next(); ok; c, ok = it.Next() {
		sn.planBuf = append(sn.planBuf, staging.PlanEntry{Dst: c.Dst, Len: c.Len})
		sn.copyBuf = append(sn.copyBuf, CopyEntry{Src: uintptr(c.Src), Dst: base + uintptr(at+c.Offset), Len: c.Len})
	}
	return at + pr.g.pieceLen(pr.i)
}

// join stages, behind the slot's lead Piece (n bytes so far), the Pieces
// queued next on the lane while each is a whole group of one Piece for the
// lead's target session, whose source is ready, and the slot has room for
// its bytes and its plan entries; it returns the slot's bytes. A stream of
// small Submits thus moves in slots of many, a ticket, a copy, a doorbell
// and a second hop for many of them, instead of one each.
//
// A Piece queued before the lane's last completion joins freely: its relay
// has completed a Piece since. One queued after it (unproven) joins only in
// place of a ticket of its own that the lane would give it now: room, the
// tickets left after the slot's, counts them down, and the slot holds each
// such Piece's credit until it is reaped (held). A relay that stops
// completing thus never has more Pieces riding on it than tickets it could
// have been given; the rest wait for credit, and after the credit timeout
// go direct, instead of riding in a slot that only the ticket timeout ends.
//
// Only the pump pops the queue, so the front it looked at is the one it
// pops; Submit only appends behind it. A Piece whose source is not known to
// be ready stays queued for a slot of its own, whose copy waits for its
// event: the copy of a slot waits for the lead's event only.
func (sn *sender) join(sl *senderLane, sp *slotPieces, base uintptr, n uint64, room int) uint64 {
	if !sn.s.joining() {
		return n
	}
	session, reaps := sp.refs[0].g.key.session, sl.reaps.Load()
	for {
		nx := sl.front()
		g := nx.g
		if g == nil || nx.i != 0 || len(g.plan.Pieces) != 1 || g.key.session != session ||
			n+g.pieceLen(0) > staging.SlotSize || len(sn.planBuf)+g.pieceEntries(0) > staging.MaxPlans {
			return n
		}
		unproven := g.reaps == reaps
		if unproven && room == 0 {
			return n
		}
		if g.ready != 0 {
			if done, err := sn.s.copier.Query(g.ready); err != nil || !done {
				return n
			}
		}
		sl.pop()
		n = sn.stage(nx, base, n)
		sp.refs = append(sp.refs, nx)
		if unproven {
			room--
			sp.unproven++
		}
	}
}

// held is the credit the unproven Pieces joined into sl's published slots
// hold: a ticket each, until their slot is reaped.
func (sn *sender) held(sl *senderLane) int {
	n := 0
	for seq := sl.tx.Reaped() + 1; seq <= sl.tx.Published(); seq++ {
		n += sl.inflight[staging.SlotOf(seq)].unproven
	}
	return n
}

// finishSlot finishes every Piece of a published slot with err (nil:
// done) and empties the slot.
func (sn *sender) finishSlot(sp *slotPieces, err error) {
	for _, pr := range sp.refs {
		pr.g.finishPiece(pr.i, err)
		sn.s.pieceDone(pr.g)
	}
	sp.clear()
}

// fallbackSlot sends every Piece of a slot that was not published direct,
// for why, and empties the slot.
func (sn *sender) fallbackSlot(sp *slotPieces, why fallbackReason) {
	for _, pr := range sp.refs {
		sn.s.fallback(pr.g, pr.i, why)
	}
	sp.clear()
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
		sp := &sl.inflight[staging.SlotOf(seq)]
		sn.s.sentTimes.set(sp.refs[0].times, stepReaped)
		sl.reaps.Add(1)
		sn.finishPublished(sp, status)
		progressed = true
	}
	if progressed {
		sl.progressAt = now
	}
	return progressed
}

func (sn *sender) finishPublished(sp *slotPieces, status int32) {
	s := sn.s
	var err error
	if len(sp.refs) > 1 && redoable(status) {
		// Pieces of several Submits share the slot, and one write of one
		// of them failed after every write of the slot ended: each goes
		// direct again, so that only a write that fails there too fails
		// its task, as it would have in a slot of its own.
		if status == staging.CompletionSecondHop {
			s.counters.secondHopFails.Add(1)
		}
		sn.fallbackSlot(sp, staging.FallbackOther)
		return
	}
	if status != staging.CompletionOK {
		// A closing relay waits for its lanes: check them in the next
		// round rather than at the next heartbeat.
		sn.recheck = sn.recheck || status == staging.CompletionRelayClosing
		err = fmt.Errorf("relay completion status %d (%s)", status, completionReason(status))
		if status == staging.CompletionTimeout {
			err = fmt.Errorf("%w: %w", err, ErrTimedOut)
		}
		s.counters.failedPieces.Add(sp.pieces())
		if status == staging.CompletionSecondHop || status == staging.CompletionTimeout {
			s.counters.secondHopFails.Add(1)
		}
	} else {
		s.counters.relayedBytes.Add(sp.bytes())
		s.counters.relayedPieces.Add(sp.pieces())
	}
	sn.finishSlot(sp, err)
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
		sp := &sl.inflight[staging.SlotOf(seq)]
		s.counters.failedPieces.Add(sp.pieces())
		sn.finishSlot(sp, err)
	}
}

// redoable reports whether a slot that ended with status wrote nothing
// after it ended and may be written again direct: its writes all ended
// (a second-hop failure), or none began (a refused descriptor, a target
// the relay could not resolve). A timed-out write may still land, and a
// closing relay's writes may still be in flight.
func redoable(status int32) bool {
	switch status {
	case staging.CompletionSecondHop, staging.CompletionInvalidDesc, staging.CompletionUnresolved:
		return true
	}
	return false
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

// runFallbacks sends direct the Pieces that never reached a doorbell, each
// exactly once and only after its source-ready event.
func (sn *sender) runFallbacks() bool {
	fb := &sn.s.fallbacks
	progressed := false
	for n := fb.len(); n > 0; n-- {
		p := fb.pop()
		keep, moved := sn.runFallback(&p)
		progressed = progressed || moved
		if keep {
			fb.push(p)
		}
	}
	return progressed
}

// runFallback moves one fallen-back Piece on: it reports whether the Piece
// still has work left and whether anything happened.
func (sn *sender) runFallback(fb *fallbackPiece) (keep, progressed bool) {
	s := sn.s
	if g := fb.g; g != nil {
		if g.ready != 0 {
			done, err := s.copier.Query(g.ready)
			if err != nil {
				s.counters.failedPieces.Add(1)
				g.finishPiece(fb.i, fmt.Errorf("source-ready event: %w", err))
				s.pieceDone(g)
				return false, true
			}
			if !done {
				return true, false
			}
		}
		// The writes carry their slices by value: the group is done with.
		ops := s.opBufs.get(g.pieceEntries(fb.i))
		it := g.plan.PieceSlices(g.blocks, fb.i)
		for sl, ok := it.Next(); ok; sl, ok = it.Next() {
			ops = append(ops, WriteOp{Src: uintptr(sl.Src), Len: sl.Len, Target: g.key.session, Dst: sl.Dst,
				Token: s.tokens.add(tokenEntry{kind: tokFallback, slice: taskSlice{batch: g.batch, task: int32(sl.Task), len: sl.Len}})})
		}
		s.counters.fallback(fb.reason, g.pieceLen(fb.i))
		g.key.lane.pieces.Add(-1)
		s.pieceDone(g)
		fb.g, fb.ops, fb.unsent = nil, ops, ops
	}
	before := len(fb.unsent)
	fb.unsent = s.drainOps(fb.unsent, nil)
	progressed = len(fb.unsent) != before
	if len(fb.unsent) > 0 {
		return true, progressed
	}
	s.opBufs.put(fb.ops)
	return false, progressed
}
