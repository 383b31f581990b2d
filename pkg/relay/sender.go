package relay

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
}

// pieceRef names one Piece of a group: a slot's in-flight record.
type pieceRef struct {
	g *group
	i int
}

func (g *group) pieceLen(i int) uint64 { return g.plan.Pieces[i].Len }

// finishPiece finishes the logical slices of Piece i.
func (g *group) finishPiece(i int, err error) {
	for _, s := range g.plan.PieceSlices(i) {
		g.batch.tasks[g.tasks[s.Task]].finishSlice(s.Len, err)
	}
}

// pieceDone counts Piece work of g as over; the last releases the
// source-ready event and returns g to the pool.
func (e *Engine) pieceDone(g *group) {
	if g.pending.Add(-1) != 0 {
		return
	}
	if g.ready != 0 {
		e.copier.Release(g.ready)
	}
	e.groups.put(g)
}

// planGroup cuts a group's requests into Pieces and sets every task's slice
// count. Nothing is enqueued here.
func (e *Engine) planGroup(b *Batch, reqs []Request, g *group) error {
	g.blocks = g.blocks[:0]
	for j, i := range g.tasks {
		r := &reqs[i]
		g.blocks = append(g.blocks, staging.Block{Src: uint64(r.Src), Dst: r.Dst, Len: r.Len, Task: j})
	}
	var pl staging.Planner
	if err := pl.Plan(g.blocks, len(g.tasks), &g.plan); err != nil {
		return err
	}
	for j, i := range g.tasks {
		b.tasks[i].route = RoutePXN
		b.tasks[i].remaining.Store(int64(g.plan.Tasks[j].Slices))
	}
	return nil
}

// outLane is this rank's lane on one relay: the MPSC queue of groups that
// callers fill, and the ring state that only the pump touches.
type outLane struct {
	peer Peer
	link Link
	// tx is the lane's sender endpoint (pump only).
	tx *staging.SenderLane

	mu    sync.Mutex
	queue fifo[*group]

	// stale stops new tickets (heartbeat timeout); gone ends the lane.
	stale atomic.Bool
	gone  atomic.Bool

	// Pump-only state.
	inflight  [staging.SlotsPerLane]pieceRef
	broken    bool
	waitSince time.Time
	// progressAt is when the oldest published ticket became the oldest:
	// published, or the one before it reaped.
	progressAt time.Time
	unreg      func() error
}

