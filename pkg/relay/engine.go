// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/engineconfig"
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
	// ConfigRefused is how many of its configuration values the host
	// refused before opening the engine (each turns PXN off); the engine
	// counts them in CounterSnapshot.ConfigRefused.
	ConfigRefused int
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
func Open(cfg engineconfig.Config, deps Deps) (*Engine, error) {
	return open(cfg, deps, nil)
}

func open(cfg engineconfig.Config, deps Deps, h *hooks) (*Engine, error) {
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
			hooks:  h,

			batches:   newBatchPool(),
			groups:    newGroupPool(),
			opBufs:    newOpsPool(),
			fallbacks: fallbackQueue{mu: make(chanMutex, 1)},
			wakeWord:  new(staging.WakeWord),
		},
		reg:     deps.Registry,
		scratch: newScratchPool(),
	}
	e.pieceHop, _ = deps.Hop.(PieceHop)
	e.partCopier, _ = deps.Copier.(PartCopier)
	e.drainer, _ = deps.Copier.(CopyDrainer)
	e.counters.configRefused.Store(uint64(max(deps.ConfigRefused, 0)))
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
	if !e.manualPump() {
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
			e.applyCompletion(c, nil)
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
		e.pump.rly.stopResolvers()
	}
	// The copier drains before any relay memory is unmapped: a retired
	// lane may still have copies or doorbells queued into it. A copier
	// whose Close gave up on a lane that never drained (a wedged GPU
	// stream) may still write the lanes' mappings: they, the claims and
	// the registration then stay until the process exits.
	if e.copier != nil {
		cerr := e.copier.Close()
		err = errors.Join(err, cerr)
		if lane, stuck := undrained(e.copier); cerr != nil && stuck {
			e.log.Error(cerr, "the first hop did not drain: the engine keeps its lanes' claims and mappings and its registration until the process exits", "lane", lane)
			e.closed.Store(true)
			return err
		}
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

// undrained is the first copier lane of c that has not drained, if c can
// tell.
func undrained(c Copier) (int, bool) {
	d, ok := c.(CopyDrainer)
	if !ok {
		return 0, false
	}
	for lane := range staging.LaneCount {
		if !d.Drained(lane) {
			return lane, true
		}
	}
	return 0, false
}
