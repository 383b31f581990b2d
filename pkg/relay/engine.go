// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/staging"
)

// Deps are what an engine is built from.
type Deps struct {
	// Hop carries direct traffic and the relay's second hop. Required.
	Hop Hop
	// Directory resolves target sessions. Required when PXN is enabled.
	Directory Directory
	// Copier moves the first hop. Required when PXN is enabled.
	Copier Copier
	// Registry is this rank's registration; nil turns PXN off.
	Registry Registry
	// LocalHCA is the raw name of the one HCA this process uses.
	LocalHCA string
	// Logger receives the engine's few log lines; defaults to klog.
	Logger klog.Logger
}

// Engine routes a host's transfers: cross-rail device writes through a relay
// on the target's rail, everything else straight to the hop. Its methods run
// on the callers' goroutines and reach the pump only through what shared
// holds (queues, atomics, the wake word); the pump's sender and relayer
// are its own.
type Engine struct {
	*shared
	reg     Registry
	scratch *scratchPool

	// pollMu serializes Hop.Poll and the progress made from its results
	// when no pump runs.
	pollMu sync.Mutex

	pump *pump
	// submitMu makes Close wait for Submits in progress: after Close sets
	// closing, no Piece is enqueued behind the pump's back.
	submitMu sync.RWMutex
	closing  atomic.Bool
	closed   atomic.Bool
}

// routeTable maps a canonical rail to the outbound lane of the one relay on
// it. The pump replaces it; Submit reads it.
type routeTable struct {
	byRail map[string]*outLane
}

// Open builds an engine. With cfg.Enable false, or without a registry, it is
// a pass-through to the hop: no pump, no shared memory, no extra goroutine.
func Open(cfg staging.Config, deps Deps) (*Engine, error) {
	return open(cfg, deps, testHooks{})
}

func open(cfg staging.Config, deps Deps, hooks testHooks) (*Engine, error) {
	if deps.Hop == nil {
		return nil, errors.New("relay: a hop is required")
	}
	log := deps.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	e := &Engine{
		shared: &shared{
			cfg:    cfg,
			hop:    deps.Hop,
			dir:    deps.Directory,
			copier: deps.Copier,
			log:    log,
			hooks:  hooks,

			batches:   newBatchPool(),
			groups:    newGroupPool(),
			opBufs:    newOpsPool(),
			fallbacks: fallbackQueue{mu: make(chanMutex, 1)},
			wakeWord:  new(staging.WakeWord),
		},
		reg:     deps.Registry,
		scratch: newScratchPool(),
	}
	e.routes.Store(&routeTable{})
	if !cfg.Enable || deps.Registry == nil {
		return e, nil
	}
	if deps.Directory == nil || deps.Copier == nil {
		return nil, errors.New("relay: PXN needs a directory and a copier")
	}
	if deps.LocalHCA == "" {
		return nil, errors.New("relay: PXN needs the local HCA name")
	}
	e.localRail = staging.CanonicalRail(cfg.RailMap, deps.LocalHCA)
	if w := deps.Registry.Wake(); w != nil {
		e.wakeWord = w
	}
	e.pump = newPump(e.shared, deps.Registry)
	e.pxn.Store(true)
	if !hooks.manualPump {
		e.pump.start()
	}
	return e, nil
}

// Counters returns a snapshot of the engine's counters.
func (e *Engine) Counters() CounterSnapshot { return e.counters.snapshot() }

// PXNActive reports whether cross-rail writes may currently take the PXN path.
func (e *Engine) PXNActive() bool { return e.pxn.Load() }

// LocalRail is the canonical rail of this process's HCA ("" without PXN).
func (e *Engine) LocalRail() string { return e.localRail }

// ErrClosed is returned by calls on a closed engine.
var ErrClosed = errors.New("relay: engine closed")

// Submit starts every request of reqs and returns their batch. It only
// classifies, copies request metadata, creates the completion counters and
// enqueues; it never waits for credit or for a copy. In steady state it
// allocates nothing when the caller releases its batches.
//
// A long batch is taken in chunks (submitChunk): the first Pieces move
// while Submit is still planning the rest, so a request of many blocks
// does not wait for all of them to be planned (about 100 ns a block) before
// its first byte moves.
func (e *Engine) Submit(reqs []Request) (*Batch, error) {
	e.submitMu.RLock()
	defer e.submitMu.RUnlock()
	if e.closing.Load() {
		return nil, ErrClosed
	}
	b := e.batches.get(len(reqs))
	sc := e.scratch.get()
	defer e.scratch.put(sc)
	routes := e.routes.Load()
	var at uint64
	for lo, limit := 0, uint64(firstChunkBytes); lo < len(reqs); limit = min(2*limit, maxChunkBytes) {
		hi, n := chunkEnd(reqs, lo, at, limit)
		e.submitChunk(b, reqs, lo, hi, routes, sc)
		lo, at = hi, at+n
	}
	return b, nil
}

