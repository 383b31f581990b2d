// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"slices"
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
