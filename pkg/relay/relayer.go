// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
)

// relayer is the inbound pipeline: it takes tickets from this rank's
// inbound lanes, runs their second hop and completes them. The pump holds
// it; nothing else touches it.
type relayer struct {
	s   *shared
	reg Registry

	in [staging.LaneCount]inLane
	// turn is the inbound lane served first in the next pass: the one
	// after the last lane that had a ticket taken.
	turn int
	// lead[j][i] counts the tickets taken from lane i since lane j was
	// last served or last found without a ready ticket (InboundOutOfTurn).
	lead [staging.LaneCount][staging.LaneCount]uint32
	// inflight counts relayed Pieces whose second hop has not finished,
	// and inflightBytes their bytes. Those of them still waiting for
	// later parts (waiting) do not count toward the inflight cap, so that
	// Pieces whose parts never land cannot stop the other lanes.
	inflight      int
	inflightBytes uint64
	vd            staging.ValidDesc
	// unsent are relayed Pieces whose second-hop writes the hop has not all
	// taken yet, in the order they were consumed.
	unsent fifo[*inflightRec]
	// waiting are relayed Pieces taken while their later parts were still
	// being copied into the slot (waiting set), in the order taken.
	waiting []*inflightRec
	recs    recPool
	// routes is the route cache, by target session.
	routes   map[string]*route
	invalBuf []string
	// lk is each inbound lane's route state; parked counts the lanes
	// whose Piece waits for a lookup, invalGen the invalidations applied.
	lk        [staging.LaneCount]laneRoutes
	parked    int
	invalGen  uint64
	resolvers sync.WaitGroup
	// now is the clock reading of the pump's round.
	now time.Time
	// late marks the inbound lanes whose sender is late (LateSenders, nil
	// when the registry cannot tell): no new ticket is taken from them.
	lateSenders LateSenders
	late        [staging.LaneCount]bool
}

func newRelayer(s *shared, reg Registry) *relayer {
	rl := &relayer{s: s, reg: reg, routes: make(map[string]*route)}
	rl.lateSenders, _ = reg.(LateSenders)
	for i := range rl.in {
		rl.in[i].rx = reg.Inbound(i)
	}
	return rl
}

// announced counts the tickets the senders say they have published on
// this rank's lanes and the relayer has not taken (RelayLane.Announced).
func (rl *relayer) announced() int {
	n := 0
	for i := range rl.in {
		n += rl.in[i].rx.Announced()
	}
	return n
}

// announcedBytes is what announced counts, in bytes (RelayLane.AnnouncedBytes),
// summed until it passes limit.
func (rl *relayer) announcedBytes(limit uint64) uint64 {
	var n uint64
	for i := range rl.in {
		if n > limit {
			break
		}
		n += rl.in[i].rx.AnnouncedBytes(limit - n)
	}
	return n
}

// consumeAll takes at most one ticket from each inbound lane, starting
// with rl.turn. A lane whose ticket was taken goes last in the next pass,
// so a slot freed under the inflight cap goes to the next lane in turn, not
// to the lowest-numbered one with a ticket.
//
// Every lane is synced to its epoch first, so that the turn counters see
// every lane's ready ticket. Once the inflight cap refuses a lane, no later
// lane of the pass is served, even if a write failing on submit freed a
// place meanwhile: the refused lane keeps its turn.
func (rl *relayer) consumeAll() bool {
	progressed := false
	var claimed [staging.LaneCount]bool
	for i := range rl.in {
		claimed[i] = rl.sync(i)
	}
	n := len(rl.in)
	start := rl.turn
	for k := range n {
		i := (start + k) % n
		if !claimed[i] {
			continue
		}
		if rl.inflight-len(rl.waiting) >= rl.s.cfg.InflightDepth {
			break
		}
		if rl.consume(i) {
			progressed = true
			rl.turn = (i + 1) % n
		}
	}
	return progressed
}

// served records a ticket taken from lane i for the turn counters.
func (rl *relayer) served(i int) {
	contended, outOfTurn := false, false
	for j := range rl.in {
		if j == i {
			continue
		}
		// A lane whose Piece waits for a lookup is not waiting for its
		// turn.
		if _, st := rl.in[j].rx.Poll(); st != staging.TicketReady || rl.lk[j].held {
			rl.lead[j] = [staging.LaneCount]uint32{}
			continue
		}
		contended = true
		rl.lead[j][i]++
		outOfTurn = outOfTurn || rl.lead[j][i] > 1
	}
	rl.lead[i] = [staging.LaneCount]uint32{}
	if contended {
		rl.s.counters.contended.Add(1)
	}
	if outOfTurn {
		rl.s.counters.outOfTurn.Add(1)
	}
}

