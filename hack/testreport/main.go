// SPDX-License-Identifier: Apache-2.0

// Command testreport reads `go test -json` on its input and prints what a
// plain `go test` prints (each package's ok, FAIL or "no test files" line,
// and the output of failing tests and failing packages) as it comes, then,
// at the end, every test that skipped with its package and the message it
// skipped with, and a count of passed, failed and skipped tests. The input
// may hold several go test runs one after another (make test runs the
// allocation tests again without the race detector, and every benchmark
// once): a test that skipped in one run and passed in a later one is not
// listed, and a package failed when any of its runs failed. It exits 1
// when a test, a benchmark, a package or a build failed, or when the input
// ended before a package did.
//
// Benchmarks are counted apart from tests. go test -json gives a
// benchmark that fails or skips an event that says so, but one that passes
// none: a benchmark passed when the next benchmark that is not one of its
// own sub-benchmarks starts, when it printed its result line, or when its
// package passed.
//
//	go test -json ./... | testreport -save _output/test.json
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
)

// event is the part of a test2json event that the report reads.
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

// skip is one test that skipped and the lines of its skip message.
type skip struct {
	pkg, test string
	why       []string
}

// pkgState is what a package still holds back: its own output and the output
// of its tests that have not ended, which go test prints only on failure.
type pkgState struct {
	out   []string
	tests map[string][]string
	order []string
	// benches are the benchmarks that started and have not ended, each
	// after its parent.
	benches []string
	ended   bool
}

type report struct {
	w        io.Writer
	pkgs     map[string]*pkgState
	pkgOrder []string
	skips    []skip
	// ranLater counts skips that a later run of the same test passed.
	ranLater int

	passed, failed           int
	benchPassed, benchFailed int
	// result is each package's outcome over its runs: "ok", "FAIL" (any
	// run failed) or "?" (no test files).
	result      map[string]string
	buildFailed bool
	badLines    int
}

func newReport(w io.Writer) *report {
	return &report{w: w, pkgs: map[string]*pkgState{}, result: map[string]string{}}
}

func (r *report) pkg(name string) *pkgState {
	p, ok := r.pkgs[name]
	if !ok {
		p = &pkgState{tests: map[string][]string{}}
		r.pkgs[name] = p
		r.pkgOrder = append(r.pkgOrder, name)
	}
	return p
}

// line reads one line of input. A line that is not a test2json event (go
// itself saying something went wrong) is printed as it is.
func (r *report) line(b []byte) {
	var ev event
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &ev) != nil || ev.Action == "" {
		r.badLines++
		fmt.Fprintf(r.w, "%s\n", b)
		return
	}
	r.event(ev)
}

func (r *report) event(ev event) {
	switch ev.Action {
	case "build-output":
		fmt.Fprint(r.w, ev.Output)
		return
	case "build-fail":
		r.buildFailed = true
		return
	}
	if ev.Package == "" {
		return
	}
	p := r.pkg(ev.Package)
	if ev.Test != "" {
		r.testEvent(p, ev)
		return
	}
	switch ev.Action {
	case "start":
		p.ended = false
	case "output":
		if closing(ev.Package, ev.Output) {
			if strings.HasPrefix(ev.Output, "FAIL") {
				r.flush(ev.Package, p)
			}
			fmt.Fprint(r.w, ev.Output)
			return
		}
		p.out = append(p.out, ev.Output)
	case "pass":
		p.ended = true
		r.benchmarksEnded(p, ev.Package, func(string) bool { return true })
		if r.result[ev.Package] != "FAIL" {
			r.result[ev.Package] = "ok"
		}
	case "skip":
		p.ended = true
		if r.result[ev.Package] == "" {
			r.result[ev.Package] = "?"
		}
	case "fail":
		p.ended = true
		r.flush(ev.Package, p)
		r.result[ev.Package] = "FAIL"
	}
}

func isBenchmark(test string) bool { return strings.HasPrefix(test, "Benchmark") }

// benchmarksEnded counts as passed, and forgets the output of, the
// benchmarks of p that have not ended and for which passed is true.
func (r *report) benchmarksEnded(p *pkgState, pkg string, passed func(name string) bool) {
	p.benches = slices.DeleteFunc(p.benches, func(name string) bool {
		if !passed(name) {
			return false
		}
		delete(p.tests, name)
		r.benchPassed++
		r.ranAgain(pkg, name)
		return true
	})
}

