// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/testtools"
)

func TestRankGPUs(t *testing.T) {
	tests := []struct {
		flag  string
		ranks int
		ngpu  int
		want  []int
		bad   bool
	}{
		{"", 8, 2, []int{0, 1, 0, 1, 0, 1, 0, 1}, false},
		{"", 3, 8, []int{0, 1, 2}, false},
		{"0,1,1,1", 4, 2, []int{0, 1, 1, 1}, false},
		{"0,2", 2, 2, nil, true},
		{"0", 2, 2, nil, true},
		{"0,x", 2, 2, nil, true},
	}
	for _, tt := range tests {
		got, err := rankGPUs(tt.flag, tt.ranks, tt.ngpu)
		if (err != nil) != tt.bad || (!tt.bad && !slices.Equal(got, tt.want)) {
			t.Errorf("rankGPUs(%q, %d, %d) = %v, %v", tt.flag, tt.ranks, tt.ngpu, got, err)
		}
	}
}

func TestSuite(t *testing.T) {
	want, err := parseSuite("all")
	if err != nil || !want["p1"] || !want["p2"] || !want["p3"] {
		t.Fatalf("all = %v, %v", want, err)
	}
	if _, err := parseSuite("p1,p11"); err == nil {
		t.Fatal("p11 accepted")
	}
	kv, err := parseSuite("p9,p10")
	if err != nil || !kv["p9"] || !kv["p10"] || kv["p1"] {
		t.Fatalf("p9,p10 = %v, %v", kv, err)
	}
	shapes := map[string]int{}
	for _, r := range suiteRuns(kv, 2) {
		if r.kv == nil || r.rate != 50 || !r.bare || len(r.gpus) != r.ranks {
			t.Fatalf("%s: %+v", r.id, r)
		}
		if r.kv.Traffic == "fan-in" && !slices.Equal(r.gpus[1:], slices.Repeat([]int{1}, r.ranks-1)) || r.gpus[0] != 0 {
			t.Errorf("%s %s: GPUs %v, want the relay on 0 and the senders on 1", r.id, r.kv.Shape, r.gpus)
		}
		if _, err := newKVLayout(r.ranks, *r.kv); err != nil {
			t.Fatalf("%s: %v", r.id, err)
		}
		shapes[r.id+" "+r.kv.Shape]++
	}
	if shapes["P9 kv-medium"] != 3 || shapes["P9 kv-large"] != 3 || shapes["P10 kv-small"] != 1 ||
		shapes["P10 4MiB in 2 blocks: 1x1x2MiB"] != 1 || shapes["P10 128KiB in 2 blocks: 1x1x64KiB"] != 1 {
		t.Fatalf("kv scenarios %v, want kv-medium and kv-large 1→1, 7→1 and all-to-all, and kv-small with its two parts", shapes)
	}
	runs := suiteRuns(map[string]bool{"p1": true, "p3": true}, 2)
	var seven *scenario
	for i := range runs {
		r := runs[i]
		if len(r.gpus) != r.ranks {
			t.Errorf("%s: %d GPUs for %d ranks", r.id, len(r.gpus), r.ranks)
		}
		if r.id == "P3" && r.ranks == 8 {
			seven = &runs[i]
		}
	}
	if seven == nil || !slices.Equal(seven.gpus, []int{0, 1, 1, 1, 1, 1, 1, 1}) || seven.rate != 50 {
		t.Fatalf("P3 seven senders: %+v", seven)
	}
	if _, err := newLayout(seven.pattern, seven.ranks, seven.bytes, seven.block); err != nil {
		t.Fatal(err)
	}
}

// TestSuiteP8: same-rail requests of 4 KiB, 64 KiB and 8 MiB, NIC
// uncapped, through the engine against the hop alone, each rank on its
// own rail's target.
func TestSuiteP8(t *testing.T) {
	want, err := parseSuite("p8")
	if err != nil || !want["p8"] || len(want) != 1 {
		t.Fatalf("p8 = %v, %v", want, err)
	}
	var blocks []uint64
	for _, r := range suiteRuns(want, 2) {
		if r.id != "P8" || r.pattern != "same-rail" || r.rate != 0 || !r.bare || !r.warm || !slices.Equal(r.gpus, []int{0, 1}) {
			t.Fatalf("%+v", r)
		}
		l, err := newLayout(r.pattern, r.ranks, r.bytes, r.block)
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range l.Transfers {
			if tr.Target != tr.Rank {
				t.Errorf("rank %d writes to target %d, want its own rail's", tr.Rank, tr.Target)
			}
		}
		blocks = append(blocks, r.block)
	}
	if !slices.Equal(blocks, []uint64{4 << 10, 64 << 10, 8 << 20}) {
		t.Fatalf("blocks %v, want 4 KiB, 64 KiB and 8 MiB", blocks)
	}
}

