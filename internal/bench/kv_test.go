// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// deliver writes every request of the plan into the targets' pools as a
// perfect transport would, from sources filled with each rank's pattern.
func deliver(t *testing.T, l *layout) [][]byte {
	t.Helper()
	pools := make([][]byte, l.Ranks)
	for k := range pools {
		pools[k] = make([]byte, l.TargetBytes[k])
	}
	for r := 0; r < l.Ranks; r++ {
		src := make([]byte, max(l.sourceBytes(r), 1))
		fillPatternFast(src, rankSeed(r))
		base := uintptr(unsafe.Pointer(&src[0]))
		reqs, _ := l.kvRequests(r, base)
		for _, q := range reqs {
			for _, w := range q {
				k := int(w.Target[len(w.Target)-1] - '0')
				s := uint64(w.Src - base)
				copy(pools[k][w.Dst-targetBase:], src[s:s+w.Len])
			}
		}
	}
	return pools
}

func TestKVLayoutVerify(t *testing.T) {
	cases := []struct {
		name     string
		ranks    int
		opts     KVOptions
		damage   func(p *kvPlan, pools [][]byte)
		wantErr  string
		wantReqs []int
	}{
		{name: "fan-in, intact", ranks: 3, opts: KVOptions{Shape: "3x4x64", Traffic: "fan-in", Requests: 2, Inflight: 1}, wantReqs: []int{0, 2, 2}},
		{name: "all-to-all, intact", ranks: 3, opts: KVOptions{Shape: "2x2x4KiB", Traffic: "all-to-all", Requests: 2, Inflight: 3}, wantReqs: []int{4, 4, 4}},
		{name: "blocks of several sizes, all-to-all, intact", ranks: 3, opts: KVOptions{Shape: "5x3x64,256,24", Traffic: "all-to-all", Requests: 2, Inflight: 3}, wantReqs: []int{4, 4, 4}},
		{name: "blocks of several sizes: the last byte of a block", ranks: 2, opts: KVOptions{Shape: "5x3x64,256,24", Traffic: "fan-in", Requests: 2, Inflight: 1},
			damage: func(p *kvPlan, pools [][]byte) {
				q := p.byRank[1][1]
				pools[0][p.blockOffset(p.dstPages[0], 4, 1, q.dst[2])+255] ^= 1
			}, wantErr: "rank 1's block (layer 4, V, page"},
		{name: "blocks of several sizes: the last byte of a page no request took", ranks: 2, opts: KVOptions{Shape: "5x3x64,256,24", Traffic: "fan-in", Requests: 2, Inflight: 1},
			damage: func(p *kvPlan, pools [][]byte) {
				pg := pageNoRequestTook(p, 1)
				pools[0][p.blockOffset(p.dstPages[0], 2, 0, pg)+23] = 9
			}, wantErr: "page"},
		{name: "a byte of a block", ranks: 2, opts: KVOptions{Shape: "3x4x64", Traffic: "fan-in", Requests: 2, Inflight: 1},
			damage: func(p *kvPlan, pools [][]byte) {
				q := p.byRank[1][1]
				pools[0][p.blockOffset(p.dstPages[0], 2, 1, q.dst[3])+17] ^= 1
			}, wantErr: "rank 1's block (layer 2, V, page"},
		{name: "a block never sent", ranks: 2, opts: KVOptions{Shape: "3x4x64", Traffic: "fan-in", Requests: 2, Inflight: 1},
			damage: func(p *kvPlan, pools [][]byte) {
				q := p.byRank[1][0]
				clear(pools[0][p.blockOffset(p.dstPages[0], 0, 0, q.dst[0]) : p.blockOffset(p.dstPages[0], 0, 0, q.dst[0])+64])
			}, wantErr: "layer 0, K"},
		{name: "a write into a page no request took", ranks: 2, opts: KVOptions{Shape: "3x4x64", Traffic: "fan-in", Requests: 2, Inflight: 1},
			damage: func(p *kvPlan, pools [][]byte) {
				pg := pageNoRequestTook(p, 1)
				pools[0][p.blockOffset(p.dstPages[0], 1, 0, pg)+5] = 9
			}, wantErr: "which no request took, was written"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := newKVLayout(c.ranks, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			for r, want := range c.wantReqs {
				if got := len(l.kvPlanOf().byRank[r]); got != want {
					t.Errorf("rank %d has %d requests, want %d", r, got, want)
				}
			}
			// The children derive the plan from the layout's JSON alone.
			l2 := &layout{Ranks: l.Ranks, TargetBytes: l.TargetBytes, KV: l.KV}
			pools := deliver(t, l2)
			if c.damage != nil {
				c.damage(l.kvPlanOf(), pools)
			}
			var errs []string
			for k := range pools {
				if err := verifyTarget(l2, k, pools[k]); err != nil {
					errs = append(errs, err.Error())
				}
			}
			switch {
			case c.wantErr == "" && len(errs) > 0:
				t.Fatalf("intact pools failed: %v", errs)
			case c.wantErr != "" && (len(errs) != 1 || !strings.Contains(errs[0], c.wantErr)):
				t.Fatalf("errors %q, want one containing %q", errs, c.wantErr)
			}
		})
	}
}

