package relay

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
)

// readyRef shares one source-ready event among the Pieces of one group; the
// last Piece to finish with it releases it.
type readyRef struct {
	ev   Event
	refs atomic.Int32
}

// piece is one slot's worth of a group: its plan entries, first-hop copies
// and the logical slices its completion completes.
type piece struct {
	session string
	plan    *staging.Plan
	index   int
	slices  []slice
	bytes   uint64
	ready   *readyRef
	// fbUnsent are the direct writes of a Piece gone to fallback that the
	// hop has not taken yet; nil before the fallback starts.
	fbUnsent []WriteOp
}

func (p *piece) entries() []staging.PlanEntry { return p.plan.PieceEntries(p.index) }
func (p *piece) copies() []staging.CopyEntry  { return p.plan.PieceCopies(p.index) }

func (p *piece) finish(err error) {
	for i := range p.slices {
		p.slices[i].finish(err)
	}
}

// planGroup cuts a group's requests into Pieces and sets every task's slice
// count. Nothing is enqueued here.
func (e *Engine) planGroup(b *Batch, reqs []Request, g *group) ([]*piece, error) {
	blocks := make([]staging.Block, len(g.reqs))
	for j, i := range g.reqs {
		r := &reqs[i]
		blocks[j] = staging.Block{Src: uint64(r.Src), Dst: r.Dst, Len: r.Len, Task: j}
	}
	plan := &staging.Plan{}
	var pl staging.Planner
	if err := pl.Plan(blocks, len(g.reqs), plan); err != nil {
		return nil, err
	}
	ps := make([]*piece, len(plan.Pieces))
	for pi := range plan.Pieces {
		ss := plan.PieceSlices(pi)
		p := &piece{session: g.key.session, plan: plan, index: pi, bytes: plan.Pieces[pi].Len}
		p.slices = make([]slice, len(ss))
		for k, s := range ss {
			p.slices[k] = slice{batch: b, task: int32(g.reqs[s.Task]), src: uintptr(s.Src), dst: s.Dst, len: s.Len}
		}
		ps[pi] = p
	}
	for j, i := range g.reqs {
		b.tasks[i].route = RoutePXN
		b.tasks[i].remaining.Store(int64(plan.Tasks[j].Slices))
	}
	return ps, nil
}

// outLane is this rank's lane on one relay: the MPSC queue that callers
// fill, and the ring state that only the pump touches.
type outLane struct {
	peer Peer
	link Link
	lane *staging.Lane

	mu    sync.Mutex
	queue []*piece
	head  int

	// stale stops new tickets (heartbeat timeout); gone ends the lane.
	stale atomic.Bool
	gone  atomic.Bool

	// Pump-only ring state.
	epoch     uint64
	next      uint64
	published uint64
	reaped    uint64
	inflight  [staging.SlotsPerLane]*piece
	broken    bool
	waitSince time.Time
	// progressAt is when the oldest published ticket became the oldest:
	// published, or the one before it reaped.
	progressAt time.Time
	unreg      func() error
}

func newOutLane(p Peer, link Link) *outLane {
	return &outLane{peer: p, link: link, lane: link.Lane(), epoch: link.LaneEpoch(), next: 1}
}

func (ol *outLane) accepting() bool { return !ol.stale.Load() && !ol.gone.Load() }

// enqueue queues ps and reports true, or reports false when the pump has
// retired the lane since Submit chose it: retire sets gone before it
// drains the queue under mu, so nothing is queued on a lane nobody serves.
func (ol *outLane) enqueue(ps []*piece) bool {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.gone.Load() {
		return false
	}
	ol.queue = append(ol.queue, ps...)
	return true
}

func (ol *outLane) front() *piece {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.head == len(ol.queue) {
		return nil
	}
	return ol.queue[ol.head]
}

func (ol *outLane) pop() {
	ol.mu.Lock()
	ol.queue[ol.head] = nil
	ol.head++
	if ol.head == len(ol.queue) {
		ol.queue = ol.queue[:0]
		ol.head = 0
	}
	ol.mu.Unlock()
}

// drain removes every queued Piece.
func (ol *outLane) drain() []*piece {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	ps := append([]*piece(nil), ol.queue[ol.head:]...)
	clear(ol.queue)
	ol.queue = ol.queue[:0]
	ol.head = 0
	return ps
}

