package relay

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
)

const (
	heartbeatInterval = 100 * time.Millisecond
	idleWait          = 50 * time.Microsecond
	// idleDeep is how long the pump sleeps once it has had nothing to do
	// for idleDeepAfter: no queued Piece, no ticket in flight either way.
	idleDeep      = 1 * time.Millisecond
	idleDeepAfter = 20 * time.Millisecond
)

// pump is the engine's one thread: it drives the sender and the relay side.
type pump struct {
	e      *Engine
	wakeCh chan struct{}
	stopCh chan struct{}
	doneCh chan struct{}

	// Pump-only state.
	out           []*outLane
	in            [staging.LaneCount]inLane
	relayInflight int
	// fallbacks are Pieces that go direct; callers add to it too (a
	// failed source-ready event), hence fbMu. fbLen is its length, kept
	// under fbMu and read without it by every round.
	fallbacks  fifo[fallbackPiece]
	fbMu       chanMutex
	fbLen      atomic.Int32
	lastBeat   time.Time
	lastActive time.Time
	polled     [64]HopCompletion
	peersOff   bool
	vd         staging.ValidDesc
	drainBy    atomic.Int64
	stopErr    error
	tid        atomic.Int64
	noSend     bool
	// zombies are retired lanes that may still have copies or doorbells
	// in flight into the relay's memory: their mapping and host
	// registration are released only after the copier has drained.
	zombies []*outLane
	poller  CopyPoller
	dead    atomic.Bool
	// unsent are relayed Pieces whose second-hop writes the hop has not all
	// taken yet, in the order they were consumed.
	unsent fifo[*inflightRec]
	recs   recPool
	// routes is the relay's route cache, by target session.
	routes   map[string]*route
	invalBuf []string
	// copyBuf holds the first-hop copies of the Piece being published.
	copyBuf []CopyEntry
	// seqHooked is set once testHooks.firstSeq has been applied.
	seqHooked bool
	// spin is the copier's BusyPoller window (0: sleep at once).
	spin time.Duration
	// manual is set when tests run the rounds (testHooks.manualPump).
	manual bool
}

// fallbackPiece is a Piece that goes direct: Piece i of g until its writes
// are built (g set), then the writes the hop has not taken yet.
type fallbackPiece struct {
	g      *group
	i      int
	ops    []WriteOp
	unsent []WriteOp
}

// chanMutex guards fallbacks that callers add (ready-event failures) while
// the pump drains them.
type chanMutex chan struct{}

func (m chanMutex) lock()   { m <- struct{}{} }
func (m chanMutex) unlock() { <-m }

func newPump(e *Engine) *pump {
	poller, _ := e.copier.(CopyPoller)
	var spin time.Duration
	if bp, ok := e.copier.(BusyPoller); ok {
		spin = bp.PollWindow()
	}
	return &pump{
		spin:   spin,
		poller: poller,
		e:      e,
		wakeCh: make(chan struct{}, 1),
		stopCh: make(chan struct{}),
		doneCh: make(chan struct{}),
		fbMu:   make(chanMutex, 1),
		routes: make(map[string]*route),
	}
}

func (p *pump) start() { go p.run() }

func (p *pump) wake() {
	select {
	case p.wakeCh <- struct{}{}:
	default:
	}
}

// fallback sends Piece i of g direct, after its source-ready event.
func (p *pump) fallback(g *group, i int) {
	p.pushFallback(fallbackPiece{g: g, i: i})
}

func (p *pump) pushFallback(fb fallbackPiece) {
	p.fbMu.lock()
	p.fallbacks.push(fb)
	p.fbLen.Store(int32(p.fallbacks.len()))
	p.fbMu.unlock()
}

func (p *pump) popFallback() fallbackPiece {
	p.fbMu.lock()
	defer p.fbMu.unlock()
	fb := p.fallbacks.pop()
	p.fbLen.Store(int32(p.fallbacks.len()))
	return fb
}

func (p *pump) fallbackLen() int { return int(p.fbLen.Load()) }

func (p *pump) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p.tid.Store(int64(unix.Gettid()))
	if b, ok := p.e.copier.(ThreadBinder); ok {
		if err := b.BindThread(); err != nil {
			p.e.log.Error(err, "pump cannot use the copier; PXN off for sending, relaying goes on")
			p.e.pxn.Store(false)
			p.noSend = true
		}
	}
	defer close(p.doneCh)
	defer p.recoverPanic()
	timer := time.NewTimer(idleWait)
	defer timer.Stop()
	p.lastActive = time.Now()
	for {
		now := time.Now()
		if by := p.drainBy.Load(); by != 0 {
			if (!p.busy() && p.e.tokens.len() == 0) || now.UnixNano() > by {
				p.finishStop()
				return
			}
		}
		if p.round(now) {
			p.lastActive = now
			continue
		}
		if p.spin > 0 && (now.Sub(p.lastActive) < p.spin || p.busy()) {
			continue
		}
		wait := idleWait
		if now.Sub(p.lastActive) > idleDeepAfter && !p.busy() && p.drainBy.Load() == 0 {
			wait = idleDeep
		}
		timer.Reset(wait)
		select {
		case <-p.wakeCh:
			p.lastActive = time.Now()
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
	}
}