func TestKVPagesScattered(t *testing.T) {
	l, err := newKVLayout(8, KVOptions{Shape: "kv-small", Traffic: "all-to-all", Requests: 3, Inflight: 4})
	if err != nil {
		t.Fatal(err)
	}
	p := l.kvPlanOf()
	for k := 0; k < 8; k++ {
		seen := map[uint32]bool{}
		adjacent := 0
		for r := range p.byRank {
			for _, q := range p.byRank[r] {
				if q.target != k {
					continue
				}
				for i, d := range q.dst {
					if seen[d] || int(d) >= p.dstPages[k] {
						t.Fatalf("target %d: page %d taken twice or outside the pool of %d", k, d, p.dstPages[k])
					}
					seen[d] = true
					if i > 0 && d == q.dst[i-1]+1 {
						adjacent++
					}
				}
			}
		}
		if len(seen) != 7*3*4 || adjacent > len(seen)/4 {
			t.Fatalf("target %d: %d pages, %d adjacent to the one before", k, len(seen), adjacent)
		}
	}
}

func TestParseKVShape(t *testing.T) {
	cases := []struct {
		in      string
		want    kvShape
		wantErr string
	}{
		{in: "kv-medium", want: kvShape{Name: "kv-medium", Layers: 80, Pages: 64, Block: 16 << 10}},
		{in: "kv-medium-128k", want: kvShape{Name: "kv-medium-128k", Layers: 80, Pages: 64, Block: 128 << 10}},
		{in: "8x2x4KiB", want: kvShape{Name: "8x2x4KiB", Layers: 8, Pages: 2, Block: 4 << 10}},
		{in: "8x2x2KiB,18KiB,4KiB", want: kvShape{Name: "8x2x2KiB,18KiB,4KiB", Layers: 8, Pages: 2, Block: 18 << 10, Mix: []uint64{2 << 10, 18 << 10, 4 << 10}}},
		{in: "8x2x2KiB,12", wantErr: "block of 12 bytes, want a multiple of 8"},
		{in: "8x2x2KiB,", wantErr: "LAYERSxPAGESxBLOCK"},
		{in: "kv-huge", wantErr: `--kv-shape "kv-huge": want one of kv-small`},
		{in: "8x0x4KiB", wantErr: "LAYERSxPAGESxBLOCK"},
		{in: "8x2x12", wantErr: "block of 12 bytes, want a multiple of 8"},
		{in: "1024x1024x8", wantErr: "2097152 blocks a request"},
	}
	for _, c := range cases {
		got, err := parseKVShape(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q: error %v, want %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: %+v, %v", c.in, got, err)
		}
	}
}

