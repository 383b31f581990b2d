// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"sync/atomic"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/staging"
)

// group is the requests of one Submit that go to one relay lane for one
// target session and caller stream: their plan, cut into Pieces, and the
// source-ready event they share. It comes from the engine's pool and goes
// back once every Piece is finished or handed to the hop as direct writes.
type group struct {
	key   groupKey
	batch *Batch
	// blocks are the group's requests; a block's Task is the request's
	// task index in the batch.
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
	// reaps is the lane's reap count when the group was queued: the group
	// joins a slot (sender.join) only once the lane has completed a Piece
	// since.
	reaps uint64
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
	it := g.plan.PieceSlices(g.blocks, i)
	for s, ok := it.Next(); ok; s, ok = it.Next() {
		g.batch.finishSlice(s.Task, s.Len, s.Whole, err)
	}
}

// pieceEntries is the number of slices (plan entries) of Piece i.
func (g *group) pieceEntries(i int) int {
	pc := &g.plan.Pieces[i]
	return pc.End - pc.Start
}

// planGroup cuts a group's blocks into Pieces and counts, on top of the
// one slice each task was given when it joined the group, the Pieces that
// begin inside its block. The planner's ramp applies when the group's lane
// has no Piece queued, in flight or being planned: behind other Pieces a
// small first Piece would start no sooner, and only add Pieces. Nothing is
// enqueued here; the group's Pieces count on the lane from now on.
func (e *Engine) planGroup(b *Batch, g *group) error {
	var pl staging.Planner
	if g.key.lane.pieces.Load() == 0 {
		pl.FirstPiece = e.cfg.FirstPiece
	}
	if err := pl.Plan(g.blocks, len(b.tasks), &g.plan); err != nil {
		return err
	}
	g.key.lane.pieces.Add(int64(len(g.plan.Pieces)))
	for k := range g.plan.Splits(g.blocks) {
		b.remaining[g.blocks[k].Task]++
	}
	return nil
}

// Submit starts every request of reqs and returns their batch. It only
// classifies, copies request metadata, creates the completion counters and
// enqueues; it never waits for credit or for a copy. In steady state it
// allocates nothing when the caller releases its batches.
//
// A long batch is taken in chunks (submitChunk): the first Pieces move
// while Submit is still planning the rest, so a request of many blocks
// does not wait for all of them to be planned (tens of ns a block) before
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
		hi, n := e.submitChunk(b, reqs, lo, at, limit, routes, sc)
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