// recoverPanic keeps a bug in the pump from ending the host process: PXN
// turns off, everything the pump owned fails, and direct traffic goes on
// through Progress.
func (p *pump) recoverPanic() {
	r := recover()
	if r == nil {
		return
	}
	e := p.e
	e.log.Error(fmt.Errorf("%v", r), "pump panicked; PXN off, sending direct", "stack", string(debug.Stack()))
	e.pxn.Store(false)
	e.routes.Store(&routeTable{})
	p.dead.Store(true)
	func() {
		defer func() { _ = recover() }()
		p.finishStop()
	}()
}

// busy reports whether anything is in flight or queued on either side.
func (p *pump) busy() bool {
	if p.relayInflight > 0 || p.fallbackLen() > 0 || p.e.tokens.len() > 0 {
		return true
	}
	for _, ol := range p.out {
		if ol.tx.InFlight() || ol.queued() {
			return true
		}
	}
	return false
}

// round is one pass of the fixed order: heartbeat, outbound reaps, inbound
// reaps, inbound tickets, outbound tickets, fallbacks.
func (p *pump) round(now time.Time) bool {
	e := p.e
	progressed := false
	if now.Sub(p.lastBeat) >= heartbeatInterval {
		p.lastBeat = now
		e.reg.Heartbeat(now)
		p.refreshPeers()
	}
	if p.poller != nil {
		if n, err := p.poller.Poll(); err != nil {
			p.copierFailed(err)
			progressed = true
		} else if n > 0 {
			progressed = true
		}
	}
	for _, ol := range p.out {
		if e.reap(ol) {
			progressed = true
		}
	}
	if p.pollHop() {
		progressed = true
	}
	if e.retryBacklog() {
		progressed = true
	}
	if p.resendRecords() {
		progressed = true
	}
	p.applyInvalidations()
	for i := 0; i < staging.LaneCount; i++ {
		if e.consume(i) {
			progressed = true
		}
	}
	for _, ol := range p.out {
		if e.publish(ol, now) {
			progressed = true
		}
	}
	if p.runFallbacks() {
		progressed = true
	}
	return progressed
}

func (p *pump) pollHop() bool {
	e := p.e
	progressed := false
	for {
		n := e.hop.Poll(p.polled[:])
		for _, c := range p.polled[:n] {
			if ent, ok := e.tokens.take(c.Token); ok {
				e.finishToken(ent, c.Err)
			}
		}
		if n > 0 {
			progressed = true
		}
		if n < len(p.polled) {
			return progressed
		}
	}
}

// sendRecord gives a relayed Piece's writes to the hop, as many as it takes.
func (p *pump) sendRecord(rec *inflightRec) {
	rec.sending = true
	if p.unsent.len() == 0 {
		rec.unsent = p.e.drainOps(rec.unsent)
	}
	if len(rec.unsent) > 0 {
		p.unsent.push(rec)
		return
	}
	rec.sending = false
	p.freeRec(rec)
}

// resendRecords retries the writes the hop could not take, oldest Piece
// first.
func (p *pump) resendRecords() bool {
	progressed := false
	for p.unsent.len() > 0 {
		rec := *p.unsent.front()
		before := len(rec.unsent)
		rec.unsent = p.e.drainOps(rec.unsent)
		if len(rec.unsent) != before {
			progressed = true
		}
		if len(rec.unsent) > 0 {
			break
		}
		p.unsent.pop()
		rec.sending = false
		p.freeRec(rec)
	}
	return progressed
}

// freeRec returns rec to the pool once every write has completed and the
// hop holds none of its unsent writes.
func (p *pump) freeRec(rec *inflightRec) {
	if rec.remaining == 0 && !rec.sending {
		p.recs.put(rec)
	}
}

// runFallbacks sends direct the Pieces that never reached a doorbell, each
// exactly once and only after its source-ready event.
func (p *pump) runFallbacks() bool {
	progressed := false
	for n := p.fallbackLen(); n > 0; n-- {
		fb := p.popFallback()
		keep, moved := p.runFallback(&fb)
		progressed = progressed || moved
		if keep {
			p.pushFallback(fb)
		}
	}
	return progressed
}

