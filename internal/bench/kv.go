// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
)

// kvShape is one request's KV cache: Layers × 2 (K and V) × Pages blocks
// of Block bytes, or, with Mix, blocks of Mix[l % len(Mix)] bytes in layer
// l (Block is then the largest of them): a request of several block
// sizes, as a model whose layers keep KV of different sizes sends.
type kvShape struct {
	Name   string   `json:"name"`
	Layers int      `json:"layers"`
	Pages  int      `json:"pages"`
	Block  uint64   `json:"block"`
	Mix    []uint64 `json:"mix,omitempty"`
}

func (s kvShape) blocks() int { return s.Layers * 2 * s.Pages }

// blockOf is the size of layer l's blocks.
func (s kvShape) blockOf(l int) uint64 {
	if len(s.Mix) == 0 {
		return s.Block
	}
	return s.Mix[l%len(s.Mix)]
}

// layerBytes is one page of every layer, K or V: what a pool page costs
// in each half of the pool's regions.
func (s kvShape) layerBytes() uint64 {
	if len(s.Mix) == 0 {
		return uint64(s.Layers) * s.Block
	}
	var n uint64
	for l := range s.Layers {
		n += s.blockOf(l)
	}
	return n
}

func (s kvShape) bytes() uint64 { return 2 * uint64(s.Pages) * s.layerBytes() }

func (s kvShape) String() string {
	if len(s.Mix) > 0 {
		sizes := make([]string, len(s.Mix))
		for i, b := range s.Mix {
			sizes[i] = sizeString(b)
		}
		return fmt.Sprintf("%s (%d layers × 2 × %d pages, blocks of %s by layer in turn)", s.Name, s.Layers, s.Pages, strings.Join(sizes, ", "))
	}
	return fmt.Sprintf("%s (%d layers × 2 × %d pages of %s)", s.Name, s.Layers, s.Pages, sizeString(s.Block))
}

// kvShapes are the named shapes: one short prompt's cache, a long one's,
// a very long one's, and the long one with small and large pages.
var kvShapes = []kvShape{
	{Name: "kv-small", Layers: 32, Pages: 4, Block: 16 << 10},
	{Name: "kv-medium", Layers: 80, Pages: 64, Block: 16 << 10},
	{Name: "kv-large", Layers: 80, Pages: 512, Block: 16 << 10},
	{Name: "kv-medium-4k", Layers: 80, Pages: 64, Block: 4 << 10},
	{Name: "kv-medium-128k", Layers: 80, Pages: 64, Block: 128 << 10},
}

// KVShapeNames lists the named KV shapes, for --kv-shape's help.
func KVShapeNames() string {
	var n []string
	for _, s := range kvShapes {
		n = append(n, s.Name)
	}
	return strings.Join(n, ", ")
}

// parseKVShape reads a named shape, or LxPxB (layers, pages, block size:
// "8x2x4KiB"), B a comma list for a request of several block sizes, layer
// l's the l-th in turn ("8x2x2KiB,16KiB").
func parseKVShape(s string) (kvShape, error) {
	for _, k := range kvShapes {
		if s == k.Name {
			return k, nil
		}
	}
	f := strings.Split(s, "x")
	bad := fmt.Errorf("--kv-shape %q: want one of %s, or LAYERSxPAGESxBLOCK (8x2x4KiB; BLOCK a comma list, one size a layer in turn: 8x2x2KiB,16KiB)", s, KVShapeNames())
	if len(f) != 3 {
		return kvShape{}, bad
	}
	l, err1 := strconv.Atoi(f[0])
	p, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l <= 0 || p <= 0 {
		return kvShape{}, bad
	}
	shape := kvShape{Name: s, Layers: l, Pages: p}
	for _, v := range strings.Split(f[2], ",") {
		b, err := ParseSize(strings.TrimSpace(v))
		if err != nil || b == 0 {
			return kvShape{}, bad
		}
		if b%8 != 0 {
			return kvShape{}, fmt.Errorf("--kv-shape %q: block of %d bytes, want a multiple of 8", s, b)
		}
		shape.Mix = append(shape.Mix, b)
		shape.Block = max(shape.Block, b)
	}
	if len(shape.Mix) == 1 {
		shape.Mix = nil
	}
	if l*2*p > 1<<20 {
		return kvShape{}, fmt.Errorf("--kv-shape %q: %d blocks a request, at most %d", s, l*2*p, 1<<20)
	}
	return shape, nil
}

