// SPDX-License-Identifier: Apache-2.0

package gpunic

import (
	"errors"
	"testing"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/relay"
)

func TestNICPace(t *testing.T) {
	cases := []struct {
		name   string
		rate   float64
		opCost int64
		now    []int64
		bytes  []uint64
		start  []int64
		want   []int64
	}{
		{"bytes at R, queued ops wait for the wire", 50, 0, []int64{1000, 1500, 10_000}, []uint64{50_000, 100_000, 50}, []int64{1000, 2000, 10_000}, []int64{2000, 4000, 10_001}},
		{"an op holds the wire for its bytes or its cost, whichever is longer", 50, 10, []int64{1000, 1000, 1000, 1000}, []uint64{16_400, 16_400, 0, 100}, []int64{1000, 1328, 1656, 1666}, []int64{1328, 1656, 1666, 1676}},
		{"a 4 KiB write at 100 GB/s is 40.96 ns, kept exact in ps", 100, 10, []int64{0, 0, 0}, []uint64{4096, 4096, 4096}, []int64{0, 40, 81}, []int64{41, 82, 123}},
		{"no wire: no pacing", 0, 10, []int64{5, 6}, []uint64{1 << 30, 1}, []int64{5, 6}, []int64{0, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := newNIC(nil, nil, Options{RateGBps: c.rate, OpCost: -1}, nil)
			n.opCostPs = c.opCost * 1000
			for i := range c.now {
				s, f := n.pace(c.now[i], c.bytes[i])
				if s != c.start[i] || f != c.want[i] {
					t.Errorf("op %d (%d bytes at %d ns) on the wire %d–%d ns, want %d–%d", i, c.bytes[i], c.now[i], s, f, c.start[i], c.want[i])
				}
			}
		})
	}
	// 2 KiB writes at R = 50 GB/s with the default op cost: the bytes
	// decide, and a million of them take 40.96 ms to the ns.
	n := newNIC(nil, nil, Options{RateGBps: 50}, nil)
	var f int64
	for range 1_000_000 {
		_, f = n.pace(0, 2048)
	}
	if f != 40_960_000 {
		t.Errorf("a million 2 KiB writes at 50 GB/s through at %d ns, want 40960000", f)
	}
}

// fakeEngine records what the NIC starts; a batch is done once released
// (or at once with autoDone).
type fakeEngine struct {
	starts   []fakeStart
	pending  [nicBatches]bool
	autoDone bool
	startErr error
	// quiet keeps no record of starts (for benchmarks).
	quiet bool
}

type fakeStart struct {
	batch int
	ops   int
	bytes uint64
}

func (e *fakeEngine) start(b int, entries []cuda.BatchEntry) error {
	e.pending[b] = !e.autoDone
	if e.quiet {
		return e.startErr
	}
	var n uint64
	for _, x := range entries {
		n += x.Len
	}
	e.starts = append(e.starts, fakeStart{b, len(entries), n})
	return e.startErr
}

func (e *fakeEngine) done(b int) (bool, error) { return !e.pending[b], nil }
func (e *fakeEngine) close() error             { return nil }

func (e *fakeEngine) release() {
	for i := range e.pending {
		e.pending[i] = false
	}
}

const fakeBase = 0x10000

func fakeTargets() *Targets {
	return &Targets{list: []nicTarget{{session: "t0", addr: fakeBase, len: 1 << 40, base: 0x7f0000000000}, {session: "t1", addr: fakeBase, len: 1 << 20, base: 0x7e0000000000}}}
}

type fakeClock struct{ ns int64 }

func (c *fakeClock) now() int64 { return c.ns }

func writes(first uint64, n int, size uint64) []relay.WriteOp {
	ops := make([]relay.WriteOp, n)
	for i := range ops {
		tok := first + uint64(i)
		ops[i] = relay.WriteOp{Src: 0x1000 + uintptr(tok)*uintptr(size), Len: size, Target: "t0", Dst: fakeBase + tok*size, Token: tok}
	}
	return ops
}

// pollTokens polls once with room for max completions and returns their
// tokens, failing on an error.
func pollTokens(t *testing.T, n *NIC, max int) []uint64 {
	t.Helper()
	out := make([]relay.HopCompletion, max)
	k := n.Poll(out)
	var tok []uint64
	for _, c := range out[:k] {
		if c.Err != nil {
			t.Fatalf("token %d: %v", c.Token, c.Err)
		}
		tok = append(tok, c.Token)
	}
	return tok
}

