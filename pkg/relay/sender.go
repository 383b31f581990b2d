// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/staging"
)

// group is the requests of one Submit that go to one relay lane for one
// target session and caller stream: their plan, cut into Pieces, and the
// source-ready event they share. It comes from the engine's pool and goes
// back once every Piece is finished or handed to the hop as direct writes.
type group struct {
	key   groupKey
	batch *Batch
	// tasks maps a plan task to its task index in the batch.
	tasks  []int32
	blocks []staging.Block
	plan   staging.Plan
	ready  Event
	// pending counts Pieces not yet done with the group; the last one
	// releases the event and the group.
	pending atomic.Int32
	// next is the first Piece not yet taken off the lane's queue (pump
	// only, under the lane's mu).
	next int
	// submitted is when the Submit chunk that planned the group began
	// (Unix ns, PieceTimes.Submit).
	submitted int64
}

// pieceRef names one Piece of a group: a slot's in-flight record.
type pieceRef struct {
	g *group
	i int
	// times is the Piece's place in the sender's time ring.
	times uint64
}

func (g *group) pieceLen(i int) uint64 { return g.plan.Pieces[i].Len }

// finishPiece finishes the logical slices of Piece i. The Piece leaves
// its lane's count first, so that a caller who sees its task done and
// submits again finds the lane as the Piece left it.
func (g *group) finishPiece(i int, err error) {
	g.key.lane.pieces.Add(-1)
	for _, s := range g.plan.PieceSlices(i) {
		g.batch.tasks[g.tasks[s.Task]].finishSlice(s.Len, err)
	}
}

// planGroup cuts a group's requests into Pieces and sets every task's slice
// count. The planner's ramp applies when the group's lane has no Piece
// queued, in flight or being planned: behind other Pieces a small first
// Piece would start no sooner, and only add Pieces. Nothing is enqueued
// here; the group's Pieces count on the lane from now on.
func (e *Engine) planGroup(b *Batch, reqs []Request, g *group) error {
	g.blocks = slices.Grow(g.blocks[:0], len(g.tasks))
	for j, i := range g.tasks {
		r := &reqs[i]
		g.blocks = append(g.blocks, staging.Block{Src: uint64(r.Src), Dst: r.Dst, Len: r.Len, Task: j})
	}
	var pl staging.Planner
	if g.key.lane.pieces.Load() == 0 {
		pl.FirstPiece = e.cfg.FirstPiece
	}
	if err := pl.Plan(g.blocks, len(g.tasks), &g.plan); err != nil {
		return err
	}
	g.key.lane.pieces.Add(int64(len(g.plan.Pieces)))
	for j, i := range g.tasks {
		b.tasks[i].route = RoutePXN
		b.tasks[i].remaining.Store(int64(g.plan.Tasks[j].Slices))
	}
	return nil
}

// outLane is the part of an outbound lane that callers reach: the relay it
// leads to, the queue of groups that Submit fills, and whether it takes
// them. The rest of the lane is the sender's (senderLane).
type outLane struct {
	peer Peer

	mu    sync.Mutex
	queue fifo[*group]
	// pieces counts the Pieces planned for this lane that have not been
	// finished or handed to the direct path.
	pieces atomic.Int64

	// stale stops new tickets (heartbeat timeout); gone ends the lane.
	stale atomic.Bool
	gone  atomic.Bool
}

func (ol *outLane) accepting() bool { return !ol.stale.Load() && !ol.gone.Load() }

// enqueue queues g's Pieces and reports true, or reports false when the
// pump has retired the lane since Submit chose it: retire sets gone before
// it drains the queue under mu, so nothing is queued on a lane nobody serves.
func (ol *outLane) enqueue(g *group) bool {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.gone.Load() {
		return false
	}
	ol.queue.push(g)
	return true
}

// front returns the next Piece to publish; g is nil when none is queued.
func (ol *outLane) front() pieceRef {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.queue.len() == 0 {
		return pieceRef{}
	}
	g := *ol.queue.front()
	return pieceRef{g: g, i: g.next}
}

// pop takes the front Piece off the queue.
func (ol *outLane) pop() {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	g := *ol.queue.front()
	g.next++
	if g.next == len(g.plan.Pieces) {
		ol.queue.pop()
	}
}