// notReady records that lane i had no ready ticket when its turn came.
func (rl *relayer) notReady(i int) { rl.lead[i] = [staging.LaneCount]uint32{} }

// sendRecord gives a relayed Piece's writes to the hop, as many as it takes.
func (rl *relayer) sendRecord(rec *inflightRec) {
	rec.sending = true
	if rl.unsent.len() == 0 {
		rl.handOver(rec)
	}
	if len(rec.unsent) > 0 {
		rl.unsent.push(rec)
		return
	}
	rec.sending = false
	rl.freeRec(rec)
}

// resendRecords retries the writes the hop could not take, oldest Piece
// first.
func (rl *relayer) resendRecords() bool {
	progressed := false
	for rl.unsent.len() > 0 {
		rec := *rl.unsent.front()
		before := len(rec.unsent)
		rl.handOver(rec)
		if len(rec.unsent) != before {
			progressed = true
		}
		if len(rec.unsent) > 0 {
			break
		}
		rl.unsent.pop()
		rec.sending = false
		rl.freeRec(rec)
	}
	return progressed
}

// handOver gives the hop what it takes of rec's unsent writes: all of them
// in one call to a PieceHop, else in chunks (drainOps). A PieceHop that
// refuses the Piece for anything but being busy fails it.
func (rl *relayer) handOver(rec *inflightRec) {
	ph := rl.s.pieceHop
	if ph == nil {
		rec.unsent = rl.s.drainOps(rec.unsent, rl)
		return
	}
	err := ph.SubmitPiece(rec.unsent, rec.token)
	if errors.Is(err, ErrHopBusy) {
		return
	}
	tok := rec.token
	rec.unsent, rec.token = rec.unsent[:0], 0
	if err != nil {
		rl.s.failToken(tok, fmt.Errorf("submit to the hop: %w", err), rl)
	}
}

// release hands the writes of parts [rec.landed, landed) to the hop, behind
// any of rec's writes it has not taken yet. Each write gets its token, or,
// for a PieceHop, the writes not yet taken share one.
func (rl *relayer) release(rec *inflightRec, landed int) {
	from, end := rec.released(), rec.partEnds[landed-1]
	taken := from - len(rec.unsent)
	if rl.s.pieceHop != nil {
		if rec.token == 0 {
			rec.token = rl.s.tokens.add(tokenEntry{kind: tokRelay, rec: rec})
			rec.remaining++
		}
	} else {
		for k := from; k < end; k++ {
			rec.ops[k].Token = rl.s.tokens.add(tokenEntry{kind: tokRelay, rec: rec})
		}
		rec.remaining += end - from
	}
	rec.landed = landed
	rec.unsent = rec.ops[taken:end]
	if !rec.sending {
		rl.sendRecord(rec)
	}
}

// landParts releases the parts of waiting Pieces that have landed since,
// and gives up on those whose sender's ring ended (its lane freed or
// claimed anew): their later parts will never land, and a completion in a
// ring that is not the sender's any more is dropped anyway.
func (rl *relayer) landParts() bool {
	if len(rl.waiting) == 0 {
		return false
	}
	progressed := false
	now := time.Now()
	keep := rl.waiting[:0]
	for _, rec := range rl.waiting {
		rx := rl.in[rec.lane].rx
		if !rx.Current() || rx.Epoch() != rec.epoch {
			progressed = true
			rl.stopWaiting(rec, errLaneEnded)
			continue
		}
		n := rx.PartsLanded(rec.seq, rec.nparts)
		if n <= rec.landed {
			if limit := rl.s.partsWait(); now.Sub(rec.waitSince) > limit {
				progressed = true
				rl.s.log.V(1).Info("later parts did not land", "lane", rec.lane, "seq", rec.seq, "landed", rec.landed, "parts", rec.nparts, "limit", limit)
				rl.stopWaiting(rec, errPartsLate)
				continue
			}
			keep = append(keep, rec)
			continue
		}
		progressed = true
		if n < rec.nparts {
			keep = append(keep, rec)
		} else {
			rl.endWait(rec)
		}
		rl.release(rec, n)
	}
	clear(rl.waiting[len(keep):])
	rl.waiting = keep
	return progressed
}

// stopWaiting ends the wait of a Piece whose later parts will not land:
// it completes with err once the writes already released end.
func (rl *relayer) stopWaiting(rec *inflightRec, err error) {
	rl.endWait(rec)
	rl.noteFailure(rec, err)
	rl.settle(rec)
}

// endWait takes rec off its lane's wait; the caller takes it off the
// waiting list.
func (rl *relayer) endWait(rec *inflightRec) {
	rec.waiting = false
	if il := &rl.in[rec.lane]; il.waiting == rec {
		il.waiting = nil
	}
}

