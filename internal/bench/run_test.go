// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"slices"
	"strings"
	"testing"
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