// Chunks of a long Submit: the first holds about one slot, each next
// twice the one before, up to maxChunkBytes, whose planning (a few hundred
// microseconds) stays well ahead of the Pieces already moving.
const (
	firstChunkBytes = staging.SlotSize
	maxChunkBytes   = 8 * staging.SlotSize
)

// chunkEnd is where the chunk that starts at request lo ends: after the
// first request that brings it to limit bytes and leaves the batch's bytes
// so far (at, before lo) a whole number of slots, so that a batch of one
// group is cut where its Pieces would end anyway and chunking changes no
// Piece; len(reqs) when there is no such request. n is the chunk's bytes.
func chunkEnd(reqs []Request, lo int, at, limit uint64) (end int, n uint64) {
	for i := lo; i < len(reqs); i++ {
		n += reqs[i].Len
		if n >= limit && (at+n)%staging.SlotSize == 0 {
			return i + 1, n
		}
	}
	return len(reqs), n
}

// submitChunk classifies requests lo..hi of b, plans their PXN groups,
// hands direct ones to the hop and queues the Pieces. sc's caches (the
// source allocation, the target's lane) carry over from chunk to chunk;
// its groups are the chunk's own.
func (e *Engine) submitChunk(b *Batch, reqs []Request, lo, hi int, routes *routeTable, sc *submitScratch) {
	began := unixNow()
	sc.resetGroups()
	for i := lo; i < hi; i++ {
		r := &reqs[i]
		if r.Len == 0 {
			continue
		}
		ol := e.classify(r, routes, sc)
		if ol == nil {
			sc.direct = append(sc.direct, int32(i))
			continue
		}
		k := groupKey{lane: ol, session: r.Target, stream: r.Stream}
		g := sc.last
		if g == nil || g.key != k {
			if g = sc.groups[k]; g == nil {
				g = e.groups.get()
				g.key, g.batch, g.submitted = k, b, began
				sc.groups[k] = g
				sc.order = append(sc.order, g)
			}
			sc.last = g
		}
		g.tasks = append(g.tasks, int32(i))
	}

	// Plan every PXN group and count every slice before anything is
	// enqueued or submitted.
	planned := sc.order[:0]
	for _, g := range sc.order {
		if err := e.planGroup(b, reqs, g); err != nil {
			// A request the planner refuses is sent direct instead.
			sc.direct = append(sc.direct, g.tasks...)
			e.groups.put(g)
			continue
		}
		planned = append(planned, g)
	}
	for _, i := range sc.direct {
		b.tasks[i].route = RouteDirect
		b.tasks[i].remaining.Store(1)
	}

	e.submitDirect(b, reqs, sc.direct)
	for _, g := range planned {
		// Once a Piece is queued the pump may finish the group and reuse
		// it: nothing below reads g after handing it over.
		n := len(g.plan.Pieces)
		g.pending.Store(int32(n))
		ready, err := e.copier.RecordReady(g.key.stream)
		if err != nil {
			// Without a source-ready event the data cannot be staged safely:
			// the group goes direct, and the direct path waits for nothing
			// but the caller's own ordering.
			e.log.Error(err, "source-ready event failed; sending direct", "target", g.key.session)
			g.ready = 0
			for i := range n {
				e.fallback(g, i, staging.FallbackSourceEvent)
			}
			continue
		}
		g.ready = ready
		if !g.key.lane.enqueue(g) {
			for i := range n {
				e.fallback(g, i, staging.FallbackNoLane)
			}
		}
	}
	if len(planned) > 0 {
		e.wake()
	}
}

type groupKey struct {
	lane    *outLane
	session string
	stream  uintptr
}

// classify returns the outbound lane a request goes through, or nil for the
// direct path.
func (e *Engine) classify(r *Request, routes *routeTable, sc *submitScratch) *outLane {
	if !e.pxn.Load() || r.Op != Write || len(routes.byRail) == 0 {
		return nil
	}
	if !e.onDevice(r.Src, r.Len, sc) {
		return nil
	}
	if end := r.Dst + r.Len; sc.toLane != nil && r.Target == sc.toSession && r.Dst >= sc.toLo && end >= r.Dst && end <= sc.toHi {
		if !sc.toLane.accepting() {
			return nil
		}
		return sc.toLane
	}
	t, err := e.dir.Resolve(r.Target, r.Dst)
	if err != nil || len(t.HCAs) != 1 {
		return nil
	}
	rail := staging.CanonicalRail(e.cfg.RailMap, t.HCAs[0])
	if rail == e.localRail {
		return nil
	}
	ol := routes.byRail[rail]
	if ol == nil || !ol.accepting() {
		return nil
	}
	for _, rg := range t.Ranges {
		if end := r.Dst + r.Len; r.Dst >= rg.Addr && end >= r.Dst && end <= rg.Addr+rg.Len && rg.Addr+rg.Len >= rg.Addr {
			sc.toSession, sc.toLo, sc.toHi, sc.toLane = r.Target, rg.Addr, rg.Addr+rg.Len, ol
			break
		}
	}
	return ol
}