// KVOptions are run's flags for KV-shaped traffic.
type KVOptions struct {
	Shape    string
	Traffic  string
	Requests int
	Inflight int
}

// kvLayout is the KV traffic of a run. Each rank's and each target's pool
// is a paged KV cache: per layer a K and a V region of pool pages of
// Block bytes, so block (layer l, K/V h, page p) of a pool of n pages is at
// ((2l+h)·n + p)·Block. A request takes Pages pages of the sender's pool
// and Pages of the target's, both drawn at random from pools a quarter
// larger than all requests need.
type kvLayout struct {
	Shape   kvShape `json:"shape"`
	Traffic string  `json:"traffic"`
	// Requests is how many requests each sender sends each of its targets.
	Requests int `json:"requests"`
	// Inflight is how many requests a rank has submitted and not seen
	// complete at most.
	Inflight int    `json:"inflight"`
	Seed     uint64 `json:"seed"`
}

// kvRequest is one request: its target and its pages in the two pools.
type kvRequest struct {
	rank, target int
	src, dst     []uint32
}

// kvPlan is the whole run's requests, derived from the layout alike in
// every process.
type kvPlan struct {
	shape    kvShape
	byRank   [][]kvRequest
	srcPages []int
	dstPages []int
	// regions[j] is where region j (layer j/2, K or V) of a pool of one
	// page begins; a pool of n pages has them n times as large.
	regions []uint64
}

// kvPool is a pool's pages for need pages of requests: a quarter more, so
// that requests take scattered pages and leave gaps.
func kvPool(need int) int {
	if need == 0 {
		return 0
	}
	return need + need/4 + 1
}

func (p *kvPlan) blockOffset(pool int, layer, h int, page uint32) uint64 {
	return p.regions[2*layer+h]*uint64(pool) + uint64(page)*p.shape.blockOf(layer)
}

func (p *kvPlan) poolBytes(pool int) uint64 { return p.regions[2*p.shape.Layers] * uint64(pool) }

// kvTargets are the targets rank r sends to.
func kvTargets(traffic string, ranks, r int) []int {
	var ks []int
	switch traffic {
	case "fan-in":
		if r != 0 {
			ks = append(ks, 0)
		}
	case "all-to-all":
		// Rank r starts at r+1 and goes round, as an all-to-all schedule
		// does: with a few requests in flight every target receives from
		// as many senders at once. In ascending order the first requests
		// of every rank went to the lowest ranks, and the highest one
		// received nothing until the rest were done; a relay's NIC then
		// idled while others had three senders, where the emulation's
		// direct path, whose NIC models the sender's wire only, did not
		// feel the receivers' crowding.
		for i := 1; i < ranks; i++ {
			ks = append(ks, (r+i)%ranks)
		}
	}
	return ks
}