func newOutLane(p Peer, link Link) *outLane {
	return &outLane{peer: p, link: link, tx: link.Sender()}
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

// drainTo hands every queued Piece to fallback.
func (ol *outLane) drainTo(p *pump) {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	for ol.queue.len() > 0 {
		g := ol.queue.pop()
		for i, n := g.next, len(g.plan.Pieces); i < n; i++ {
			p.fallback(g, i)
		}
	}
}

func (ol *outLane) queued() bool {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	return ol.queue.len() > 0
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
var errTicketTimeout = errors.New("relay made no progress on the piece")

func (e *Engine) ticketTimeout() time.Duration {
	if e.hooks.ticketTimeout > 0 {
		return e.hooks.ticketTimeout
	}
	return ticketTimeout
}

// publish stages one Piece into the relay's ring if the lane has credit.
// It returns true when it made progress.
func (e *Engine) publish(ol *outLane, now time.Time) bool {
	if ol.broken || ol.gone.Load() {
		return false
	}
	pr := ol.front()
	if pr.g == nil {
		return false
	}
	if ol.stale.Load() {
		// A Piece without a ticket does not wait for a relay that may
		// never beat again: it goes direct.
		ol.pop()
		e.pump.fallback(pr.g, pr.i)
		return true
	}
	seq, ok := ol.tx.Ticket()
	if !ok && ol.tx.Exhausted() {
		// The sequence space is exhausted: no new tickets on this lane;
		// the pump reclaims it once drained.
		return false
	}
	if !ok {
		// No credit. The credit timeout runs from the moment the lane's
		// head first found none, not from enqueue: a long request queues
		// many Pieces that are not late. Once it has run out, every Piece
		// queued behind goes direct too, until credit returns.
		if ol.waitSince.IsZero() {
			ol.waitSince = now
			e.counters.creditWaits.Add(1)
		} else if now.Sub(ol.waitSince) > e.cfg.CreditTimeout {
			ol.pop()
			e.pump.fallback(pr.g, pr.i)
			return true
		}
		return false
	}
	ol.waitSince = time.Time{}
	ol.pop()
	if !ol.tx.InFlight() {
		ol.progressAt = now
	}
	g, i := pr.g, pr.i
	if err := ol.tx.Commit(seq, g.key.session, g.plan.PieceEntries(i), g.pieceLen(i)); err != nil {
		e.pump.fallback(g, i)
		return true
	}
	slot := staging.SlotOf(seq)
	base := ol.link.Staging() + uintptr(slot)*staging.SlotSize
	entries := e.pump.copyBuf[:0]
	for _, c := range g.plan.PieceCopies(i) {
		entries = append(entries, CopyEntry{Src: uintptr(c.Src), Dst: base + uintptr(c.Offset), Len: c.Len})
	}
	e.pump.copyBuf = entries
	if err := e.copier.Copy(ol.link.LaneIndex(), g.ready, entries, ol.tx.ReadyWord(seq), seq); err != nil {
		// Before the doorbell: the Piece is still ours to send direct,
		// and the lane is quarantined.
		e.log.Error(err, "first-hop copy failed; lane quarantined", "relayPid", ol.peer.Pid, "lane", ol.link.LaneIndex())
		e.counters.laneQuarantine.Add(1)
		ol.broken = true
		e.pump.fallback(g, i)
		ol.drainTo(e.pump)
		return true
	}
	if err := ol.tx.Publish(seq); err != nil {
		// Unreachable while Ticket and Publish agree; should it happen,
		// the Piece fails rather than being sent twice, and the lane
		// takes no more tickets.
		e.log.Error(err, "publishing a ticket; lane quarantined", "relayPid", ol.peer.Pid, "lane", ol.link.LaneIndex())
		ol.broken = true
		e.counters.failedPieces.Add(1)
		g.finishPiece(i, err)
		e.pieceDone(g)
		ol.drainTo(e.pump)
		return true
	}
	ol.inflight[slot] = pr
	return true
}

// reap takes the relay's completions in seq order. A Piece's slices are
// finished before the pump publishes again, so its slot is reused only
// afterwards.
func (e *Engine) reap(ol *outLane) bool {
	progressed := false
	for {
		seq, status, ok := ol.tx.Reap()
		if !ok {
			break
		}
		slot := staging.SlotOf(seq)
		pr := ol.inflight[slot]
		ol.inflight[slot] = pieceRef{}
		e.finishPublished(pr, status)
		progressed = true
	}
	if progressed {
		ol.progressAt = time.Now()
	}
	return progressed
}

func (e *Engine) finishPublished(pr pieceRef, status int32) {
	var err error
	if status != staging.CompletionOK {
		err = fmt.Errorf("relay completion status %d (%s)", status, completionReason(status))
		e.counters.failedPieces.Add(1)
		if status == staging.CompletionSecondHop {
			e.counters.secondHopFails.Add(1)
		}
	} else {
		e.counters.relayedBytes.Add(pr.g.pieceLen(pr.i))
		e.counters.relayedPieces.Add(1)
	}
	pr.g.finishPiece(pr.i, err)
	e.pieceDone(pr.g)
}

// failPublished fails, exactly once, every Piece published on a lane whose
// relay is gone.
func (e *Engine) failPublished(ol *outLane, err error) {
	for {
		seq, ok := ol.tx.Abandon()
		if !ok {
			return
		}
		slot := staging.SlotOf(seq)
		pr := ol.inflight[slot]
		ol.inflight[slot] = pieceRef{}
		e.counters.failedPieces.Add(1)
		pr.g.finishPiece(pr.i, err)
		e.pieceDone(pr.g)
	}
}

func completionReason(status int32) string {
	switch status {
	case staging.CompletionInvalidDesc:
		return "invalid descriptor"
	case staging.CompletionSecondHop:
		return "second hop failed"
	case staging.CompletionUnresolved:
		return "target not resolvable on the relay's rail"
	case staging.CompletionRelayClosing:
		return "relay closing"
	}
	return "unknown"
}