// printedResult reports whether lines hold benchmark name's result line
// (its name, the procs suffix, the iteration count), which the testing
// package prints once the benchmark has run to its end.
func printedResult(name string, lines []string) bool {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(-\d+)?\s+\d+\t`)
	return re.MatchString(strings.Join(lines, ""))
}

func (r *report) testEvent(p *pkgState, ev event) {
	bench := isBenchmark(ev.Test)
	switch ev.Action {
	case "run":
		if bench {
			r.benchmarksEnded(p, ev.Package, func(name string) bool { return !strings.HasPrefix(ev.Test, name+"/") })
			p.benches = append(p.benches, ev.Test)
		}
		return
	case "output":
		// In -json mode a benchmark's name comes alone on a line as it
		// starts, framing that a plain go test does not print.
		if bench && ev.Output == ev.Test+"\n" {
			return
		}
		if _, ok := p.tests[ev.Test]; !ok {
			p.order = append(p.order, ev.Test)
		}
		p.tests[ev.Test] = append(p.tests[ev.Test], ev.Output)
		return
	case "pass", "skip", "fail":
	default:
		return
	}
	lines := p.tests[ev.Test]
	delete(p.tests, ev.Test)
	if bench {
		p.benches = slices.DeleteFunc(p.benches, func(name string) bool { return name == ev.Test })
	}
	switch ev.Action {
	case "pass":
		r.passed++
		r.ranAgain(ev.Package, ev.Test)
	case "skip":
		why := skipMessage(lines)
		if !slices.ContainsFunc(r.skips, func(s skip) bool {
			return s.pkg == ev.Package && s.test == ev.Test && slices.Equal(s.why, why)
		}) {
			r.skips = append(r.skips, skip{pkg: ev.Package, test: ev.Test, why: why})
		}
	case "fail":
		if bench {
			r.benchFailed++
		} else {
			r.failed++
		}
		// A failed subtest's lines go to its parent, so that they print
		// together with the parent's own when it ends, in the order they came.
		if i := strings.LastIndexByte(ev.Test, '/'); i > 0 {
			if parent, ok := p.tests[ev.Test[:i]]; ok {
				p.tests[ev.Test[:i]] = append(parent, lines...)
				return
			}
		}
		r.print(lines)
	}
}

// ranAgain forgets the skips of a test that a later run passed.
func (r *report) ranAgain(pkg, test string) {
	n := len(r.skips)
	r.skips = slices.DeleteFunc(r.skips, func(s skip) bool { return s.pkg == pkg && s.test == test })
	r.ranLater += n - len(r.skips)
}

// flush prints what a failing package held back: the output of tests that
// never ended (a panic or a timeout killed them) and its own lines. A
// benchmark that printed its result line ran to its end and passed.
func (r *report) flush(pkg string, p *pkgState) {
	r.benchmarksEnded(p, pkg, func(name string) bool { return printedResult(name, p.tests[name]) })
	p.benches = nil
	for _, name := range p.order {
		if lines, ok := p.tests[name]; ok {
			r.print(lines)
			delete(p.tests, name)
		}
	}
	p.order = nil
	r.print(p.out)
	p.out = nil
}

// print writes lines without the framing that -json adds and a plain go
// test does not print (=== RUN, PAUSE, CONT, NAME).
func (r *report) print(lines []string) {
	for _, l := range lines {
		if framing(l) {
			continue
		}
		fmt.Fprint(r.w, l)
	}
}

func framing(l string) bool {
	for _, f := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME"} {
		if strings.HasPrefix(l, f) {
			return true
		}
	}
	return false
}

// closing reports whether l is go test's line for the whole package: "ok",
// "FAIL" or "?" followed by the package's path.
func closing(pkg, l string) bool {
	f := strings.Fields(l)
	return len(f) >= 2 && (f[0] == "ok" || f[0] == "FAIL" || f[0] == "?") && f[1] == pkg
}

var logLine = regexp.MustCompile(`^\s*[^\s:]+\.go:\d+: `)

// skipMessage returns the lines of the last message a skipped test logged,
// which is the one t.Skip gave (with the lines that continue it), or
// "(no message)" for t.SkipNow.
func skipMessage(lines []string) []string {
	var kept []string
	for _, l := range lines {
		if framing(l) || strings.HasPrefix(strings.TrimSpace(l), "--- SKIP:") {
			continue
		}
		kept = append(kept, strings.TrimRight(l, "\n"))
	}
	last := -1
	for i, l := range kept {
		if logLine.MatchString(l) {
			last = i
		}
	}
	if last < 0 {
		return []string{"(no message)"}
	}
	why := kept[last:]
	for i := range why {
		why[i] = strings.TrimSpace(why[i])
	}
	return why
}

// maxWhyLines bounds how many lines of one skip message the table shows.
const maxWhyLines = 4

// finish prints the skip table and the counts, and reports whether the run
// passed.
func (r *report) finish(saved string) bool {
	var unended []string
	for _, name := range r.pkgOrder {
		p := r.pkgs[name]
		if !p.ended {
			r.flush(name, p)
			unended = append(unended, name)
		}
	}

	fmt.Fprintln(r.w)
	if len(r.skips) == 0 {
		fmt.Fprintln(r.w, "skipped tests: none")
	} else {
		where := ""
		if saved != "" {
			where = "; every line of them is in " + saved
		}
		fmt.Fprintf(r.w, "skipped tests: %d (package, test, the message it skipped with%s)\n", len(r.skips), where)
		slices.SortStableFunc(r.skips, func(a, b skip) int { return strings.Compare(a.pkg, b.pkg) })
		tw := tabwriter.NewWriter(r.w, 0, 0, 2, ' ', 0)
		for _, s := range r.skips {
			for i, l := range s.why {
				if i == maxWhyLines {
					fmt.Fprintf(tw, "\t\t… %d more lines\n", len(s.why)-i)
					break
				}
				if i == 0 {
					fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.pkg, s.test, l)
				} else {
					fmt.Fprintf(tw, "\t\t%s\n", l)
				}
			}
		}
		tw.Flush()
	}

	if r.ranLater > 0 {
		fmt.Fprintf(r.w, "not listed: %d skipped test(s) that a later run passed (make test runs the allocation tests again without the race detector)\n", r.ranLater)
	}
	var failedPkgs []string
	count := map[string]int{}
	for _, name := range r.pkgOrder {
		count[r.result[name]]++
		if r.result[name] == "FAIL" {
			failedPkgs = append(failedPkgs, name)
		}
	}
	benchSkipped := 0
	for _, s := range r.skips {
		if isBenchmark(s.test) {
			benchSkipped++
		}
	}
	fmt.Fprintf(r.w, "tests: %d passed, %d failed, %d skipped; packages: %d ok, %d failed, %d without tests\n",
		r.passed, r.failed, len(r.skips)-benchSkipped, count["ok"], count["FAIL"], count["?"])
	if r.benchPassed+r.benchFailed+benchSkipped > 0 {
		fmt.Fprintf(r.w, "benchmarks: %d passed, %d failed, %d skipped\n", r.benchPassed, r.benchFailed, benchSkipped)
	}
	ok := true
	if len(failedPkgs) > 0 {
		fmt.Fprintf(r.w, "FAIL: %s\n", strings.Join(failedPkgs, " "))
		ok = false
	}
	if len(unended) > 0 {
		fmt.Fprintf(r.w, "FAIL: the output ended before these packages did: %s\n", strings.Join(unended, " "))
		ok = false
	}
	if r.failed > 0 || r.benchFailed > 0 || r.buildFailed {
		ok = false
	}
	return ok
}

func run(in io.Reader, out io.Writer, save string) (bool, error) {
	if save != "" {
		f, err := os.Create(save)
		if err != nil {
			return false, fmt.Errorf("save the go test -json output: %w", err)
		}
		defer f.Close()
		in = io.TeeReader(in, f)
	}
	r := newReport(out)
	br := bufio.NewReader(in)
	for {
		b, err := br.ReadBytes('\n')
		if len(b) > 0 {
			r.line([]byte(strings.TrimRight(string(b), "\r\n")))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return false, fmt.Errorf("read go test -json output: %w", err)
		}
	}
	return r.finish(save), nil
}

func main() {
	save := flag.String("save", "", "also write the input, unchanged, to this file")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: go test -json ./... | testreport [-save FILE]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	ok, err := run(os.Stdin, os.Stdout, *save)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}