// TestSuiteP14: every P14 block size, KV requests 1→1, 7→1 and all-to-all
// over eight ranks and streams of one-block requests the same three ways,
// all at R = 50 GB/s against direct; 1→1 also the request of several
// sizes; each traffic through every size before the next, 1→1 of both
// kinds first. Each part by traffic is a suite of its own, and p14 is the
// three.
func TestSuiteP14(t *testing.T) {
	want, err := parseSuite("p14")
	if err != nil || len(want) != 3 || !want["p14-1to1"] || !want["p14-7to1"] || !want["p14-a2a"] {
		t.Fatalf("p14 = %v, %v", want, err)
	}
	runs := suiteRuns(want, 1)
	if len(runs) != 6*len(p14Blocks)+1 {
		t.Fatalf("%d scenarios, want %d", len(runs), 6*len(p14Blocks)+1)
	}
	type key struct {
		kind, traffic string
		ranks         int
	}
	var order []key
	blocks := map[key][]uint64{}
	var mixed int
	for _, r := range runs {
		if r.rate != 50 || !r.bare || !r.warm || len(r.gpus) != r.ranks {
			t.Fatalf("%s: %+v", r.id, r)
		}
		k := key{"stream", r.pattern, r.ranks}
		var l *layout
		if r.kv != nil {
			k = key{"kv", r.kv.Traffic, r.ranks}
			if l, err = newKVLayout(r.ranks, *r.kv); err != nil {
				t.Fatalf("%s %s: %v", r.id, r.kv.Shape, err)
			}
			if got := l.KV.Shape.bytes(); got < 39<<20 || got > 42<<20 {
				t.Errorf("%s: a request of %d bytes, want about 40 MiB", r.kv.Shape, got)
			}
			if len(l.KV.Shape.Mix) > 0 {
				mixed++
				if k != (key{"kv", "fan-in", 2}) || !slices.Equal(l.KV.Shape.Mix, []uint64{2 << 10, 4 << 10, p14Odd, 64 << 10}) {
					t.Errorf("%s: the request of several sizes as %v, blocks %v", r.kv.Shape, k, l.KV.Shape.Mix)
				}
			} else {
				blocks[k] = append(blocks[k], l.KV.Shape.Block)
			}
		} else {
			if r.id != "P14 stream" {
				t.Errorf("%+v: not a P14 stream", r)
			}
			if l, err = newLayout(r.pattern, r.ranks, r.bytes, r.block); err != nil {
				t.Fatalf("%s %s: %v", r.id, r.pattern, err)
			}
			for _, tr := range l.Transfers {
				if tr.Block != r.block {
					t.Errorf("%s %s: requests of %d bytes, want one block of %d", r.id, r.pattern, tr.Block, r.block)
				}
			}
			blocks[k] = append(blocks[k], r.block)
		}
		if len(order) == 0 || order[len(order)-1] != k {
			order = append(order, k)
		}
	}
	wantOrder := []key{{"kv", "fan-in", 2}, {"stream", "fan-in", 2}, {"kv", "fan-in", 8}, {"kv", "all-to-all", 8}, {"stream", "fan-in", 8}, {"stream", "all-to-all", 8}}
	if !slices.Equal(order, wantOrder) {
		t.Fatalf("traffic in the order %v, want %v", order, wantOrder)
	}
	if mixed != 1 {
		t.Errorf("%d requests of several sizes, want one", mixed)
	}
	wantBlocks := []uint64{1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 18 << 10, 64 << 10}
	for k, b := range blocks {
		if !slices.Equal(b, wantBlocks) {
			t.Errorf("%v: blocks %v, want %v", k, b, wantBlocks)
		}
	}
	for i, part := range p14Parts {
		one, err := parseSuite(part)
		if err != nil || len(one) != 1 {
			t.Fatalf("%s = %v, %v", part, one, err)
		}
		var traffic []key
		for _, r := range suiteRuns(one, 1) {
			k := key{"stream", r.pattern, r.ranks}
			if r.kv != nil {
				k = key{"kv", r.kv.Traffic, r.ranks}
			}
			if !slices.Contains(traffic, k) {
				traffic = append(traffic, k)
			}
		}
		if w := [][]key{wantOrder[:2], {wantOrder[2], wantOrder[4]}, {wantOrder[3], wantOrder[5]}}[i]; !slices.Equal(traffic, w) {
			t.Errorf("%s: traffic %v, want %v", part, traffic, w)
		}
	}
}