func TestNICLoneWrite(t *testing.T) {
	eng, clk := &fakeEngine{}, &fakeClock{ns: 1000}
	n := newNIC(eng, fakeTargets(), Options{RateGBps: 50}, clk.now)
	if err := n.Submit(writes(1, 1, 10<<10)); err != nil {
		t.Fatal(err)
	}
	if len(eng.starts) != 0 {
		t.Fatalf("started at Submit: %+v", eng.starts)
	}
	if got := pollTokens(t, n, 4); len(got) != 0 || len(eng.starts) != 1 || eng.starts[0].ops != 1 {
		t.Fatalf("first Poll of an idle wire: completions %v, GPU operations %+v; want none and one of 1 op", got, eng.starts)
	}
	// 10 KiB at 50 GB/s: 204.8 ns on the wire.
	eng.release()
	clk.ns = 1204
	if got := pollTokens(t, n, 4); len(got) != 0 {
		t.Fatalf("completed before its wire time: %v", got)
	}
	clk.ns = 1205
	if got := pollTokens(t, n, 4); len(got) != 1 || got[0] != 1 {
		t.Fatalf("at its wire time: %v", got)
	}
	if err := n.Submit(writes(2, 1, 10<<10)); err != nil {
		t.Fatal(err)
	}
	clk.ns = 5000
	if got := pollTokens(t, n, 4); len(got) != 0 {
		t.Fatalf("completed before its GPU operation: %v", got)
	}
	eng.release()
	if got := pollTokens(t, n, 4); len(got) != 1 || got[0] != 2 {
		t.Fatalf("after its GPU operation: %v", got)
	}
}

// TestNICBacklogBatches drives a NIC at R = 50 GB/s with a host faster
// than its wire (600 ns of clock for each Submit of 256 writes and its
// Poll; the GPU done at once): while the wire's backlog is shorter than the lead
// every Poll starts what waits; beyond it, ops gather into full batches,
// by count for 2 KiB writes and by bytes for 64 KiB ones. Every completion
// comes in order and no earlier than its wire time.
func TestNICBacklogBatches(t *testing.T) {
	for _, c := range []struct {
		size    uint64
		fullOps int
	}{{2 << 10, batchOps}, {64 << 10, batchBytes / (64 << 10)}} {
		eng, clk := &fakeEngine{autoDone: true}, &fakeClock{}
		n := newNIC(eng, fakeTargets(), Options{RateGBps: 50}, clk.now)
		hold := float64(c.size) / 50
		var sent, next uint64
		collect := func() {
			for _, tok := range pollTokens(t, n, 256) {
				if tok != next {
					t.Fatalf("%d B: token %d, want %d", c.size, tok, next)
				}
				// The wire never idles: write k is through at (k+1)·hold.
				if through := float64(tok+1) * hold; float64(clk.ns) < through-1 {
					t.Fatalf("%d B: token %d completed at %d ns, before its wire time %.0f", c.size, tok, clk.ns, through)
				}
				next++
			}
		}
		leadOps := -1
		for sent < uint64(5*c.fullOps) {
			if err := n.Submit(writes(sent, 256, c.size)); err != nil {
				if !errors.Is(err, relay.ErrHopBusy) {
					t.Fatal(err)
				}
			} else {
				sent += 256
			}
			if leadOps < 0 && float64(sent)*hold-float64(clk.ns) > float64(startLead.Nanoseconds()) {
				leadOps = int(sent)
			}
			collect()
			clk.ns += 600
		}
		var ops, full int
		for i, s := range eng.starts {
			if leadOps >= 0 && ops >= leadOps && s.ops != c.fullOps {
				t.Errorf("%d B: GPU operation %d (ops %d on, backlog past the lead from op %d) has %d ops, want %d", c.size, i, ops, leadOps, s.ops, c.fullOps)
			}
			if s.ops == c.fullOps {
				full++
			}
			ops += s.ops
		}
		if leadOps < 0 || full < 2 || len(eng.starts) > leadOps/256*(1+256/c.fullOps)+full+2 {
			t.Errorf("%d B: %d GPU operations (%d full) for %d ops, the backlog past the lead from op %d", c.size, len(eng.starts), full, ops, leadOps)
		}
		for clk.ns += int64(float64(sent) * hold); next < sent; {
			before := next
			collect()
			if next == before {
				t.Fatalf("%d B: stuck at token %d of %d", c.size, next, sent)
			}
		}
		if n.bN != 0 || n.opN != 0 {
			t.Fatalf("%d B: %d batches and %d ops left", c.size, n.bN, n.opN)
		}
	}
}