func newKVPlan(ranks int, kv *kvLayout) *kvPlan {
	p := &kvPlan{shape: kv.Shape, byRank: make([][]kvRequest, ranks), srcPages: make([]int, ranks), dstPages: make([]int, ranks),
		regions: make([]uint64, 2*kv.Shape.Layers+1)}
	for j := range 2 * kv.Shape.Layers {
		p.regions[j+1] = p.regions[j] + kv.Shape.blockOf(j/2)
	}
	pages := kv.Shape.Pages
	for r := 0; r < ranks; r++ {
		for j := 0; j < kv.Requests; j++ {
			for _, k := range kvTargets(kv.Traffic, ranks, r) {
				p.byRank[r] = append(p.byRank[r], kvRequest{rank: r, target: k, src: make([]uint32, pages), dst: make([]uint32, pages)})
				p.dstPages[k] += pages
			}
		}
		p.srcPages[r] = len(p.byRank[r]) * pages
	}
	srcPerm := make([][]int, ranks)
	dstPerm := make([][]int, ranks)
	next := make([]int, ranks)
	for k := 0; k < ranks; k++ {
		p.srcPages[k] = kvPool(p.srcPages[k])
		p.dstPages[k] = kvPool(p.dstPages[k])
		srcPerm[k] = rand.New(rand.NewPCG(kv.Seed, uint64(2*k))).Perm(p.srcPages[k])
		dstPerm[k] = rand.New(rand.NewPCG(kv.Seed, uint64(2*k+1))).Perm(p.dstPages[k])
	}
	for r := range p.byRank {
		for i := range p.byRank[r] {
			q := &p.byRank[r][i]
			for pg := range q.src {
				q.src[pg] = uint32(srcPerm[r][i*pages+pg])
				q.dst[pg] = uint32(dstPerm[q.target][next[q.target]])
				next[q.target]++
			}
		}
	}
	return p
}

// newKVLayout places KV traffic: every sender's requests, its source pool
// and every target's pool. Its transfers are one per sender and target,
// for the routes and the byte counts; the plan says where each block goes.
func newKVLayout(ranks int, o KVOptions) (*layout, error) {
	if ranks < 2 || ranks > 8 {
		return nil, fmt.Errorf("--ranks %d: want 2..8 (one rank per GPU of a node)", ranks)
	}
	shape, err := parseKVShape(o.Shape)
	if err != nil {
		return nil, err
	}
	switch o.Traffic {
	case "fan-in", "all-to-all":
	default:
		return nil, fmt.Errorf("--kv-traffic %q: want fan-in (every other rank to rank 0's rail) or all-to-all", o.Traffic)
	}
	if o.Requests <= 0 || o.Inflight <= 0 {
		return nil, fmt.Errorf("--kv-requests %d, --kv-inflight %d: want both > 0", o.Requests, o.Inflight)
	}
	kv := &kvLayout{Shape: shape, Traffic: o.Traffic, Requests: o.Requests, Inflight: o.Inflight, Seed: 22}
	plan := newKVPlan(ranks, kv)
	l := &layout{Ranks: ranks, TargetBytes: make([]uint64, ranks), KV: kv, kv: plan}
	for k := range l.TargetBytes {
		l.TargetBytes[k] = plan.poolBytes(plan.dstPages[k])
	}
	for r := 0; r < ranks; r++ {
		for _, k := range kvTargets(o.Traffic, ranks, r) {
			l.Transfers = append(l.Transfers, transfer{Rank: r, Target: k, Len: uint64(o.Requests) * shape.bytes(), Block: shape.Block,
				Seed: rankSeed(r), Remote: sessionName(k)})
		}
	}
	return l, nil
}

// kvPlanOf returns the layout's KV plan, derived once per process.
func (l *layout) kvPlanOf() *kvPlan {
	if l.kv == nil {
		l.kv = newKVPlan(l.Ranks, l.KV)
	}
	return l.kv
}

// kvSourceBytes is rank r's source pool.
func (l *layout) kvSourceBytes(r int) uint64 {
	p := l.kvPlanOf()
	if len(p.byRank[r]) == 0 {
		return 0
	}
	return p.poolBytes(p.srcPages[r])
}

// kvRequests are rank r's requests, each a list of block writes in layer
// order, with sources in its pool at base.
func (l *layout) kvRequests(r int, base uintptr) ([][]relay.Request, uint64) {
	p := l.kvPlanOf()
	var out [][]relay.Request
	var total uint64
	s := p.shape
	for _, q := range p.byRank[r] {
		reqs := make([]relay.Request, 0, s.blocks())
		for layer := 0; layer < s.Layers; layer++ {
			for h := 0; h < 2; h++ {
				for pg := range q.src {
					reqs = append(reqs, relay.Request{Op: relay.Write, Len: s.blockOf(layer), Target: sessionName(q.target),
						Src: base + uintptr(p.blockOffset(p.srcPages[r], layer, h, q.src[pg])),
						Dst: targetBase + p.blockOffset(p.dstPages[q.target], layer, h, q.dst[pg])})
				}
			}
		}
		total += s.bytes()
		out = append(out, reqs)
	}
	return out, total
}

