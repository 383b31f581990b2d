// SPDX-License-Identifier: Apache-2.0

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

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/staging"
)

const (
	// heartbeatInterval is how often a pump with work writes its
	// heartbeat. An idle pump's only timed wake-up is its heartbeat,
	// every fifth of the heartbeat timeout (idleBeat).
	heartbeatInterval = 100 * time.Millisecond
	// idleRefresh is how often an idle pump lists its peers (a registry
	// scan, the costliest part of an idle wake-up); a pump with work
	// queued or in flight lists them every heartbeatInterval. The lanes'
	// relays are checked every heartbeatInterval (at every wake-up of an
	// idle pump), before publishing, so no ticket goes to a relay on a
	// view older than that, and a closing relay gets its lanes back
	// without waiting for a scan.
	idleRefresh = time.Second
	// expectFor bounds how long an inbound lane whose sender announced a
	// ticket keeps the relay polling without any progress: a sender that
	// publishes and never rings would otherwise keep it from going idle.
	expectFor = heartbeatInterval
	// timerSlack is the pump thread's timer slack: its naps are tens of
	// microseconds, and the default slack (50 µs) would double them.
	timerSlack = time.Microsecond
)

// DefaultPollPolicy is how the pump waits when the copier sets no policy:
// host-path copiers, whose Pieces take milliseconds.
var DefaultPollPolicy = PollPolicy{Spin: 20 * time.Microsecond, Nap: 50 * time.Microsecond, TimerNap: true}

// pump is the engine's one thread: it holds the sender and the relayer and
// drives both in rounds. Its fields, and everything the sender and the
// relayer hold, are touched only by the goroutine that runs the rounds;
// callers reach the pump through the shared queues, the wake word and
// drainBy.
type pump struct {
	s   *shared
	reg Registry
	snd *sender
	rly *relayer

	// done carries the pump's last word once its goroutine has finished.
	done chan stopResult
	// drainBy is when Close's drain ends (UnixNano; 0 while running).
	drainBy atomic.Int64

	lastBeat  time.Time
	lastCheck time.Time
	lastList  time.Time
	// lastActive is the last round that made progress or the last wake
	// by a waker: the spin window runs from it.
	lastActive time.Time
	polled     [64]HopCompletion
	poller     CopyPoller
	poll       PollPolicy

	// leaseAt is when the drain last asked the registry whether a sender
	// still holds an inbound lane, and leasedNow its answer.
	leaseAt   time.Time
	leasedNow bool

	// stats publishes the counters with each heartbeat (nil when the
	// registry has no counters block); statsBuf is what the pump fills.
	stats    StatsPublisher
	statsBuf staging.RankStats
}

// stopResult is what a stopped pump hands back: why the drain ended badly,
// and the retired lanes whose release waits for the copier to drain.
type stopResult struct {
	err     error
	zombies []*senderLane
}

// release frees the zombies' claims; call it after the copier drained.
func (r stopResult) release(log klog.Logger) {
	for _, sl := range r.zombies {
		sl.release(log)
	}
}

func newPump(s *shared, reg Registry) *pump {
	poller, _ := s.copier.(CopyPoller)
	poll := DefaultPollPolicy
	if t, ok := s.copier.(PollTuner); ok {
		poll = t.PollPolicy()
	}
	stats, _ := reg.(StatsPublisher)
	return &pump{
		s:      s,
		reg:    reg,
		snd:    &sender{s: s, reg: reg},
		rly:    newRelayer(s, reg),
		done:   make(chan stopResult, 1),
		poll:   poll,
		poller: poller,
		stats:  stats,
	}
}

func (p *pump) start() {
	if h := p.s.hooks; h != nil && h.goStarted != nil {
		h.goStarted()
	}
	go p.run()
}

// run drives the rounds. The goroutine keeps its OS thread to the end (the
// thread dies with it): the copier's context and the timer slack are set on
// that thread only.
func (p *pump) run() {
	runtime.LockOSThread()
	p.s.pumpTID.Store(int64(unix.Gettid()))
	if err := staging.SetTimerSlack(timerSlack); err != nil {
		p.s.log.V(1).Info("pump keeps the default timer slack", "err", err)
	}
	if b, ok := p.s.copier.(ThreadBinder); ok {
		if err := b.BindThread(); err != nil {
			p.s.log.Error(err, "pump cannot use the copier; PXN off for sending, relaying goes on")
			p.s.pxn.Store(false)
			p.snd.noSend = true
		}
	}
	var res stopResult
	defer func() { p.done <- res }()
	defer func() {
		if r := recover(); r != nil {
			res = p.panicked(r)
		}
	}()
	p.lastActive = time.Now()
	for {
		now := time.Now()
		if by := p.drainBy.Load(); by != 0 {
			if now.UnixNano() > by || (!p.busy() && !p.leased(now)) {
				res = p.finishStop()
				return
			}
		}
		if p.round(now) {
			p.lastActive = now
			continue
		}
		if now.Sub(p.lastActive) < p.poll.Spin && p.shallow() {
			continue
		}
		p.wait()
	}
}