// TestNICUncapped: without a wire an idle GPU starts what waits at once;
// while the NIC's last operation runs, ops wait until flushOps of them do.
func TestNICUncapped(t *testing.T) {
	eng, clk := &fakeEngine{}, &fakeClock{}
	n := newNIC(eng, fakeTargets(), Options{}, clk.now)
	if err := n.Submit(writes(0, 1, 4096)); err != nil {
		t.Fatal(err)
	}
	n.Poll(nil)
	if len(eng.starts) != 1 {
		t.Fatalf("an idle GPU: %d operations", len(eng.starts))
	}
	for i := 1; i < flushOps; i++ {
		if err := n.Submit(writes(uint64(i), 1, 4096)); err != nil {
			t.Fatal(err)
		}
		n.Poll(nil)
	}
	if len(eng.starts) != 1 {
		t.Fatalf("%d ops waiting for a busy GPU: %d operations", flushOps-1, len(eng.starts))
	}
	if err := n.Submit(writes(flushOps, 1, 4096)); err != nil {
		t.Fatal(err)
	}
	if got := pollTokens(t, n, 8); len(got) != 0 || len(eng.starts) != 2 || eng.starts[1].ops != flushOps {
		t.Fatalf("%d waiting: completions %v, operations %+v", flushOps, got, eng.starts)
	}
	eng.release()
	if got := pollTokens(t, n, 2*flushOps); len(got) != flushOps+1 {
		t.Fatalf("after the GPU: %d completions", len(got))
	}
}

// TestNICErrors: ops the NIC cannot perform complete with an error in
// their place; a GPU operation that fails to start fails its ops; the
// queue's depth bounds what Submit takes.
func TestNICErrors(t *testing.T) {
	eng, clk := &fakeEngine{autoDone: true}, &fakeClock{}
	n := newNIC(eng, fakeTargets(), Options{QueueDepth: 8}, clk.now)
	// Before any good write: nothing to mistake for a known target.
	if err := n.Submit([]relay.WriteOp{{Token: 99}}); err != nil {
		t.Fatal(err)
	}
	first := make([]relay.HopCompletion, 2)
	if k := n.Poll(first); k != 1 || first[0].Token != 99 || first[0].Err == nil {
		t.Fatalf("a write to no session: %d completions %+v", k, first[:k])
	}
	ops := writes(0, 6, 4096)
	ops[1].Read = true
	ops[2].Target = "nobody"
	ops[3].Target, ops[3].Dst = "t1", fakeBase+1<<20-100
	ops[4].Src = 0
	ops[5].Len = 0
	if err := n.Submit(ops); err != nil {
		t.Fatal(err)
	}
	if err := n.Submit(writes(6, 9, 4096)); err == nil || errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("a batch deeper than the queue: %v", err)
	}
	if err := n.Submit(writes(6, 3, 4096)); !errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("a full queue: %v", err)
	}
	out := make([]relay.HopCompletion, 8)
	k := n.Poll(out)
	if k != 6 {
		t.Fatalf("%d completions, want 6", k)
	}
	for i, c := range out[:k] {
		if bad := i >= 1 && i <= 4; c.Token != uint64(i) || (c.Err != nil) != bad {
			t.Errorf("completion %d: token %d, err %v", i, c.Token, c.Err)
		}
	}
	if len(eng.starts) != 1 || eng.starts[0].ops != 1 {
		t.Fatalf("GPU operations %+v, want one of the one good write", eng.starts)
	}
	eng.startErr = errors.New("launch refused")
	if err := n.Submit(writes(6, 2, 4096)); err != nil {
		t.Fatal(err)
	}
	k = n.Poll(out)
	if k != 2 || !errors.Is(out[0].Err, eng.startErr) || !errors.Is(out[1].Err, eng.startErr) {
		t.Fatalf("a failed start: %d completions %+v", k, out[:k])
	}
}