// verifyKV checks target k's pool: every block a request wrote holds its
// sender's pattern at the block's source offset, and every page no request
// took is still zero.
func verifyKV(l *layout, k int, buf []byte) error {
	p := l.kvPlanOf()
	s := p.shape
	pool := p.dstPages[k]
	if uint64(len(buf)) < p.poolBytes(pool) {
		return fmt.Errorf("target %s: %d bytes, the pool is %d", sessionName(k), len(buf), p.poolBytes(pool))
	}
	var reqs []kvRequest
	used := make([]bool, pool)
	for r := range p.byRank {
		for _, q := range p.byRank[r] {
			if q.target == k {
				reqs = append(reqs, q)
				for _, pg := range q.dst {
					used[pg] = true
				}
			}
		}
	}
	var mu sync.Mutex
	var first error
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	want := make([]byte, s.Block)
	zero := make([]byte, s.Block)
	check := func(i int, buf0 []byte) error {
		if i < len(reqs) {
			q := reqs[i]
			srcPool := p.srcPages[q.rank]
			for layer := 0; layer < s.Layers; layer++ {
				want := buf0[:s.blockOf(layer)]
				for h := 0; h < 2; h++ {
					for pg := range q.dst {
						so := p.blockOffset(srcPool, layer, h, q.src[pg])
						do := p.blockOffset(pool, layer, h, q.dst[pg])
						fillPattern(want, rankSeed(q.rank), so)
						if got := buf[do : do+uint64(len(want))]; !bytes.Equal(got, want) {
							return fmt.Errorf("target %s, rank %d's block (layer %d, %s, page %d → %d) at offset %d: %w",
								sessionName(k), q.rank, layer, "KV"[h:h+1], q.src[pg], q.dst[pg], do, checkPattern(got, rankSeed(q.rank), so))
						}
					}
				}
			}
			return nil
		}
		pg := uint32(i - len(reqs))
		if used[pg] {
			return nil
		}
		for b := 0; b < 2*s.Layers; b++ {
			do := p.blockOffset(pool, b/2, b%2, pg)
			if n := s.blockOf(b / 2); !bytes.Equal(buf[do:do+n], zero[:n]) {
				return fmt.Errorf("target %s: page %d of layer %d %s, which no request took, was written (offset %d)",
					sessionName(k), pg, b/2, "KV"[b%2:b%2+1], do)
			}
		}
		return nil
	}
	work := make(chan int, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for w := range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := want
			if w > 0 {
				mine = make([]byte, s.Block)
			}
			for i := range work {
				if err := check(i, mine); err != nil {
					fail(err)
				}
			}
		}()
	}
	for i := 0; i < len(reqs)+pool; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	return first
}

// kvTally is a KV transfer's per-request outcome.
type kvTally struct {
	res   *rankResult
	start time.Time
}

func newKVTally(n int) *kvTally {
	return &kvTally{res: &rankResult{CompletionsUS: make([]float64, 0, n), SubmitUS: make([]float64, 0, n)}, start: time.Now()}
}