// wait sleeps on the wake word: with no timer but the heartbeat's when
// nothing is in flight or expected, at most a nap otherwise. It announces
// the sleep and then runs one more round (the waiter's re-check of the
// word's rule): work a waker published before the announcement is found
// there, work published after it comes with a wake.
func (p *pump) wait() {
	w := p.s.wakeWord
	seen := w.Announce()
	now := time.Now()
	if p.round(now) {
		w.Retract()
		p.lastActive = now
		return
	}
	timeout := p.idleBeat() - now.Sub(p.lastBeat)
	if p.snd.attachPending {
		timeout = min(timeout, heartbeatInterval)
	}
	if p.busy() || p.expecting(now) || p.drainBy.Load() != 0 {
		if p.poll.TimerNap {
			w.Retract()
			p.s.counters.pumpSleeps.Add(1)
			time.Sleep(p.poll.Nap)
			return
		}
		timeout = min(timeout, p.poll.Nap)
	}
	if timeout <= 0 {
		w.Retract()
		return
	}
	p.s.counters.pumpSleeps.Add(1)
	if w.Sleep(seen, timeout) {
		p.s.counters.pumpWakes.Add(1)
		p.lastActive = time.Now()
	}
}

// idleBeat is the heartbeat interval of an idle pump: a fifth of the
// heartbeat timeout (600 ms by default), so that a peer sees five beats
// before it judges the rank stale, never less than heartbeatInterval. A
// wake-up costs the pump thread 100–300 µs of CPU on the machines
// measured, so ten a second alone would be 0.1–0.3 % of a core.
func (p *pump) idleBeat() time.Duration {
	return max(heartbeatInterval, p.s.cfg.HeartbeatTimeout/5)
}

// shallow reports whether at most one slot's worth of bytes is moving
// through this rank, either way (a sender's Pieces published and not
// reaped, a relay's in their second hop or announced): a transfer bound by
// latency, whose next step is microseconds away, so the pump polls through
// the spin window instead of sleeping. One full Piece is such a transfer,
// and so is a short request cut into the planner's ramp of small Pieces.
// With more in flight the rings' depth hides a nap.
func (p *pump) shallow() bool {
	const limit = staging.SlotSize
	n := p.rly.inflightBytes
	if n > limit {
		return false
	}
	if n += p.snd.inflightBytes(limit - n); n > limit {
		return false
	}
	return n+p.rly.announcedBytes(limit-n) <= limit
}

// expecting reports whether a sender announced a ticket this relay has not
// taken yet (its GPU doorbell may still be on the way), within expectFor
// of the pump's last progress.
func (p *pump) expecting(now time.Time) bool {
	return now.Sub(p.lastActive) <= expectFor && p.rly.announced() > 0
}

// panicked keeps a bug in the pump from ending the host process: PXN
// turns off, everything the pump owned fails, and direct traffic goes on
// through Progress.
func (p *pump) panicked(r any) stopResult {
	s := p.s
	s.log.Error(fmt.Errorf("%v", r), "pump panicked; PXN off, sending direct", "stack", string(debug.Stack()))
	s.pxn.Store(false)
	s.routes.Store(&routeTable{})
	s.pumpDead.Store(true)
	res := stopResult{err: errors.New("relay: the pump had stopped after a panic")}
	func() {
		defer func() { _ = recover() }()
		res.zombies = p.finishStop().zombies
	}()
	return res
}

// busy reports whether anything is in flight or queued on either side.
func (p *pump) busy() bool {
	return p.rly.inflight > 0 || p.rly.parked > 0 || p.s.fallbacks.len() > 0 || p.s.tokens.len() > 0 || p.snd.busy()
}

// releaseGrace is the most of Close's time kept after the drain for the
// senders to release their lanes (a quarter of it when that is less).
const releaseGrace = 500 * time.Millisecond

// leaseCheckEvery spaces a draining pump's lease checks, which read /proc.
const leaseCheckEvery = 5 * time.Millisecond

// leased reports whether a live sender still holds an inbound lane; the
// drain serves their tickets until none does.
func (p *pump) leased(now time.Time) bool {
	if now.Sub(p.leaseAt) >= leaseCheckEvery {
		p.leaseAt, p.leasedNow = now, p.reg.Leased()
	}
	return p.leasedNow
}