func (ol *outLane) queued() bool {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	return ol.head < len(ol.queue)
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
	p := ol.front()
	if p == nil {
		return false
	}
	if ol.stale.Load() {
		// A Piece without a ticket does not wait for a relay that may
		// never beat again: it goes direct.
		ol.pop()
		e.pump.fallback(p)
		return true
	}
	if ol.next > staging.MaxLaneSeq {
		// The sequence space is exhausted: no new tickets on this lane;
		// the pump reclaims it once drained.
		return false
	}
	if !staging.HasCredit(ol.next, ol.reaped) {
		// The credit timeout runs from the moment the lane's head first
		// found no credit, not from enqueue: a long request queues many
		// Pieces that are not late. Once it has run out, every Piece
		// queued behind goes direct too, until credit returns.
		if ol.waitSince.IsZero() {
			ol.waitSince = now
			e.counters.creditWaits.Add(1)
		} else if now.Sub(ol.waitSince) > e.cfg.CreditTimeout {
			ol.pop()
			e.pump.fallback(p)
			return true
		}
		return false
	}
	ol.waitSince = time.Time{}
	ol.pop()
	if ol.published == ol.reaped {
		ol.progressAt = now
	}
	seq := ol.next
	slot := staging.SlotOf(seq)
	d := &ol.lane.Descs[slot]
	if err := d.Fill(ol.epoch, p.session, p.entries(), p.bytes); err != nil {
		e.pump.fallback(p)
		return true
	}
	staging.PublishDesc(d, seq)
	base := ol.link.Staging() + uintptr(slot)*staging.SlotSize
	cps := p.copies()
	entries := make([]CopyEntry, len(cps))
	for i, c := range cps {
		entries[i] = CopyEntry{Src: uintptr(c.Src), Dst: base + uintptr(c.Offset), Len: c.Len}
	}
	if err := e.copier.Copy(ol.link.LaneIndex(), p.ready.ev, entries, &ol.lane.Ready[slot].Seq, seq); err != nil {
		// Before the doorbell: the Piece is still ours to send direct,
		// and the lane is quarantined.
		e.log.Error(err, "first-hop copy failed; lane quarantined", "relayPid", ol.peer.Pid, "lane", ol.link.LaneIndex())
		e.counters.laneQuarantine.Add(1)
		ol.broken = true
		e.pump.fallback(p)
		for _, q := range ol.drain() {
			e.pump.fallback(q)
		}
		return true
	}
	ol.inflight[slot] = p
	ol.next = seq + 1
	ol.published = seq
	atomic.StoreUint64(&ol.lane.Sender.NextSeq, ol.next)
	atomic.StoreUint64(&ol.lane.Sender.PublishedSeq, seq)
	return true
}

// reap takes the relay's completions in seq order. A Piece's slices are
// finished before reaped advances, so its slot is reused only afterwards.
func (e *Engine) reap(ol *outLane) bool {
	progressed := false
	for ol.reaped < ol.published {
		seq := ol.reaped + 1
		slot := staging.SlotOf(seq)
		c := &ol.lane.Completions[slot]
		if atomic.LoadUint64(&c.Seq) != seq {
			break
		}
		status := atomic.LoadInt32(&c.Status)
		p := ol.inflight[slot]
		ol.inflight[slot] = nil
		e.finishPublished(p, status)
		ol.reaped = seq
		atomic.StoreUint64(&ol.lane.Sender.ReapedSeq, seq)
		progressed = true
	}
	if progressed {
		ol.progressAt = time.Now()
	}
	return progressed
}

func (e *Engine) finishPublished(p *piece, status int32) {
	var err error
	if status != staging.CompletionOK {
		err = fmt.Errorf("relay completion status %d (%s)", status, completionReason(status))
		e.counters.failedPieces.Add(1)
		if status == staging.CompletionSecondHop {
			e.counters.secondHopFails.Add(1)
		}
	} else {
		e.counters.relayedBytes.Add(p.bytes)
		e.counters.relayedPieces.Add(1)
	}
	p.finish(err)
	e.releaseReady(p)
}

// failPublished fails, exactly once, every Piece published on a lane whose
// relay is gone.
func (e *Engine) failPublished(ol *outLane, err error) {
	for ol.reaped < ol.published {
		seq := ol.reaped + 1
		slot := staging.SlotOf(seq)
		p := ol.inflight[slot]
		ol.inflight[slot] = nil
		e.counters.failedPieces.Add(1)
		p.finish(err)
		e.releaseReady(p)
		ol.reaped = seq
	}
}

func (e *Engine) releaseReady(p *piece) {
	if p.ready.refs.Add(-1) == 0 && p.ready.ev != 0 {
		e.copier.Release(p.ready.ev)
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
