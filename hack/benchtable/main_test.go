// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The testdata files are the raw outputs of one real two-round run of
// hack/bench-baseline.sh: before-N from the baseline, after-N from the
// current tree.

func TestParseRealOutput(t *testing.T) {
	f, err := os.Open("testdata/before-1.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs, err := parse(f)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"Transfer/10KiB-2", "Transfer/8MiB-2", "Transfer/1GiB-2", "CrossRailBlocks16KiB-2"}
	if len(rs) != len(names) {
		t.Fatalf("%d results, want %d: %+v", len(rs), len(names), rs)
	}
	for i, n := range names {
		if rs[i].name != n {
			t.Errorf("result %d is %q, want %q", i, rs[i].name, n)
		}
	}
	want := map[string]float64{"ns/op": 1579629, "MB/s": 6.48, "B/piece": 810.2, "allocs/piece": 19.12, "pieces/op": 1}
	if len(rs[0].values) != len(want) {
		t.Errorf("10KiB values %v, want %v", rs[0].values, want)
	}
	for unit, v := range want {
		if got, ok := rs[0].values[unit]; !ok || got != v {
			t.Errorf("10KiB %s = %v (present %v), want %v", unit, got, ok, v)
		}
	}
	if got := rs[3].values["B/piece"]; got != 273774 {
		t.Errorf("blocks B/piece = %v, want 273774", got)
	}
	if got := rs[2].values["pieces/op"]; got != 128 {
		t.Errorf("1GiB pieces/op = %v, want 128", got)
	}
}

func TestParseSkipsOtherLines(t *testing.T) {
	in := "goos: linux\nBenchmarkX-2 --- FAIL: BenchmarkX-2\nBenchmarkY-2\n--- BENCH: BenchmarkZ\nPASS\nok  \tpkg\t1.0s\n"
	rs, err := parse(strings.NewReader(in))
	if err != nil || len(rs) != 0 {
		t.Fatalf("parse = %+v, %v; want nothing, no error", rs, err)
	}
}

func TestParseRejectsBadValue(t *testing.T) {
	in := "BenchmarkX-2   10   12.5.1 ns/op   3 B/piece\n"
	if rs, err := parse(strings.NewReader(in)); err == nil {
		t.Fatalf("parse = %+v, want an error", rs)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{7}, 7},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(c.xs); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

func TestRatiosOfRealRun(t *testing.T) {
	before, after := loadTestdata(t)
	for _, c := range []struct {
		name string
		want float64
	}{
		// (1579629+1457711)/2 ÷ (1695374+1662209)/2
		{"Transfer/10KiB-2", 0.904620973},
		// (4296549+3885471)/2 ÷ (3957689+3527030)/2
		{"Transfer/8MiB-2", 1.093163284},
		// (31330191+33572315)/2 ÷ (29637827+66127495)/2
		{"CrossRailBlocks16KiB-2", 0.677724511},
	} {
		got := speedRatio(before.values[c.name]["ns/op"], after.values[c.name]["ns/op"])
		if math.Abs(got-c.want) > 1e-8 {
			t.Errorf("%s: speed ratio %.9f, want %.9f", c.name, got, c.want)
		}
	}
	if before.rounds["Transfer/1GiB-2"] != 2 || after.rounds["Transfer/1GiB-2"] != 2 {
		t.Errorf("rounds %d / %d, want 2 / 2", before.rounds["Transfer/1GiB-2"], after.rounds["Transfer/1GiB-2"])
	}
}

func TestRenderRealRun(t *testing.T) {
	before, after := loadTestdata(t)
	var buf bytes.Buffer
	render(&buf, before, after)
	lines := strings.Split(buf.String(), "\n")
	want := []string{
		"| Transfer/10KiB-2 | 2 | 1518670 (1457711–1579629) | 1678792 (1662209–1695374) | 0.905 | 6.750 | 6.100 | 19.11 → 19.11 | 801.0 → 811.0 |",
		"| Transfer/8MiB-2 | 2 | 4091010 (3885471–4296549) | 3742360 (3527030–3957689) | 1.093 | 2056 | 2249 | 19.22 → 19.19 | 784.0 → 798.5 |",
	}
	if len(lines) < 4 || lines[2] != want[0] || lines[3] != want[1] {
		t.Fatalf("table:\n%s\nwant rows 3 and 4:\n%s", buf.String(), strings.Join(want, "\n"))
	}
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "|") {
			n++
		}
	}
	if n != 6 {
		t.Errorf("%d table lines, want 6 (header, separator, four rows)", n)
	}
}

func TestRenderMissingSide(t *testing.T) {
	before, after := newSide(), newSide()
	before.add([]result{{name: "Old-2", values: map[string]float64{"ns/op": 10}}})
	after.add([]result{{name: "New-2", values: map[string]float64{"ns/op": 20}}})
	var buf bytes.Buffer
	render(&buf, before, after)
	for _, row := range []string{
		"| Old-2 | 1 / 0 | 10.00 | — | — |",
		"| New-2 | 0 / 1 | — | 20.00 | — |",
	} {
		if !strings.Contains(buf.String(), row) {
			t.Errorf("table lacks %q:\n%s", row, buf.String())
		}
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := load(filepath.Join(t.TempDir(), "*.txt")); err == nil {
		t.Error("load of no file: no error")
	}
	empty := filepath.Join(t.TempDir(), "empty.txt")
	if err := os.WriteFile(empty, []byte("PASS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := load(empty); err == nil {
		t.Error("load of a file without results: no error")
	}
}

func TestNum(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{
		{0, "0"}, {1518670, "1518670"}, {999.96, "1000"}, {801, "801.0"},
		{19.105, "19.11"}, {7.342, "7.342"}, {0.5, "0.5000"},
	} {
		if got := num(c.v); got != c.want {
			t.Errorf("num(%v) = %q, want %q", c.v, got, c.want)
		}
	}
}

func loadTestdata(t *testing.T) (before, after *side) {
	t.Helper()
	before, err := load("testdata/before-*.txt")
	if err != nil {
		t.Fatal(err)
	}
	after, err = load("testdata/after-*.txt")
	if err != nil {
		t.Fatal(err)
	}
	return before, after
}