// runFallback moves one fallen-back Piece on: it reports whether the Piece
// still has work left and whether anything happened.
func (p *pump) runFallback(fb *fallbackPiece) (keep, progressed bool) {
	e := p.e
	if g := fb.g; g != nil {
		if g.ready != 0 {
			done, err := e.copier.Query(g.ready)
			if err != nil {
				e.counters.failedPieces.Add(1)
				g.finishPiece(fb.i, fmt.Errorf("source-ready event: %w", err))
				e.pieceDone(g)
				return false, true
			}
			if !done {
				return true, false
			}
		}
		// The writes carry their slices by value: the group is done with.
		ss := g.plan.PieceSlices(fb.i)
		ops := e.opBufs.get(len(ss))
		for _, sl := range ss {
			ops = append(ops, WriteOp{Src: uintptr(sl.Src), Len: sl.Len, Target: g.key.session, Dst: sl.Dst,
				Token: e.tokens.add(tokenEntry{kind: tokFallback, slice: taskSlice{batch: g.batch, task: g.tasks[sl.Task], len: sl.Len}})})
		}
		e.counters.fallbackBytes.Add(g.pieceLen(fb.i))
		e.counters.fallbackPieces.Add(1)
		e.pieceDone(g)
		fb.g, fb.ops, fb.unsent = nil, ops, ops
	}
	before := len(fb.unsent)
	fb.unsent = e.drainOps(fb.unsent)
	progressed = len(fb.unsent) != before
	if len(fb.unsent) > 0 {
		return true, progressed
	}
	e.opBufs.put(fb.ops)
	return false, progressed
}

// refreshPeers reconciles outbound lanes with the registry: new relays get a
// lane, stale ones stop taking tickets, gone ones fail what they had.
func (p *pump) refreshPeers() {
	e := p.e
	peers, err := e.reg.Peers()
	if err != nil {
		if errors.Is(err, ErrTooManyPeers) {
			if !p.peersOff {
				p.peersOff = true
				e.log.Info("more than 7 peers in the group; PXN off, sending direct", "err", err.Error())
			}
			e.pxn.Store(false)
			for _, ol := range p.out {
				p.retire(ol, errRelayGone)
			}
			p.out = nil
			e.routes.Store(&routeTable{})
			return
		}
		e.log.Error(err, "registry scan failed")
		return
	}
	if p.peersOff || p.noSend {
		return
	}
	changed := false
	now := time.Now()
	live := p.out[:0]
	for _, ol := range p.out {
		h := ol.link.Health(now)
		if h == Gone {
			p.retire(ol, errRelayGone)
			changed = true
			continue
		}
		if stale := h == Stale; stale != ol.stale.Load() {
			ol.stale.Store(stale)
			changed = true
		}
		if d := e.ticketTimeout(); ol.tx.InFlight() && now.Sub(ol.progressAt) > d {
			// The lane's claim stays with the zombie until the copier has
			// drained, and hasLane keeps it from being claimed anew
			// meanwhile: this relay gets no more tickets from us.
			e.log.Error(errTicketTimeout, "published tickets failed; relay not used again", "relayPid", ol.peer.Pid, "lane", ol.link.LaneIndex(), "seq", ol.tx.Reaped()+1, "timeout", d)
			e.counters.laneQuarantine.Add(1)
			p.retire(ol, fmt.Errorf("%w within %v", errTicketTimeout, d))
			changed = true
			continue
		}
		if ol.broken && !ol.tx.InFlight() {
			p.retire(ol, nil)
			changed = true
			continue
		}
		if ol.tx.Exhausted() && !ol.tx.InFlight() {
			// Sequence space spent and drained: a new claim gives the lane
			// a new epoch and restarts at seq 1.
			p.retire(ol, nil)
			changed = true
			continue
		}
		live = append(live, ol)
	}
	p.out = live
	for _, pr := range peers {
		if pr.Rail == e.localRail || pr.Rail == "" {
			continue
		}
		if p.hasLane(pr) {
			continue
		}
		link, err := e.reg.Attach(pr)
		if err != nil {
			e.log.V(1).Info("cannot attach to relay", "pid", pr.Pid, "rail", pr.Rail, "err", err.Error())
			continue
		}
		ol := newOutLane(pr, link)
		if s := e.hooks.firstSeq; s > 1 && !p.seqHooked {
			p.seqHooked = true
			if err := ol.tx.StartAt(s); err != nil {
				e.log.Error(err, "test hook firstSeq")
			}
		}
		if hr, ok := e.copier.(HostRegistrar); ok {
			unreg, err := hr.RegisterHost(ol.tx.Words())
			if err != nil {
				e.log.Error(err, "cannot register a relay's lane for doorbells", "pid", pr.Pid, "rail", pr.Rail)
				_ = link.Close()
				continue
			}
			ol.unreg = unreg
		}
		p.out = append(p.out, ol)
		changed = true
	}
	if changed {
		p.publishRoutes()
	}
}