// stopAllWaiting ends every wait with err (the relay is closing).
func (rl *relayer) stopAllWaiting(err error) {
	w := rl.waiting
	rl.waiting = nil
	for _, rec := range w {
		rl.stopWaiting(rec, err)
	}
}

// freeRec returns rec to the pool once every write has completed, the
// hop holds none of its unsent writes and no part is still awaited.
func (rl *relayer) freeRec(rec *inflightRec) {
	if rec.remaining == 0 && !rec.sending && !rec.waiting {
		rl.recs.put(rec)
	}
}

// checkSenders asks the registry which inbound lanes' senders are late,
// with the pump's heartbeat.
func (rl *relayer) checkSenders() {
	if rl.lateSenders == nil {
		return
	}
	was := rl.late
	rl.lateSenders.LateSenders(&rl.late)
	for i := range rl.late {
		switch {
		case rl.late[i] && !was[i]:
			rl.s.log.Info("pxn takes no new ticket from a late sender", "lane", i)
		case was[i] && !rl.late[i]:
			rl.s.log.Info("pxn takes tickets again from a sender that beats again", "lane", i)
		}
	}
}

// sync follows inbound lane i to its current epoch and opens the epoch's
// ring once no Piece taken under an earlier one still has writes in the
// second hop (staging.RelayLane.Open, which first puts a claim's new
// staging memory in place: nothing reads the lane's slots then); it
// returns false while no sender has ever claimed the lane.
func (rl *relayer) sync(i int) bool {
	il := &rl.in[i]
	epoch, prev := il.rx.Sync()
	if epoch == 0 {
		return false
	}
	if epoch != prev {
		il.commitWait = time.Time{}
		rl.notReady(i)
	}
	if !il.rx.Opened() && il.unsettled == 0 {
		if err := il.rx.Open(); err != nil {
			rl.s.log.Error(err, "inbound lane not opened: its new staging memory could not be put in place; the claim ends", "lane", i)
		}
	}
	return true
}

// consume takes at most one ticket from inbound lane i, synced and under
// the inflight cap. It returns true when it made progress.
func (rl *relayer) consume(i int) bool {
	if rl.lk[i].held {
		return rl.resume(i)
	}
	il := &rl.in[i]
	if il.waiting != nil {
		return false
	}
	if rl.late[i] {
		rl.notReady(i)
		return false
	}
	epoch := il.rx.Epoch()
	switch _, st := il.rx.Poll(); st {
	case staging.TicketNone:
		rl.notReady(i)
		return false
	case staging.TicketRung:
		// The doorbell can become visible before the Desc's commit seq
		// (a GPU store against a CPU store): not ready yet. A commit seq
		// that never comes is a broken sender; after a bound the ticket is
		// validated as it is, fails, and the credit returns.
		now := time.Now()
		rl.notReady(i)
		if il.commitWait.IsZero() {
			il.commitWait = now
			return false
		}
		if now.Sub(il.commitWait) < commitWaitLimit {
			return false
		}
	}
	il.commitWait = time.Time{}
	seen := rl.s.relayedTimes.now()
	rl.served(i)
	vd := &rl.lk[i].vd
	seq, err := il.rx.Take(vd)
	if err != nil {
		rl.s.counters.invalidDescs.Add(1)
		rl.s.log.V(2).Info("invalid descriptor", "lane", i, "seq", seq, "err", err)
		rl.complete(i, epoch, seq, staging.CompletionInvalidDesc)
		return true
	}
	return rl.forward(i, taken{epoch: epoch, seq: seq, seen: seen})
}

// forward hands the second hop of Piece p, the last taken from inbound
// lane i, to the hop; a Piece whose route needs a lookup waits for it on
// its lane (park).
func (rl *relayer) forward(i int, p taken) bool {
	il := &rl.in[i]
	vd := &rl.lk[i].vd
	epoch, seq, seen := p.epoch, p.seq, p.seen
	slot := staging.SlotOf(seq)
	rec := rl.recs.get()
	src := rl.reg.ArenaBase() + uintptr(staging.SlotOffset(i, slot))
	rt, st := rl.routeFor(i, &p, rec, src)
	if st != routeReady {
		rl.recs.put(rec)
		if st == routeWait {
			rl.park(i, p)
		} else {
			rl.complete(i, epoch, seq, staging.CompletionUnresolved)
		}
		return true
	}
	rec.lane, rec.epoch, rec.seq, rec.route = i, epoch, seq, rt
	rec.bytes = vd.PieceLen()
	rec.setParts(vd.PartEnds())
	rec.remaining, rec.token, rec.unsent = 0, 0, rec.ops[:0]
	rl.inflight++
	rl.inflightBytes += rec.bytes
	il.unsettled++
	at := rl.s.relayedTimes.add(PieceTimes{Lane: i, Seq: seq, Bytes: rec.bytes, Seen: seen})
	rec.times = at
	// The ticket was taken on its doorbell or on its first part word:
	// what has landed goes now, the rest as it lands (landParts).
	landed := il.rx.PartsLanded(seq, rec.nparts)
	if landed < rec.nparts {
		rec.waiting, rec.waitSince = true, time.Now()
		il.waiting = rec
		rl.waiting = append(rl.waiting, rec)
	}
	if landed > 0 {
		rl.release(rec, landed)
	}
	rl.s.relayedTimes.set(at, stepPosted)
	return true
}