// TestWireBaseline: with a wire rate, the direct rate a row is compared
// with is at most what one NIC per rank gives the traffic (R times the
// fewer of the sending and receiving ranks), for KV requests and streams
// alike, and the name says which of the two it is.
func TestWireBaseline(t *testing.T) {
	kv := func(ranks int, traffic string) *layout {
		l, err := newKVLayout(ranks, KVOptions{Shape: "2x2x64", Traffic: traffic, Requests: 1, Inflight: 1})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	stream := func(ranks int, pattern string) *layout {
		l, err := newLayout(pattern, ranks, 1<<20, 4<<10)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	kvOpts := &KVOptions{}
	cases := []struct {
		name      string
		l         *layout
		kv        *KVOptions
		rate      float64
		direct    float64
		want      float64
		wantBound float64
		wantName  string
	}{
		{"KV: seven senders into one target's NIC", kv(8, "fan-in"), kvOpts, 50, 206.2, 50, 50,
			"requests direct (emulated NIC alone), capped at what one NIC per rank at 50 GB/s: 1 × 50 = 50 GB/s (7 sending ranks, 1 receiving) gives (direct moved 206.20 GB/s)"},
		{"KV: all-to-all below four NICs", kv(4, "all-to-all"), kvOpts, 50, 127.6, 127.6, 200, "below what one NIC per rank at 50 GB/s: 4 × 50 = 200 GB/s (4 sending ranks, 4 receiving) gives"},
		{"KV: all-to-all above them", kv(4, "all-to-all"), kvOpts, 50, 230, 200, 200, "capped at what one NIC per rank at 50 GB/s: 4 × 50 = 200 GB/s"},
		{"KV: 1→1", kv(2, "fan-in"), kvOpts, 50, 48.2, 48.2, 50, "below what one NIC per rank at 50 GB/s: 1 × 50 = 50 GB/s (1 sending ranks, 1 receiving)"},
		{"KV: no wire, no bound", kv(8, "fan-in"), kvOpts, 0, 206.2, 206.2, 0, "the same requests direct (emulated NIC alone)"},
		{"streams all-to-all over eight ranks above eight NICs", stream(8, "all-to-all"), nil, 50, 431, 400, 400, "traffic direct (emulated NIC alone), capped at what one NIC per rank at 50 GB/s: 8 × 50 = 400 GB/s"},
		{"streams 7→1", stream(8, "fan-in"), nil, 50, 120, 50, 50, "capped at what one NIC per rank at 50 GB/s: 1 × 50 = 50 GB/s (7 sending ranks, 1 receiving)"},
		{"streams 1→1 short of R", stream(2, "fan-in"), nil, 50, 31.5, 31.5, 50, "below what one NIC per rank"},
	}
	for _, c := range cases {
		name, got, bound := wireBaseline(scenario{rate: c.rate, kv: c.kv}, c.l, "emulated NIC", c.direct)
		if got != c.want || bound != c.wantBound || !strings.Contains(name, c.wantName) {
			t.Errorf("%s: %q %.1f (bound %.1f), want %.1f (bound %.1f, %q)", c.name, name, got, bound, c.want, c.wantBound, c.wantName)
		}
	}
}

// TestRowsJudgeTheDirectPhase: a row with a wire rate and a direct phase
// carries the bound and the direct phase's share of it, and says, when the
// direct phase fell short of it, that its ratio measures the emulation.
func TestRowsJudgeTheDirectPhase(t *testing.T) {
	l, err := newLayout("all-to-all", 8, 7<<30, 4<<10)
	if err != nil {
		t.Fatal(err)
	}
	phase := func(gbps float64) *phaseResult {
		p := &phaseResult{routed: true, verified: true}
		for r := range 8 {
			// Each rank moves 7 GiB over the same second.
			p.ranks = append(p.ranks, rankResult{Rank: r, Bytes: 7 << 30, StartNs: 1e9, EndNs: 1e9 + int64(8*(7<<30)/gbps)})
		}
		return p
	}
	dev := &device{kind: "cuda", hop: "emulated NIC"}
	s := scenario{id: "P14 stream", pattern: "all-to-all", ranks: 8, bytes: 7 << 30, block: 4 << 10, rate: 50, bare: true}
	for _, c := range []struct {
		direct, wantBase, wantShare float64
		short                       bool
	}{
		{350, 350, 0.875, true},
		{431, 400, 1.0775, false},
	} {
		main := dev.summarize(s, l, phase(200), phase(c.direct))[0]
		if !near(main.BaselineGBps, c.wantBase) || main.BoundGBps != 400 || !near(main.DirectOfBound, c.wantShare) || !near(main.Ratio, 200/c.wantBase) {
			t.Errorf("direct %.0f: baseline %.2f, bound %.0f, direct of bound %.4f, ratio %.3f; want %.0f, 400, %.4f, %.3f",
				c.direct, main.BaselineGBps, main.BoundGBps, main.DirectOfBound, main.Ratio, c.wantBase, c.wantShare, 200/c.wantBase)
		}
		if got := strings.Contains(main.Note, "the ratio measures the direct stand-in"); got != c.short {
			t.Errorf("direct %.0f: note %q, want the emulation named: %v", c.direct, main.Note, c.short)
		}
	}
}

func near(a, b float64) bool { return a > b*0.999 && a < b*1.001 }

// TestKVAllToAllOrder: each rank's all-to-all targets start after it and go
// round, so that the first requests of the ranks spread over every target.
func TestKVAllToAllOrder(t *testing.T) {
	const ranks = 4
	for r := range ranks {
		got := kvTargets("all-to-all", ranks, r)
		want := []int{(r + 1) % ranks, (r + 2) % ranks, (r + 3) % ranks}
		if !slices.Equal(got, want) {
			t.Errorf("rank %d: targets %v, want %v", r, got, want)
		}
	}
	// With two requests in flight, every target is among two ranks' first
	// two targets.
	first := make([]int, ranks)
	for r := range ranks {
		for _, k := range kvTargets("all-to-all", ranks, r)[:2] {
			first[k]++
		}
	}
	for k, n := range first {
		if n != 2 {
			t.Errorf("target %d is first or second of %d ranks, want 2 (%v)", k, n, first)
		}
	}
	if got := kvTargets("fan-in", ranks, 2); !slices.Equal(got, []int{0}) {
		t.Errorf("fan-in rank 2: %v, want [0]", got)
	}
}

// pageNoRequestTook is the first destination page that none of rank's
// requests writes.
func pageNoRequestTook(p *kvPlan, rank int) uint32 {
	used := map[uint32]bool{}
	for _, q := range p.byRank[rank] {
		for _, d := range q.dst {
			used[d] = true
		}
	}
	pg := uint32(0)
	for used[pg] {
		pg++
	}
	return pg
}