// TestKitP14Baseline: the kit runs the baseline's P14 1→1 with the suite's
// shapes, requests and requests in flight, so the two columns compare the
// same traffic.
func TestKitP14Baseline(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(testtools.RepoRoot(), "hack", "gpu-kit.sh"))
	if err != nil {
		t.Fatal(err)
	}
	var shapes []string
	for _, b := range p14Blocks {
		shapes = append(shapes, p14Shape(b))
	}
	for _, line := range []string{
		fmt.Sprintf("p14_shapes=%q", strings.Join(shapes, " ")),
		fmt.Sprintf("p14_requests=%d", p14Requests),
		fmt.Sprintf("p14_inflight=%d", p14Inflight),
	} {
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(line) + `$`).Match(script) {
			t.Errorf("hack/gpu-kit.sh has no line %s", line)
		}
	}
}

func TestNodeRails(t *testing.T) {
	hgx := map[string]string{"mlx5_0": "rail0", "mlx5_2": "rail1", "mlx5_3": "rail2", "mlx5_4": "rail3", "mlx5_5": "rail4",
		"mlx5_7": "rail5", "mlx5_8": "rail6", "mlx5_9": "rail7", "mlx5_10": "rail10", "mlx5_11": "rail10", "mlx5_12": "rail8"}
	tests := []struct {
		ranks     int
		m         map[string]string
		hcas, rls []string
		bad       bool
	}{
		{ranks: 3, hcas: []string{"mlx5_0", "mlx5_1", "mlx5_2"}, rls: []string{"rail0", "rail1", "rail2"}},
		{ranks: 3, m: hgx, hcas: []string{"mlx5_0", "mlx5_2", "mlx5_3"}, rls: []string{"rail0", "rail1", "rail2"}},
		{ranks: 8, m: hgx, hcas: []string{"mlx5_0", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_7", "mlx5_8", "mlx5_9"},
			rls: []string{"rail0", "rail1", "rail2", "rail3", "rail4", "rail5", "rail6", "rail7"}},
		{ranks: 2, m: map[string]string{"a": "r", "b": "r"}, bad: true},
	}
	for _, tt := range tests {
		hcas, rails, err := nodeRails(tt.ranks, tt.m)
		if (err != nil) != tt.bad || !slices.Equal(hcas, tt.hcas) || !slices.Equal(rails, tt.rls) {
			t.Errorf("nodeRails(%d, %v) = %v, %v, %v; want %v, %v", tt.ranks, tt.m, hcas, rails, err, tt.hcas, tt.rls)
		}
	}
	// rail10 sorts after rail8, and its first HCA by name is mlx5_10.
	hcas, rails, err := nodeRails(10, hgx)
	if err != nil || rails[8] != "rail8" || rails[9] != "rail10" || hcas[9] != "mlx5_10" {
		t.Errorf("nodeRails(10) = %v, %v, %v", hcas, rails, err)
	}
}

func TestCheckBeforeWork(t *testing.T) {
	ok := RunOptions{Device: "host", Ranks: 2, Bytes: 1, Pattern: "cross-rail"}
	if err := ok.Check(); err != nil {
		t.Fatalf("Check(%+v) = %v", ok, err)
	}
	dir := t.TempDir()
	tests := []struct {
		change func(*RunOptions)
		want   string
	}{
		{func(o *RunOptions) { o.Pattern = "ring" }, `--pattern "ring": want cross-rail, fan-in, same-rail, all-to-all or kv`},
		{func(o *RunOptions) { o.JSON = dir + "/no/x.json" }, "--json " + dir + "/no/x.json"},
		{func(o *RunOptions) { o.JSON = dir }, "is a folder"},
		{func(o *RunOptions) { o.Ranks = 1 }, "--ranks 1"},
		{func(o *RunOptions) { o.RailMap = map[string]string{"mlx5_0": "rail0"} }, "--rail-map has 1 rails"},
		{func(o *RunOptions) {
			o.Pattern, o.KV = "kv", KVOptions{Shape: "huge", Traffic: "fan-in", Requests: 1, Inflight: 1}
		}, `--kv-shape "huge"`},
	}
	for _, tt := range tests {
		o := ok
		tt.change(&o)
		if err := o.Check(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Check(%+v) = %v, want %q", o, err, tt.want)
		}
	}
	o := ok
	o.JSON = dir + "/x.json"
	if err := o.Check(); err != nil {
		t.Errorf("Check with --json in a writable folder: %v", err)
	}
}