// finishWrite counts one second-hop write of a relayed Piece; the last
// one completes the Piece. A failed write drops the session's route: the
// next Piece resolves it again.
func (rl *relayer) finishWrite(rec *inflightRec, err error) {
	rl.noteFailure(rec, err)
	rec.remaining--
	rl.settle(rec)
}

// noteFailure records the first failure of a relayed Piece.
func (rl *relayer) noteFailure(rec *inflightRec, err error) {
	if err == nil || rec.failed {
		return
	}
	rec.failed = true
	rec.timedOut = errors.Is(err, ErrTimedOut)
	rec.closing = err == errRelayClosing
	if !rec.closing && err != errLaneEnded && err != errPartsLate {
		rl.dropRoute(rec.route)
		rl.s.log.V(2).Info("second hop failed", "lane", rec.lane, "seq", rec.seq, "err", err)
	}
}

// settle completes a relayed Piece once every released write has ended
// and no part is still awaited.
func (rl *relayer) settle(rec *inflightRec) {
	if rec.remaining > 0 || rec.waiting {
		return
	}
	rl.inflight--
	rl.inflightBytes -= rec.bytes
	rl.in[rec.lane].unsettled--
	status := int32(staging.CompletionOK)
	switch {
	case rec.closing:
		status = staging.CompletionRelayClosing
	case rec.failed:
		status = staging.CompletionSecondHop
		if rec.timedOut {
			status = staging.CompletionTimeout
		}
		rl.s.counters.secondHopFails.Add(1)
	default:
		rl.s.counters.forwardedBytes.Add(rec.bytes)
		rl.s.counters.forwardedPiece.Add(1)
	}
	rl.s.relayedTimes.set(rec.times, stepDone)
	// A lane claimed anew meanwhile has a new sender, which must not see
	// this completion: the old sender is gone, and the endpoint drops it.
	rl.complete(rec.lane, rec.epoch, rec.seq, status)
	rl.freeRec(rec)
}

// failWaiting completes, as failed with CompletionRelayClosing, every ticket
// whose doorbell rang but which the relayer has not taken, so that no
// sender waits for a relay that stopped. The pump calls it last, after
// failing its Pieces in flight, so that completions stay contiguous.
func (rl *relayer) failWaiting() {
	for i := range rl.in {
		il := &rl.in[i]
		epoch, _ := il.rx.Sync()
		if epoch == 0 {
			continue
		}
		for {
			if _, st := il.rx.Poll(); st == staging.TicketNone {
				break
			}
			seq, _ := il.rx.Take(&rl.vd)
			rl.complete(i, epoch, seq, staging.CompletionRelayClosing)
		}
	}
}

// complete records the end of seq of epoch on inbound lane i; the endpoint
// publishes every completion that is now contiguous.
func (rl *relayer) complete(i int, epoch, seq uint64, status int32) {
	if err := rl.in[i].rx.Complete(epoch, seq, status); err != nil {
		rl.s.log.Error(err, "completion out of window", "lane", i)
	}
}

// dropRoute removes rt from the cache if it is still there.
func (rl *relayer) dropRoute(rt *route) {
	if rt != nil && rl.routes[rt.session] == rt {
		delete(rl.routes, rt.session)
		rl.s.counters.routeDrops.Add(1)
	}
}

// applyInvalidations drops the routes InvalidateTarget named.
func (rl *relayer) applyInvalidations() {
	names := rl.s.invals.swap(rl.invalBuf)
	if names == nil {
		return
	}
	for _, s := range names {
		rl.forgetUnresolved(s)
		if s == "" {
			rl.s.counters.routeDrops.Add(uint64(len(rl.routes)))
			clear(rl.routes)
			continue
		}
		rl.dropRoute(rl.routes[s])
	}
	clear(names)
	rl.invalBuf = names[:0]
}