// TestNICSubmitPiece: a Piece is one GPU operation of its own, whole, and
// one completion with its token once the wire has sent its last write and
// the GPU is done; a write it cannot perform fails the Piece; a full queue
// takes none of it.
func TestNICSubmitPiece(t *testing.T) {
	eng, clk := &fakeEngine{}, &fakeClock{}
	n := newNIC(eng, fakeTargets(), Options{RateGBps: 50, QueueDepth: 3}, clk.now)
	for _, bad := range [][]relay.WriteOp{nil, writes(0, batchOps+1, 8)} {
		if err := n.SubmitPiece(bad, 9); err == nil || errors.Is(err, relay.ErrHopBusy) {
			t.Fatalf("a Piece of %d writes: %v", len(bad), err)
		}
	}
	// A write waiting in the open batch, then a Piece of 4096 2 KiB
	// writes, then another write: three GPU operations, the Piece's whole.
	if err := n.Submit(writes(0, 1, 2048)); err != nil {
		t.Fatal(err)
	}
	piece := writes(1, batchOps, 2048)
	for i := range piece {
		piece[i].Token = 0
	}
	if err := n.SubmitPiece(piece, 77); err != nil {
		t.Fatal(err)
	}
	if err := n.Submit(writes(batchOps+1, 1, 2048)); err != nil {
		t.Fatal(err)
	}
	if err := n.SubmitPiece(writes(0, 1, 8), 78); !errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("a Piece into a full queue: %v", err)
	}
	if n.opN != 3 || n.bN != 3 {
		t.Fatalf("after a refused Piece: %d ops and %d batches queued, want 3 and 3", n.opN, n.bN)
	}
	clk.ns = 1 << 30
	n.Poll(nil)
	if len(eng.starts) != 3 || eng.starts[0].ops != 1 || eng.starts[1].ops != batchOps || eng.starts[1].bytes != batchOps*2048 || eng.starts[2].ops != 1 {
		t.Fatalf("GPU operations %+v, want 1, %d and 1 writes", eng.starts, batchOps)
	}
	if got := pollTokens(t, n, 8); len(got) != 0 {
		t.Fatalf("completions before the GPU: %v", got)
	}
	eng.release()
	// The Piece's last write is through at (1+4096)·40.96 ns.
	clk.ns = 167_813
	if got := pollTokens(t, n, 8); len(got) != 1 || got[0] != 0 {
		t.Fatalf("before the Piece's last write is through: %v", got)
	}
	clk.ns = 167_814
	if got := pollTokens(t, n, 8); len(got) != 1 || got[0] != 77 {
		t.Fatalf("once it is: %v", got)
	}
	clk.ns = 167_855
	if got := pollTokens(t, n, 8); len(got) != 1 || got[0] != batchOps+1 {
		t.Fatalf("the write after the Piece: %v", got)
	}
	// A Piece with a read and an unknown session among good writes.
	bad := writes(10, 4, 4096)
	bad[1].Read = true
	bad[2].Target = "nobody"
	if err := n.SubmitPiece(bad, 79); err != nil {
		t.Fatal(err)
	}
	eng.autoDone = true
	clk.ns += 1 << 20
	out := make([]relay.HopCompletion, 4)
	if k := n.Poll(out); k != 1 || out[0].Token != 79 || !errors.Is(out[0].Err, errNICRead) {
		t.Fatalf("a Piece with a read: %d completions %+v, want one failed with the read", k, out[:k])
	}
	if last := eng.starts[len(eng.starts)-1]; last.ops != 2 {
		t.Fatalf("the good writes of a failed Piece: a GPU operation of %d, want 2", last.ops)
	}
}

// TestNICBatchesFor: a Submit never opens more batches than it is
// checked for.
func TestNICBatchesFor(t *testing.T) {
	for _, c := range []struct {
		n    int
		size uint64
	}{{1, 8 << 20}, {32, 8 << 20}, {400, 1 << 20}, {4096, 2 << 10}, {1024, 64 << 10}, {3, 3 << 20}, {2049, 1}, {200, 600 << 10}} {
		eng, clk := &fakeEngine{autoDone: true}, &fakeClock{}
		n := newNIC(eng, fakeTargets(), Options{RateGBps: 50}, clk.now)
		// A batch already open and partly full.
		if err := n.Submit(writes(0, 5, c.size)); err != nil {
			t.Fatal(err)
		}
		ops := writes(5, c.n, c.size)
		need := batchesFor(ops)
		before := n.bN
		if err := n.Submit(ops); err != nil {
			t.Fatal(err)
		}
		if opened := n.bN - before; opened > need {
			t.Errorf("%d × %d B: opened %d batches, checked for %d", c.n, c.size, opened, need)
		}
	}
}

// BenchmarkNICHostPath is the NIC's host work per write without a GPU:
// Submits of 32 2 KiB writes at R = 50 GB/s, a Poll after each, a clock a
// millisecond on at every call (so every write is due and done at once).
func BenchmarkNICHostPath(b *testing.B) {
	var c int64
	n := newNIC(&fakeEngine{autoDone: true, quiet: true}, fakeTargets(), Options{RateGBps: 50}, func() int64 { c += 1e6; return c })
	ops := writes(0, 32, 2048)
	out := make([]relay.HopCompletion, 64)
	b.ReportAllocs()
	for b.Loop() {
		if err := n.Submit(ops); err != nil {
			b.Fatal(err)
		}
		if k := n.Poll(out); k != len(ops) {
			b.Fatalf("%d completions", k)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ops)), "ns/write")
}