// drainTo hands every queued Piece to fb, as gone direct for why.
func (ol *outLane) drainTo(fb *fallbackQueue, why fallbackReason) {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	for ol.queue.len() > 0 {
		g := ol.queue.pop()
		for i, n := g.next, len(g.plan.Pieces); i < n; i++ {
			fb.push(fallbackPiece{g: g, i: i, reason: why})
		}
	}
}

func (ol *outLane) queued() bool {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	return ol.queue.len() > 0
}

// senderLane is the sender's own state of one outbound lane: the claim, the
// lane's endpoint and the Pieces in its slots. Only the pump touches it.
type senderLane struct {
	*outLane
	link Link
	tx   *staging.SenderLane
	// relayWake is the relay's wake word, rung after each Publish.
	relayWake *staging.WakeWord
	inflight  [staging.SlotsPerLane]pieceRef
	broken    bool
	waitSince time.Time
	// progressAt is when the oldest published ticket became the oldest:
	// published, or the one before it reaped.
	progressAt time.Time
	unreg      func() error
	// copierLane is the lane this one's first-hop copies go on in the
	// copier (Copier.Copy): unique among this rank's outbound lanes. It is
	// not the lane's index at its relay, which two relays may both have
	// given this rank, and two outbound lanes on one copier lane would
	// share its streams and its gather plans slot by slot.
	copierLane int
	// copiedFrom..copiedTo are the seqs in flight when the lane was
	// retired: their copies may still be landing in the relay's memory.
	copiedFrom, copiedTo uint64
	// keepClaim keeps a retired lane's claim until stop.
	keepClaim bool
}

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
	// copyBuf holds the first-hop copies of the Piece being published.
	copyBuf []CopyEntry
	// seqHooked is set once testHooks.firstSeq has been applied.
	seqHooked bool
	peersOff  bool
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
	if sn.s.hooks.ticketTimeout > 0 {
		return sn.s.hooks.ticketTimeout
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
	seq, ok := sl.tx.Ticket()
	if !ok && sl.tx.Exhausted() {
		// The sequence space is exhausted: no new tickets on this lane;
		// the sender retires it once drained.
		return false
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
	g, i := pr.g, pr.i
	if err := sl.tx.Commit(seq, g.key.session, g.plan.PieceEntries(i), g.pieceLen(i)); err != nil {
		s.fallback(g, i, staging.FallbackOther)
		return true
	}
	slot := staging.SlotOf(seq)
	base := sl.link.Staging() + uintptr(slot)*staging.SlotSize
	entries := sn.copyBuf[:0]
	for _, c := range g.plan.PieceCopies(i) {
		entries = append(entries, CopyEntry{Src: uintptr(c.Src), Dst: base + uintptr(c.Offset), Len: c.Len})
	}
	sn.copyBuf = entries
	copyAt := unixNow()
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
		sn.s.sentTimes.set(pr.times, stepReaped, unixNow())
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

// checkLanes reads the health of the relays behind the outbound lanes
// from their mapped control blocks: stale ones stop taking tickets, gone
// ones fail what they had. It makes no system call for a live relay.
func (sn *sender) checkLanes() {
	s := sn.s
	if sn.peersOff || sn.noSend {
		return
	}
	changed := false
	now := time.Now()
	live := sn.lanes[:0]
	for _, sl := range sn.lanes {
		h := sl.link.Health(now)
		if h == Gone {
			sn.retire(sl, errRelayGone, staging.FallbackRelayGone)
			changed = true
			continue
		}
		if h == Closing {
			// The relay completes or fails what was published; the lane
			// goes back as soon as nothing is left, so that its close
			// need not wait for us.
			if !sl.tx.InFlight() {
				sn.retire(sl, nil, staging.FallbackRelayGone)
				changed = true
				continue
			}
			h = Stale
		}
		if stale := h == Stale; stale != sl.stale.Load() {
			sl.stale.Store(stale)
			changed = true
		}
		if d := sn.ticketTimeout(); sl.tx.InFlight() && now.Sub(sl.progressAt) > d {
			// The lane's claim stays with the zombie until the copier has
			// drained, and hasLane keeps it from being claimed anew
			// meanwhile: this relay gets no more tickets from us.
			s.log.Error(errTicketTimeout, "published tickets failed; relay not used again", "relayPid", sl.peer.Pid, "lane", sl.link.LaneIndex(), "seq", sl.tx.Reaped()+1, "timeout", d)
			s.counters.laneQuarantine.Add(1)
			sl.keepClaim = true
			sn.retire(sl, fmt.Errorf("%w within %v", errTicketTimeout, d), staging.FallbackLaneBroken)
			changed = true
			continue
		}
		if sl.broken && !sl.tx.InFlight() {
			sn.retire(sl, nil, staging.FallbackLaneBroken)
			changed = true
			continue
		}
		if sl.tx.Exhausted() && !sl.tx.InFlight() {
			// Sequence space spent and drained: a new claim gives the lane
			// a new epoch and restarts at seq 1.
			sn.retire(sl, nil, staging.FallbackNoLane)
			changed = true
			continue
		}
		live = append(live, sl)
	}
	sn.lanes = live
	sn.releaseLanded()
	if changed {
		sn.publishRoutes()
	}
}

// listPeers lists the group (a registry scan): new relays get a lane, and
// more peers than lanes turn PXN off.
func (sn *sender) listPeers() {
	s := sn.s
	sn.attachPending = false
	peers, err := sn.reg.Peers()
	if err != nil {
		if errors.Is(err, ErrTooManyPeers) {
			if !sn.peersOff {
				sn.peersOff = true
				s.log.Info("more than 7 peers in the group; PXN off, sending direct", "err", err.Error())
			}
			s.pxn.Store(false)
			for _, sl := range sn.lanes {
				sn.retire(sl, errRelayGone, staging.FallbackNoLane)
			}
			sn.lanes = nil
			s.routes.Store(&routeTable{})
			return
		}
		s.log.Error(err, "registry scan failed")
		return
	}
	if sn.peersOff || sn.noSend {
		return
	}
	changed := false
	for _, pr := range peers {
		if pr.Rail == s.localRail || pr.Rail == "" {
			continue
		}
		if sn.hasLane(pr) {
			continue
		}
		if sl := sn.attach(pr); sl != nil {
			sn.lanes = append(sn.lanes, sl)
			changed = true
		}
	}
	if changed {
		sn.publishRoutes()
	}
}

// attach claims a lane on relay pr and registers its words for doorbells.
func (sn *sender) attach(pr Peer) *senderLane {
	s := sn.s
	link, err := sn.reg.Attach(pr)
	if err != nil {
		// A busy registry is retried at the next heartbeat interval,
		// silently.
		if errors.Is(err, ErrRegistryBusy) {
			sn.attachPending = true
		} else {
			s.log.V(1).Info("cannot attach to relay", "pid", pr.Pid, "rail", pr.Rail, "err", err.Error())
		}
		return nil
	}
	sl := &senderLane{outLane: &outLane{peer: pr}, link: link, tx: link.Sender(), relayWake: link.Wake(), copierLane: sn.freeCopierLane()}
	if first := s.hooks.firstSeq; first > 1 && !sn.seqHooked {
		sn.seqHooked = true
		if err := sl.tx.StartAt(first); err != nil {
			s.log.Error(err, "test hook firstSeq")
		}
	}
	if hr, ok := s.copier.(HostRegistrar); ok {
		unreg, err := hr.RegisterHost(sl.tx.Words())
		if err != nil {
			s.log.Error(err, "cannot register a relay's lane for doorbells", "pid", pr.Pid, "rail", pr.Rail)
			_ = link.Close()
			return nil
		}
		sl.unreg = unreg
	}
	if as, ok := link.(ArenaSharer); ok {
		switch as.ArenaShare() {
		case staging.ShareFD:
			s.counters.arenaByFD.Add(1)
		case staging.ShareIPCHandle:
			s.counters.arenaByHandle.Add(1)
		}
	}
	return sl
}

// retire ends a lane: published Pieces fail with err (nil: the lane was
// drained), queued ones go direct for why. The claim and mappings are released now
// when nothing can still be copied into the relay's memory, or after the
// copier has drained otherwise.
func (sn *sender) retire(sl *senderLane, err error, why fallbackReason) {
	sl.gone.Store(true)
	inFlight := sl.tx.InFlight()
	sl.copiedFrom, sl.copiedTo = sl.tx.Reaped()+1, sl.tx.Published()
	if err != nil {
		sn.failPublished(sl, err)
	}
	sl.drainTo(&sn.s.fallbacks, why)
	if inFlight {
		sn.zombies = append(sn.zombies, sl)
		return
	}
	sl.release(sn.s.log)
}

// releaseLanded releases the retired lanes whose copies have all landed:
// every seq abandoned at retire has its doorbell in the ready word, and a
// doorbell is written only after its copy. A lane kept for a relay that
// stopped making progress (keepClaim) waits for the copier's drain at stop,
// so that the relay gets no lane from us again.
func (sn *sender) releaseLanded() {
	kept := sn.zombies[:0]
	for _, sl := range sn.zombies {
		if !sl.keepClaim && sl.landed() {
			sl.release(sn.s.log)
			continue
		}
		kept = append(kept, sl)
	}
	clear(sn.zombies[len(kept):])
	sn.zombies = kept
}

func (sl *senderLane) landed() bool {
	for seq := sl.copiedFrom; seq <= sl.copiedTo; seq++ {
		if atomic.LoadUint64(sl.tx.ReadyWord(seq)) != seq {
			return false
		}
	}
	return true
}

func (sl *senderLane) release(log klog.Logger) {
	if sl.unreg != nil {
		if err := sl.unreg(); err != nil {
			log.Error(err, "unregistering a relay's lane", "relayPid", sl.peer.Pid)
		}
		sl.unreg = nil
	}
	if err := sl.link.Close(); err != nil {
		log.Error(err, "releasing lane", "relayPid", sl.peer.Pid)
	}
}

// copierFailed handles a copier that can no longer ring doorbells: every
// lane stops taking tickets and fails what it published.
func (sn *sender) copierFailed(err error) {
	s := sn.s
	s.log.Error(err, "copier failed; outbound lanes quarantined")
	for _, sl := range sn.lanes {
		s.counters.laneQuarantine.Add(1)
		sl.broken = true
		sn.failPublished(sl, fmt.Errorf("first hop failed: %w", err))
		sl.drainTo(&s.fallbacks, staging.FallbackLaneBroken)
	}
}

// freeCopierLane is the lowest copier lane no live outbound lane holds,
// preferring one no retired lane still drains through either. A rank has
// at most one outbound lane a rail, so with LaneCount+1 rails at most there
// is always one; beyond that, lanes share (their copies are ordered behind
// each other's, which is correct, only slower).
func (sn *sender) freeCopierLane() int {
	var live, draining [staging.LaneCount]bool
	for _, sl := range sn.lanes {
		live[sl.copierLane] = true
	}
	for _, sl := range sn.zombies {
		draining[sl.copierLane] = true
	}
	free := -1
	for i := range live {
		if live[i] {
			continue
		}
		if !draining[i] {
			return i
		}
		if free < 0 {
			free = i
		}
	}
	if free >= 0 {
		return free
	}
	return len(sn.lanes) % staging.LaneCount
}

func (sn *sender) hasLane(pr Peer) bool {
	for _, sl := range sn.lanes {
		if sl.peer.Pid == pr.Pid && sl.peer.Epoch == pr.Epoch {
			return true
		}
	}
	for _, sl := range sn.zombies {
		if sl.peer.Pid == pr.Pid && sl.peer.Epoch == pr.Epoch {
			return true
		}
	}
	return false
}

// publishRoutes rebuilds the rail → lane table. A rail with more than one
// relay is not unique and routes direct.
func (sn *sender) publishRoutes() {
	count := map[string]int{}
	for _, sl := range sn.lanes {
		count[sl.peer.Rail]++
	}
	rt := &routeTable{byRail: map[string]*outLane{}}
	for _, sl := range sn.lanes {
		if count[sl.peer.Rail] == 1 {
			rt.byRail[sl.peer.Rail] = sl.outLane
		}
	}
	sn.s.routes.Store(rt)
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
		ss := g.plan.PieceSlices(fb.i)
		ops := s.opBufs.get(len(ss))
		for _, sl := range ss {
			ops = append(ops, WriteOp{Src: uintptr(sl.Src), Len: sl.Len, Target: g.key.session, Dst: sl.Dst,
				Token: s.tokens.add(tokenEntry{kind: tokFallback, slice: taskSlice{batch: g.batch, task: g.tasks[sl.Task], len: sl.Len}})})
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