// onDevice reports whether addr..addr+n is device memory, asking the copier
// only outside the device allocation it last reported in this Submit.
func (e *Engine) onDevice(addr uintptr, n uint64, sc *submitScratch) bool {
	if end := addr + uintptr(n); sc.devHi != 0 && addr >= sc.devLo && end >= addr && end <= sc.devHi {
		return true
	}
	rc, ok := e.copier.(RangeClassifier)
	if !ok {
		return e.copier.Classify(addr, n) == Device
	}
	k, start, size := rc.ClassifyRange(addr, n)
	if k != Device {
		return false
	}
	if end := start + uintptr(size); size > 0 && end > start && start <= addr && addr+uintptr(n) <= end {
		sc.devLo, sc.devHi = start, end
	}
	return true
}

// submitDirect hands direct tasks to the hop; what the hop cannot take now
// waits in the backlog, retried by the pump or by Progress.
func (e *Engine) submitDirect(b *Batch, reqs []Request, idx []int32) {
	if len(idx) == 0 {
		return
	}
	ops := e.opBufs.get(len(idx))
	for _, i := range idx {
		r := &reqs[i]
		ops = append(ops, WriteOp{
			Src: r.Src, Len: r.Len, Target: r.Target, Dst: r.Dst, Read: r.Op == Read,
			Token: e.tokens.add(tokenEntry{kind: tokDirect, slice: taskSlice{batch: b, task: i, len: r.Len}}),
		})
		e.counters.directBytes.Add(r.Len)
	}
	e.backlogMu.Lock()
	rest := ops
	if len(e.backlog) == 0 {
		rest = e.drainOps(ops, nil)
	}
	e.backlog = append(e.backlog, rest...)
	e.backlogMu.Unlock()
	e.opBufs.put(ops)
	e.wake()
}

// Progress polls the hop and retries busy direct writes. The pump does this
// on its own when PXN runs; without a pump the host calls Progress (Status
// callers of the C ABI do it for them).
func (e *Engine) Progress() {
	if e.pump != nil && !e.pumpDead.Load() {
		return
	}
	e.pollMu.Lock()
	defer e.pollMu.Unlock()
	e.retryBacklog()
	var buf [64]HopCompletion
	for {
		n := e.hop.Poll(buf[:])
		for _, c := range buf[:n] {
			if ent, ok := e.tokens.take(c.Token); ok {
				e.finishToken(ent, c.Err, nil)
			}
		}
		if n < len(buf) {
			return
		}
	}
}

// Close stops the engine: no new submits, a bounded drain of what is in
// flight, then the pump stops and the registration is withdrawn. Every task
// ends in a final state: what could not drain fails.
func (e *Engine) Close(ctx context.Context) error {
	e.submitMu.Lock()
	first := e.closing.CompareAndSwap(false, true)
	e.submitMu.Unlock()
	if !first {
		return nil
	}
	var err error
	var stopped stopResult
	if e.pump != nil {
		// Senders stop publishing to this rank and release their lanes
		// while the pump still serves what they published.
		e.reg.BeginClose()
		stopped = e.pump.stop(ctx)
		err = stopped.err
	}
	// The copier drains before any relay memory is unmapped: a retired
	// lane may still have copies or doorbells queued into it.
	if e.copier != nil {
		err = errors.Join(err, e.copier.Close())
	}
	stopped.release(e.log)
	if e.reg != nil {
		err = errors.Join(err, e.reg.Close(ctx))
	}
	e.closed.Store(true)
	return err
}

// InvalidateTarget drops the relay's cached route to session ("" drops
// every route), so that the next Piece for it is resolved through the
// directory again. Hosts call it when a target's registration changes; a
// second-hop failure, or a Piece whose destination lies outside the cached
// ranges, drops a route without it. It takes effect at the pump's next
// round.
func (e *Engine) InvalidateTarget(session string) {
	e.invals.add(session)
	e.wake()
}

// HasRelay reports whether cross-rail writes to rail currently have a relay.
func (e *Engine) HasRelay(rail string) bool {
	ol := e.routes.Load().byRail[rail]
	return ol != nil && ol.accepting()
}

// PumpThreadID is the OS thread id of the pump (0 without one), so that
// benchmarks and operators can read its CPU time from /proc.
func (e *Engine) PumpThreadID() int {
	if e.pump == nil {
		return 0
	}
	return int(e.pumpTID.Load())
}