func (t *kvTally) end(total uint64, reqs int) *rankResult {
	end := time.Now()
	t.res.Bytes, t.res.Requests = total, reqs
	t.res.Seconds = end.Sub(t.start).Seconds()
	t.res.StartNs, t.res.EndNs = t.start.UnixNano(), end.UnixNano()
	return t.res
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// transferKVEngine submits each request as one batch through the engine,
// with up to inflight batches outstanding, and times each from its Submit
// to the moment it is seen done.
func transferKVEngine(eng *relay.Engine, reqs [][]relay.Request, total uint64, inflight int, spin bool) (*rankResult, error) {
	type active struct {
		b  *relay.Batch
		t0 time.Time
	}
	cost := startCost(eng)
	t := newKVTally(len(reqs))
	var act []active
	defer func() {
		for _, a := range act {
			_ = a.b.Release()
		}
	}()
	for next := 0; next < len(reqs) || len(act) > 0; {
		for len(act) < inflight && next < len(reqs) {
			t0 := time.Now()
			b, err := eng.Submit(reqs[next])
			if err != nil {
				return nil, fmt.Errorf("request %d: %w", next, err)
			}
			t.res.SubmitUS = append(t.res.SubmitUS, micros(time.Since(t0)))
			act = append(act, active{b: b, t0: t0})
			next++
		}
		progressed := false
		for i := 0; i < len(act); {
			a := act[i]
			if !a.b.Done() {
				i++
				continue
			}
			t.res.CompletionsUS = append(t.res.CompletionsUS, micros(time.Since(a.t0)))
			for j := 0; j < a.b.Len(); j++ {
				if st, _ := a.b.Status(j); st.State != relay.Completed {
					t.res.fail(st.Err)
				}
			}
			_ = a.b.Release()
			act = append(act[:i], act[i+1:]...)
			progressed = true
		}
		if !progressed {
			pause(spin)
		}
	}
	res := t.end(total, len(reqs))
	cost.record(res)
	return res, nil
}

// transferKVBare sends the same requests through the hop alone, as a host
// transport without PXN would: a request's writes are posted in order as
// the send queue has room, up to inflight requests at once, and a request
// is complete when its last write is.
func transferKVBare(hop relay.Hop, reqs [][]relay.Request, total uint64, inflight int, spin bool) (*rankResult, error) {
	type active struct {
		i, posted, done int
		t0              time.Time
	}
	t := newKVTally(len(reqs))
	var act []*active
	// byReq finds a completion's request without hashing: at 2 KiB a
	// write completes every 41 ns of the wire.
	byReq := make([]*active, len(reqs))
	var ops [hopChunk]relay.WriteOp
	var comp [256]relay.HopCompletion
	for next := 0; next < len(reqs) || len(act) > 0; {
		for len(act) < inflight && next < len(reqs) {
			a := &active{i: next, t0: time.Now()}
			act = append(act, a)
			byReq[next] = a
			next++
		}
		busy := false
		for _, a := range act {
			q := reqs[a.i]
			for !busy && a.posted < len(q) {
				n := min(hopChunk, len(q)-a.posted)
				for j := range n {
					r := &q[a.posted+j]
					ops[j] = relay.WriteOp{Src: r.Src, Len: r.Len, Target: r.Target, Dst: r.Dst, Token: uint64(a.i)<<32 | uint64(a.posted+j)}
				}
				err := hop.Submit(ops[:n])
				if errors.Is(err, relay.ErrHopBusy) {
					busy = true
					break
				}
				if err != nil {
					return nil, fmt.Errorf("request %d: %w", a.i, err)
				}
				a.posted += n
			}
		}
		n := hop.Poll(comp[:])
		for _, c := range comp[:n] {
			var a *active
			if i := c.Token >> 32; i < uint64(len(byReq)) {
				a = byReq[i]
			}
			if a == nil {
				return nil, fmt.Errorf("hop completed token %#x of no request in flight", c.Token)
			}
			if c.Err != nil {
				t.res.fail(c.Err)
			}
			a.done++
		}
		for i := 0; i < len(act); {
			a := act[i]
			if a.done < len(reqs[a.i]) {
				i++
				continue
			}
			t.res.CompletionsUS = append(t.res.CompletionsUS, micros(time.Since(a.t0)))
			byReq[a.i] = nil
			act = append(act[:i], act[i+1:]...)
		}
		if n == 0 {
			pause(spin)
		}
	}
	res := t.end(total, len(reqs))
	res.Counters.DirectBytes = total
	return res, nil
}