// round is one pass of the fixed order: heartbeat and lane health,
// outbound reaps, inbound reaps, inbound tickets, outbound tickets,
// fallbacks, peer listing.
func (p *pump) round(now time.Time) bool {
	progressed := false
	p.rly.now = now
	if now.Sub(p.lastBeat) >= heartbeatInterval {
		p.lastBeat = now
		p.reg.Heartbeat(now)
		p.publishStats()
		p.rly.checkSenders()
	}
	if now.Sub(p.lastCheck) >= heartbeatInterval || p.snd.recheck {
		p.lastCheck = now
		p.snd.recheck = false
		p.snd.checkLanes()
	}
	since := now.Sub(p.lastList)
	list := since >= idleRefresh || since >= heartbeatInterval && (p.busy() || p.snd.attachPending)
	if p.poller != nil {
		if n, err := p.poller.Poll(); err != nil {
			p.snd.copierFailed(err)
			progressed = true
		} else if n > 0 {
			progressed = true
		}
	}
	if p.snd.reapAll(now) {
		progressed = true
	}
	if p.pollHop() {
		progressed = true
	}
	if p.s.retryBacklog() {
		progressed = true
	}
	if p.rly.landParts() {
		progressed = true
	}
	if p.rly.resendRecords() {
		progressed = true
	}
	p.rly.applyInvalidations()
	if p.rly.consumeAll() {
		progressed = true
	}
	if p.snd.publishAll(now) {
		progressed = true
	}
	if p.snd.runFallbacks() {
		progressed = true
	}
	if list {
		// Last in the round: the first Piece after a quiet spell is
		// published before the scan, on lanes checkLanes has just read.
		p.lastList = now
		p.snd.listPeers()
	}
	return progressed
}

// publishStats hands the counters, the lanes held and the pump thread's
// CPU time to the registry. It runs on the pump's goroutine, which keeps
// its OS thread: the thread's CPU clock is the pump's.
func (p *pump) publishStats() {
	if p.stats == nil {
		return
	}
	st := &p.statsBuf
	p.s.counters.fill(st)
	st.OutboundLanes = uint32(len(p.snd.lanes) + len(p.snd.zombies))
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) == nil {
		st.PumpCPUNanos = uint64(ts.Nano())
	}
	p.stats.PublishStats(st)
}

func (p *pump) pollHop() bool {
	s := p.s
	progressed := false
	for {
		n := s.hop.Poll(p.polled[:])
		for _, c := range p.polled[:n] {
			s.applyCompletion(c, p.rly)
		}
		if n > 0 {
			progressed = true
		}
		if n < len(p.polled) {
			return progressed
		}
	}
}

// stop ends the pump: no new Pieces are taken, what is in flight drains
// until shortly before ctx's deadline (5 s without one), and whatever is
// left fails. The relayer keeps serving inbound tickets until no sender
// holds a lane (the registry marked the rank closing first, so they publish
// no more). It runs on the caller's goroutine and reaches the pump only
// through drainBy, the wake word and done.
func (p *pump) stop(ctx context.Context) stopResult {
	s := p.s
	s.pxn.Store(false)
	s.routes.Store(&routeTable{})
	now := time.Now()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = now.Add(5 * time.Second)
	}
	// The last part of the time is the senders': the tickets still
	// published when the drain ends fail then, and they need a refresh or
	// two to see it and give their lanes back before the registry's close
	// gives up on them.
	deadline = deadline.Add(-min(releaseGrace, max(deadline.Sub(now), 0)/4))
	p.drainBy.Store(deadline.UnixNano())
	if p.s.manualPump() {
		// The caller is the goroutine that runs the rounds.
		return p.finishStop()
	}
	s.wake()
	return <-p.done
}

// finishStop runs on the pump's goroutine once the drain ends.
func (p *pump) finishStop() stopResult {
	s := p.s
	var res stopResult
	if p.busy() {
		res.err = errors.New("relay: shutdown drain timed out; unfinished work failed")
	}
	errShutdown := errors.New("engine closed before the transfer completed")
	res.zombies = p.snd.stop(errShutdown)
	fbs := s.fallbacks.takeAll()
	for fbs.len() > 0 {
		fb := fbs.pop()
		s.counters.failedPieces.Add(1)
		if fb.g != nil {
			fb.g.finishPiece(fb.i, errShutdown)
			s.pieceDone(fb.g)
			continue
		}
		// Started: what the hop took ends through the token sweep
		// below, the rest fails here, each slice exactly once.
		s.failOps(fb.unsent, errShutdown, nil)
	}
	for _, ent := range s.tokens.takeAll() {
		switch ent.kind {
		case tokDirect, tokFallback:
			ent.slice.finish(errShutdown)
		case tokRelay:
			p.rly.finishWrite(ent.rec, errRelayClosing)
		}
	}
	p.rly.stopAllWaiting(errRelayClosing)
	p.rly.failParked(staging.CompletionRelayClosing)
	p.rly.failWaiting()
	p.publishStats()
	return res
}