// retire ends a lane: published Pieces fail with err (nil: the lane was
// drained), queued ones go direct. The claim and mappings are released now
// when nothing can still be copied into the relay's memory, or after the
// copier has drained otherwise.
func (p *pump) retire(ol *outLane, err error) {
	ol.gone.Store(true)
	inFlight := ol.tx.InFlight()
	if err != nil {
		p.e.failPublished(ol, err)
	}
	ol.drainTo(p)
	if inFlight {
		p.zombies = append(p.zombies, ol)
		return
	}
	p.release(ol)
}

func (p *pump) release(ol *outLane) {
	if ol.unreg != nil {
		if err := ol.unreg(); err != nil {
			p.e.log.Error(err, "unregistering a relay's lane", "relayPid", ol.peer.Pid)
		}
		ol.unreg = nil
	}
	if err := ol.link.Close(); err != nil {
		p.e.log.Error(err, "releasing lane", "relayPid", ol.peer.Pid)
	}
}

// copierFailed handles a copier that can no longer ring doorbells: every
// lane stops taking tickets and fails what it published.
func (p *pump) copierFailed(err error) {
	p.e.log.Error(err, "copier failed; outbound lanes quarantined")
	for _, ol := range p.out {
		p.e.counters.laneQuarantine.Add(1)
		ol.broken = true
		p.e.failPublished(ol, fmt.Errorf("first hop failed: %w", err))
		ol.drainTo(p)
	}
}

// releaseZombies runs after the copier has drained.
func (p *pump) releaseZombies() {
	for _, ol := range p.zombies {
		p.release(ol)
	}
	p.zombies = nil
}

func (p *pump) hasLane(pr Peer) bool {
	for _, ol := range p.out {
		if ol.peer.Pid == pr.Pid && ol.peer.Epoch == pr.Epoch {
			return true
		}
	}
	for _, ol := range p.zombies {
		if ol.peer.Pid == pr.Pid && ol.peer.Epoch == pr.Epoch {
			return true
		}
	}
	return false
}

// publishRoutes rebuilds the rail → lane table. A rail with more than one
// relay is not unique and routes direct.
func (p *pump) publishRoutes() {
	count := map[string]int{}
	for _, ol := range p.out {
		count[ol.peer.Rail]++
	}
	rt := &routeTable{byRail: map[string]*outLane{}}
	for _, ol := range p.out {
		if count[ol.peer.Rail] == 1 {
			rt.byRail[ol.peer.Rail] = ol
		}
	}
	p.e.routes.Store(rt)
}

// stop ends the pump: no new Pieces are taken, what is in flight drains
// until ctx's deadline (5 s without one), and whatever is left fails.
func (p *pump) stop(ctx context.Context) error {
	e := p.e
	e.pxn.Store(false)
	e.routes.Store(&routeTable{})
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Second)
	}
	p.drainBy.Store(deadline.UnixNano())
	if p.manual {
		p.finishStop()
		close(p.doneCh)
	}
	p.wake()
	<-p.doneCh
	if p.dead.Load() {
		return errors.New("relay: the pump had stopped after a panic")
	}
	return p.stopErr
}

// finishStop runs on the pump thread once the drain ends.
func (p *pump) finishStop() {
	e := p.e
	if p.busy() || e.tokens.len() > 0 {
		p.stopErr = errors.New("relay: shutdown drain timed out; unfinished work failed")
	}
	errShutdown := errors.New("engine closed before the transfer completed")
	for _, ol := range p.out {
		p.retire(ol, errShutdown)
	}
	p.out = nil
	p.fbMu.lock()
	fbs := p.fallbacks
	p.fallbacks = fifo[fallbackPiece]{}
	p.fbLen.Store(0)
	p.fbMu.unlock()
	for fbs.len() > 0 {
		fb := fbs.pop()
		e.counters.failedPieces.Add(1)
		if fb.g != nil {
			fb.g.finishPiece(fb.i, errShutdown)
			e.pieceDone(fb.g)
			continue
		}
		// Started: what the hop took ends through the token sweep
		// below, the rest fails here, each slice exactly once.
		e.failOps(fb.unsent, errShutdown)
	}
	for _, ent := range e.tokens.takeAll() {
		switch ent.kind {
		case tokDirect, tokFallback:
			ent.slice.finish(errShutdown)
		}
	}
}
