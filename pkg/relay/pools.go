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
	// maxPooledSlices bounds the plan slices that pooled groups keep, in
	// all (about 80 bytes each with their plan and copy entries).
	maxPooledSlices = 1 << 18
	maxPooledOpBufs = 64
	maxPooledOps    = 1 << 16
)

type batchPool struct {
	mu    sync.Mutex
	free  []*Batch
	tasks int
}

// get returns a batch of n pending-free tasks.
func (p *batchPool) get(n int) *Batch {
	p.mu.Lock()
	var b *Batch
	if k := len(p.free); k > 0 {
		b = p.free[k-1]
		p.free[k-1] = nil
		p.free = p.free[:k-1]
		p.tasks -= cap(b.tasks)
	}
	p.mu.Unlock()
	if b == nil {
		return &Batch{tasks: make([]task, n), pool: p}
	}
	if cap(b.tasks) < n {
		b.tasks = make([]task, n)
	} else {
		b.tasks = b.tasks[:n]
		clear(b.tasks)
	}
	b.released.Store(false)
	return b
}

func (p *batchPool) put(b *Batch) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) >= maxPooledBatches || p.tasks+cap(b.tasks) > maxPooledTasks {
		return
	}
	p.tasks += cap(b.tasks)
	p.free = append(p.free, b)
}

type groupPool struct {
	mu     sync.Mutex
	free   []*group
	slices int
}

func (p *groupPool) get() *group {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := len(p.free)
	if k == 0 {
		return &group{}
	}
	g := p.free[k-1]
	p.free[k-1] = nil
	p.free = p.free[:k-1]
	p.slices -= cap(g.plan.Slices)
	return g
}

// put resets g and keeps it if the budget allows.
func (p *groupPool) put(g *group) {
	g.key = groupKey{}
	g.batch = nil
	g.tasks = g.tasks[:0]
	g.blocks = g.blocks[:0]
	g.plan.Reset()
	g.ready = 0
	g.next = 0
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) >= maxPooledGroups || p.slices+cap(g.plan.Slices) > maxPooledSlices {
		return
	}
	p.slices += cap(g.plan.Slices)
	p.free = append(p.free, g)
}

// opsPool lends write-op vectors: a Submit's direct writes, a fallen-back
// Piece's writes until the hop has taken them all.
type opsPool struct {
	mu   sync.Mutex
	free [][]WriteOp
	ops  int
}

// get returns an empty vector with room for n ops.
func (p *opsPool) get(n int) []WriteOp {
	p.mu.Lock()
	var v []WriteOp
	if k := len(p.free); k > 0 {
		v = p.free[k-1]
		p.free[k-1] = nil
		p.free = p.free[:k-1]
		p.ops -= cap(v)
	}
	p.mu.Unlock()
	if cap(v) < n {
		return make([]WriteOp, 0, max(n, 8))
	}
	return v[:0]
}

func (p *opsPool) put(v []WriteOp) {
	clear(v[:cap(v)])
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) >= maxPooledOpBufs || p.ops+cap(v) > maxPooledOps {
		return
	}
	p.ops += cap(v)
	p.free = append(p.free, v[:0])
}

// submitScratch is the working memory of one Submit call.
type submitScratch struct {
	direct []int32
	groups map[groupKey]*group
	order  []*group
}

type scratchPool struct {
	mu   sync.Mutex
	free []*submitScratch
}

func (p *scratchPool) get() *submitScratch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := len(p.free); k > 0 {
		s := p.free[k-1]
		p.free = p.free[:k-1]
		return s
	}
	return &submitScratch{groups: make(map[groupKey]*group)}
}

func (p *scratchPool) put(s *submitScratch) {
	s.direct = s.direct[:0]
	clear(s.groups)
	clear(s.order)
	s.order = s.order[:0]
	if cap(s.direct) > maxPooledTasks {
		s.direct = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < maxPooledBatches {
		p.free = append(p.free, s)
	}
}

// recPool is the relay's free list of in-flight records, pump only. It holds
// at most the inflight depth of records.
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
