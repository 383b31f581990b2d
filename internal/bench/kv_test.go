// SPDX-License-Identifier: Apache-2.0

package bench

import (
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
				used := map[uint32]bool{}
				for _, q := range p.byRank[1] {
					for _, d := range q.dst {
						used[d] = true
					}
				}
				for pg := uint32(0); ; pg++ {
					if !used[pg] {
						pools[0][p.blockOffset(p.dstPages[0], 1, 0, pg)+5] = 9
						return
					}
				}
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
		if err != nil || got != c.want {
			t.Errorf("%q: %+v, %v", c.in, got, err)
		}
	}
}

func TestKVBaseline(t *testing.T) {
	fanIn, err := newKVLayout(8, KVOptions{Shape: "2x2x64", Traffic: "fan-in", Requests: 1, Inflight: 1})
	if err != nil {
		t.Fatal(err)
	}
	all, err := newKVLayout(4, KVOptions{Shape: "2x2x64", Traffic: "all-to-all", Requests: 1, Inflight: 1})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		l        *layout
		rate     float64
		direct   float64
		want     float64
		wantName string
	}{
		{"seven senders into one target's NIC", fanIn, 50, 206.2, 50, "capped at the 1 receiving NICs' 50 GB/s"},
		{"all-to-all under four targets' NICs", all, 50, 127.6, 127.6, "direct (emulated NIC alone)"},
		{"all-to-all above them", all, 50, 230, 200, "capped at the 4 receiving NICs' 200 GB/s"},
		{"no wire, no cap", fanIn, 0, 206.2, 206.2, "direct (emulated NIC alone)"},
	}
	for _, c := range cases {
		name, got := kvBaseline(scenario{rate: c.rate}, c.l, "emulated NIC", c.direct)
		if got != c.want || !strings.Contains(name, c.wantName) {
			t.Errorf("%s: %q %.1f, want %.1f (%q)", c.name, name, got, c.want, c.wantName)
		}
	}
}

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
