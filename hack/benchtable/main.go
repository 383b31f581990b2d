// SPDX-License-Identifier: Apache-2.0

// Command benchtable reads `go test -bench` outputs of a baseline ("before")
// and of the current tree ("after"), one file per round, and prints a
// Markdown table of medians and ratios per benchmark.
//
//	benchtable -before 'runs/before-*.txt' -after 'runs/after-*.txt'
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// result is one benchmark line of `go test -bench`: its name without the
// "Benchmark" prefix and its values by unit.
type result struct {
	name   string
	values map[string]float64
}

// parse returns the benchmark lines of r in order. Other lines are skipped;
// a benchmark line whose value is not a number is an error.
func parse(r io.Reader) ([]result, error) {
	var out []result
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		// Name, iterations, then value and unit pairs.
		if len(f) < 4 || len(f)%2 != 0 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		res := result{name: strings.TrimPrefix(f[0], "Benchmark"), values: map[string]float64{}}
		for i := 2; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: value %q of %s: not a number", n, f[i], f[i+1])
			}
			res.values[f[i+1]] = v
		}
		out = append(out, res)
	}
	return out, sc.Err()
}

// side holds one side's values of every round: per benchmark, per unit.
type side struct {
	order  []string
	values map[string]map[string][]float64
	rounds map[string]int
}

func newSide() *side {
	return &side{values: map[string]map[string][]float64{}, rounds: map[string]int{}}
}

// add records the results of one round.
func (s *side) add(rs []result) {
	for _, r := range rs {
		if s.values[r.name] == nil {
			s.values[r.name] = map[string][]float64{}
			s.order = append(s.order, r.name)
		}
		for unit, v := range r.values {
			s.values[r.name][unit] = append(s.values[r.name][unit], v)
		}
		s.rounds[r.name]++
	}
}

// load reads every file matching pattern into a side.
func load(pattern string) (*side, error) {
	files, err := filepath.Glob(pattern)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no file matches %s", pattern)
	}
	s := newSide()
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		rs, err := parse(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if len(rs) == 0 {
			return nil, fmt.Errorf("%s: no benchmark results", name)
		}
		s.add(rs)
	}
	return s, nil
}

// median of xs; the mean of the two middle values when len(xs) is even.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 0 {
		return (s[m-1] + s[m]) / 2
	}
	return s[m]
}

// speedRatio is the median before ns/op over the median after ns/op: above 1
// the current tree is faster.
func speedRatio(before, after []float64) float64 {
	return median(before) / median(after)
}

// num formats a value with the precision `go test -bench` prints it with:
// four or five significant digits, no decimals from 999.95 up.
func num(v float64) string {
	decimals := 0
	for a := max(v, -v); a != 0 && a < 999.95 && decimals < 7; a *= 10 {
		decimals++
	}
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

// spread is "median (min–max)", or the median alone when all rounds agree.
func spread(xs []float64) string {
	if len(xs) == 0 {
		return "—"
	}
	lo, hi := slices.Min(xs), slices.Max(xs)
	if lo == hi {
		return num(lo)
	}
	return fmt.Sprintf("%s (%s–%s)", num(median(xs)), num(lo), num(hi))
}

// med is the median, or a dash when there is no value.
func med(xs []float64) string {
	if len(xs) == 0 {
		return "—"
	}
	return num(median(xs))
}

// render writes the table: one row per benchmark, in the order of the
// baseline's output, then any benchmark only the current tree has.
func render(w io.Writer, before, after *side) {
	names := slices.Clone(before.order)
	for _, n := range after.order {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	fmt.Fprintln(w, "| benchmark | rounds | ns/op before | ns/op after | speed ratio | MB/s before | MB/s after | allocs/piece | B/piece |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, n := range names {
		b, a := before.values[n], after.values[n]
		rounds := strconv.Itoa(before.rounds[n])
		if before.rounds[n] != after.rounds[n] {
			rounds = fmt.Sprintf("%d / %d", before.rounds[n], after.rounds[n])
		}
		ratio := "—"
		if len(b["ns/op"]) > 0 && len(a["ns/op"]) > 0 {
			ratio = strconv.FormatFloat(speedRatio(b["ns/op"], a["ns/op"]), 'f', 3, 64)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s → %s | %s → %s |\n",
			n, rounds, spread(b["ns/op"]), spread(a["ns/op"]), ratio,
			med(b["MB/s"]), med(a["MB/s"]),
			med(b["allocs/piece"]), med(a["allocs/piece"]),
			med(b["B/piece"]), med(a["B/piece"]))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Medians over the rounds, (min–max) when they differ; speed ratio = before ns/op ÷ after ns/op (above 1: after is faster).")
}

func main() {
	beforeGlob := flag.String("before", "", "files of the baseline's rounds (a glob)")
	afterGlob := flag.String("after", "", "files of the current tree's rounds (a glob)")
	flag.Parse()
	if *beforeGlob == "" || *afterGlob == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: benchtable -before GLOB -after GLOB")
		os.Exit(2)
	}
	before, err := load(*beforeGlob)
	if err != nil {
		fail(err)
	}
	after, err := load(*afterGlob)
	if err != nil {
		fail(err)
	}
	render(os.Stdout, before, after)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchtable:", err)
	os.Exit(1)
}