// submitChunk classifies the chunk of b's requests that starts at lo,
// plans its PXN groups, hands direct ones to the hop and queues the Pieces,
// and returns where the chunk ends and its bytes. The chunk ends after the
// first request that brings it to limit bytes and leaves the batch's bytes
// so far (at, before lo) a whole number of slots, so that a batch of one
// group is cut where its Pieces would end anyway and chunking changes no
// Piece; at len(reqs) when there is no such request. sc's caches (the
// source allocation, the target's lane) carry over from chunk to chunk;
// its groups are the chunk's own.
func (e *Engine) submitChunk(b *Batch, reqs []Request, lo int, at, limit uint64, routes *routeTable, sc *submitScratch) (end int, n uint64) {
	began := e.sentTimes.now()
	sc.resetGroups()
	pxn := e.pxn.Load() && len(routes.byRail) > 0
	end = len(reqs)
	for i := lo; i < len(reqs); i++ {
		r := &reqs[i]
		n += r.Len
		if r.Len != 0 {
			var ol *outLane
			switch {
			case !pxn:
			case r.Op == Write && sc.onLastDevice(r) && sc.inLastTarget(r) && sc.toLane.accepting():
				// classify's answer for a write like the one before it,
				// without the call.
				ol = sc.toLane
			default:
				ol = e.classify(r, routes, sc)
			}
			if ol == nil {
				sc.direct = append(sc.direct, int32(i))
			} else {
				g := sc.last
				if g == nil || g.key.lane != ol || g.key.stream != r.Stream || !sameString(g.key.session, r.Target) {
					g = e.groupFor(b, sc, groupKey{lane: ol, session: r.Target, stream: r.Stream}, began)
				}
				g.blocks = append(g.blocks, staging.Block{Src: uint64(r.Src), Dst: r.Dst, Len: r.Len, Task: i})
				t := &b.tasks[i]
				t.route, t.length = RoutePXN, r.Len
				b.remaining[i] = 1
			}
		}
		if n >= limit && (at+n)%staging.SlotSize == 0 {
			end = i + 1
			break
		}
	}

	// Plan every PXN group and count every slice before anything is
	// enqueued or submitted.
	planned := sc.order[:0]
	for _, g := range sc.order {
		if err := e.planGroup(b, g); err != nil {
			// A request the planner refuses is sent direct instead.
			for _, bl := range g.blocks {
				sc.direct = append(sc.direct, int32(bl.Task))
			}
			e.groups.put(g)
			continue
		}
		planned = append(planned, g)
	}
	for _, i := range sc.direct {
		b.tasks[i].route, b.tasks[i].length = RouteDirect, reqs[i].Len
		b.remaining[i] = 1
	}

	e.submitDirect(b, reqs, sc.direct)
	for _, g := range planned {
		// Once a Piece is queued the pump may finish the group and reuse
		// it: nothing below reads g after handing it over.
		pieces := len(g.plan.Pieces)
		g.pending.Store(int32(pieces))
		ready, err := e.copier.RecordReady(g.key.stream)
		if err != nil {
			// Without a source-ready event the data cannot be staged safely:
			// the group goes direct, and the direct path waits for nothing
			// but the caller's own ordering.
			e.log.Error(err, "source-ready event failed; sending direct", "target", g.key.session)
			g.ready = 0
			for i := range pieces {
				e.fallback(g, i, staging.FallbackSourceEvent)
			}
			continue
		}
		g.ready = ready
		if !g.key.lane.enqueue(g) {
			for i := range pieces {
				e.fallback(g, i, staging.FallbackNoLane)
			}
		}
	}
	if len(planned) > 0 {
		e.wake()
	}
	return end, n
}

type groupKey struct {
	lane    *outLane
	session string
	stream  uintptr
}

// groupFor returns the chunk's group for k, and makes it the one the next
// request tries first.
func (e *Engine) groupFor(b *Batch, sc *submitScratch, k groupKey, began int64) *group {
	g := sc.groups[k]
	if g == nil {
		g = e.groups.get()
		g.key, g.batch, g.submitted = k, b, began
		sc.groups[k] = g
		sc.order = append(sc.order, g)
	}
	sc.last = g
	return g
}

// sameString reports whether a and b are equal. Callers pass the same
// session string request after request, so comparing the string headers
// first spares the byte comparison almost always.
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}

// classify returns the outbound lane a request goes through, or nil for the
// direct path. The caller has checked that the PXN path is on and that
// routes has a lane.
func (e *Engine) classify(r *Request, routes *routeTable, sc *submitScratch) *outLane {
	if r.Op != Write || !sc.onLastDevice(r) && !e.onDevice(r.Src, r.Len, sc) {
		return nil
	}
	if sc.inLastTarget(r) {
		if !sc.toLane.accepting() {
			return nil
		}
		return sc.toLane
	}
	return e.resolve(r, routes, sc)
}

// onLastDevice reports whether r's source lies in the device allocation
// last reported in this Submit.
func (sc *submitScratch) onLastDevice(r *Request) bool {
	end := r.Src + uintptr(r.Len)
	return sc.devHi != 0 && r.Src >= sc.devLo && end >= r.Src && end <= sc.devHi
}

// inLastTarget reports whether r's destination lies in the target range
// last resolved in this Submit.
func (sc *submitScratch) inLastTarget(r *Request) bool {
	end := r.Dst + r.Len
	return sc.toLane != nil && r.Dst >= sc.toLo && end >= r.Dst && end <= sc.toHi && sameString(r.Target, sc.toSession)
}

// resolve classifies a request outside the target range last resolved,
// asking the directory, and remembers the range it falls in.
func (e *Engine) resolve(r *Request, routes *routeTable, sc *submitScratch) *outLane {
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
// (the caller has found it outside the device allocation the copier last
// reported in this Submit).
func (e *Engine) onDevice(addr uintptr, n uint64, sc *submitScratch) bool {
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
