// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"sync"

	"github.com/pxn-project/pxn/pkg/staging"
)

// The engine's free lists. Each keeps what steady traffic needs so that it
// allocates nothing, and each has a budget: memory grown for a rare huge
// request is left to the garbage collector instead of being held forever.
const (
	maxPooledBatches = 256
	maxPooledTasks   = 1 << 16
	maxPooledGroups  = 64
	// maxPooledBlocks bounds the blocks that pooled groups keep, in all
	// (32 bytes each).
	maxPooledBlocks = 1 << 18
	maxPooledOpBufs = 64
	maxPooledOps    = 1 << 16
)

// freeList is a stack of reusable values under a budget: at most maxItems
// values, whose sizes (as size reports them: the capacity they hold) add up
// to at most maxSize.
type freeList[T any] struct {
	mu       sync.Mutex
	free     []T
	held     int
	maxItems int
	maxSize  int
	size     func(T) int
}

// take pops the most recently given value; ok is false when none is kept.
func (f *freeList[T]) take() (v T, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := len(f.free)
	if k == 0 {
		return v, false
	}
	var zero T
	v = f.free[k-1]
	f.free[k-1] = zero
	f.free = f.free[:k-1]
	f.held -= f.size(v)
	return v, true
}

// give keeps v if the budget allows.
func (f *freeList[T]) give(v T) {
	n := f.size(v)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.free) >= f.maxItems || f.held+n > f.maxSize {
		return
	}
	f.held += n
	f.free = append(f.free, v)
}

type batchPool struct{ list freeList[*Batch] }

func newBatchPool() *batchPool {
	return &batchPool{list: freeList[*Batch]{maxItems: maxPooledBatches, maxSize: maxPooledTasks,
		size: func(b *Batch) int { return cap(b.tasks) }}}
}

// get returns a batch of n tasks, none pending.
func (p *batchPool) get(n int) *Batch {
	b, ok := p.list.take()
	if !ok {
		return &Batch{tasks: make([]task, n), remaining: make([]int32, n), pool: p}
	}
	if cap(b.tasks) < n {
		b.tasks, b.remaining = make([]task, n), make([]int32, n)
	} else {
		b.tasks, b.remaining = b.tasks[:n], b.remaining[:n]
		clear(b.tasks)
		clear(b.remaining)
	}
	b.released.Store(false)
	return b
}

func (p *batchPool) put(b *Batch) { p.list.give(b) }

type groupPool struct{ list freeList[*group] }

func newGroupPool() *groupPool {
	return &groupPool{list: freeList[*group]{maxItems: maxPooledGroups, maxSize: maxPooledBlocks,
		size: func(g *group) int { return cap(g.blocks) }}}
}

func (p *groupPool) get() *group {
	if g, ok := p.list.take(); ok {
		return g
	}
	return &group{}
}

// put resets g and keeps it if the budget allows.
func (p *groupPool) put(g *group) {
	g.key = groupKey{}
	g.batch = nil
	g.blocks = g.blocks[:0]
	g.plan.Reset()
	g.ready = 0
	g.next = 0
	p.list.give(g)
}

// opsPool lends write-op vectors: a Submit's direct writes, a fallen-back
// Piece's writes until the hop has taken them all.
type opsPool struct{ list freeList[[]WriteOp] }

func newOpsPool() *opsPool {
	return &opsPool{list: freeList[[]WriteOp]{maxItems: maxPooledOpBufs, maxSize: maxPooledOps,
		size: func(v []WriteOp) int { return cap(v) }}}
}

// get returns an empty vector with room for n ops.
func (p *opsPool) get(n int) []WriteOp {
	if v, ok := p.list.take(); ok && cap(v) >= n {
		return v[:0]
	}
	return make([]WriteOp, 0, max(n, 8))
}

func (p *opsPool) put(v []WriteOp) {
	clear(v[:cap(v)])
	p.list.give(v[:0])
}

// submitScratch is the working memory of one Submit call.
type submitScratch struct {
	// devLo and devHi bound the last device allocation a RangeClassifier
	// reported in this call (empty when devHi is 0).
	devLo, devHi uintptr
	// toSession's registered range [toLo, toHi) was last resolved, in
	// this call, to the outbound lane toLane: a later request into the
	// same range takes the same lane without asking the directory again.
	toSession  string
	toLo, toHi uint64
	toLane     *outLane
	// last is the group the previous PXN request joined.
	last   *group
	direct []int32
	groups map[groupKey]*group
	order  []*group
}

type scratchPool struct{ list freeList[*submitScratch] }

func newScratchPool() *scratchPool {
	return &scratchPool{list: freeList[*submitScratch]{maxItems: maxPooledBatches, maxSize: maxPooledBatches,
		size: func(*submitScratch) int { return 1 }}}
}

func (p *scratchPool) get() *submitScratch {
	if s, ok := p.list.take(); ok {
		return s
	}
	return &submitScratch{groups: make(map[groupKey]*group)}
}

// resetGroups forgets a chunk's groups and direct requests; the caches
// (the source allocation, the target's lane) stay.
func (s *submitScratch) resetGroups() {
	s.last = nil
	s.direct = s.direct[:0]
	clear(s.groups)
	clear(s.order)
	s.order = s.order[:0]
}

func (p *scratchPool) put(s *submitScratch) {
	s.devLo, s.devHi = 0, 0
	s.toSession, s.toLo, s.toHi, s.toLane = "", 0, 0, nil
	s.resetGroups()
	if cap(s.direct) > maxPooledTasks {
		s.direct = nil
	}
	p.list.give(s)
}

// recPool is the relayer's free list of in-flight records. It holds
// at most the inflight depth of records, each with the op vector it grew
// to (at most MaxPlans ops: 320 KiB).
type recPool struct {
	free []*inflightRec
}

func (p *recPool) get() *inflightRec {
	if k := len(p.free); k > 0 {
		r := p.free[k-1]
		p.free[k-1] = nil
		p.free = p.free[:k-1]
		return r
	}
	return &inflightRec{ops: make([]WriteOp, 0, 8)}
}

func (p *recPool) put(r *inflightRec) {
	clear(r.ops)
	*r = inflightRec{ops: r.ops[:0]}
	if cap(r.ops) > staging.MaxPlans {
		r.ops = make([]WriteOp, 0, 8)
	}
	p.free = append(p.free, r)
}
