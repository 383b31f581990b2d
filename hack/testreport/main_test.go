// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testdata/run.json is the real `go test -json ./...` output of a module with
// a package that passes, one whose tests skip (one with a two-line message),
// one with a failing subtest and a t.SkipNow, one whose test panics, one that
// does not compile and one without tests. testdata/timeout.json is a package
// killed by -timeout while a test hung. testdata/race-then-allocs.json is a
// package run with -race, where its allocation test skips, then again
// without it, where the test passes. testdata/bench.json is `go test -json
// -run '^$' -bench . -benchtime 1x ./...` of a package whose benchmarks
// pass, skip, and fail in one sub-benchmark of two, one whose benchmarks
// (one with sub-benchmarks) all pass, and one whose second benchmark
// panics. Paths in them are rewritten to /src and /goroot.

func runOn(t *testing.T, input []byte) (string, bool) {
	t.Helper()
	var out bytes.Buffer
	ok, err := run(bytes.NewReader(input), &out, "")
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), ok
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// inOrder fails unless every want line is a line of out, in this order.
func inOrder(t *testing.T, out string, want ...string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	i := 0
	for _, w := range want {
		j := slices.Index(lines[i:], w)
		if j < 0 {
			t.Fatalf("line %q missing (or out of order) in:\n%s", w, out)
		}
		i += j + 1
	}
}

func TestRealRun(t *testing.T) {
	out, ok := runOn(t, readFile(t, "run.json"))
	if ok {
		t.Errorf("a run with a failed build, a failed test and a panic reported success:\n%s", out)
	}
	inOrder(t, out,
		`broken/b_test.go:5:40: cannot use "s" (untyped string constant) as int value in variable declaration`,
		"FAIL\texample.com/tr/broken [build failed]",
		"    f_test.go:6: got 1, want 2",
		"--- FAIL: TestBad/inner (0.00s)",
		"--- FAIL: TestBad (0.00s)",
		"FAIL",
		"FAIL\texample.com/tr/fail\t0.008s",
		"?   \texample.com/tr/notests\t[no test files]",
		"--- FAIL: TestPanics (0.00s)",
		"panic: assignment to entry in nil map [recovered, repanicked]",
		"\t/src/tr/panicky/x_test.go:8 +0x28",
		"FAIL\texample.com/tr/panicky\t0.007s",
		"ok  \texample.com/tr/pass\t0.006s",
		"ok  \texample.com/tr/skip\t0.007s",
		"skipped tests: 3 (package, test, the message it skipped with)",
		"  example.com/tr/fail  TestSkipped     (no message)",
		"  example.com/tr/skip  TestNeedsThing  s_test.go:7: no thing at /opt/thing: install it",
		"  example.com/tr/skip  TestSub/skips   s_test.go:11: needs root:",
		"                                       second line",
		"tests: 9 passed, 3 failed, 3 skipped; packages: 2 ok, 3 failed, 1 without tests",
		"FAIL: example.com/tr/broken example.com/tr/fail example.com/tr/panicky",
	)
	// What a plain go test leaves out: passing tests' logs, the framing
	// -json adds, a passing package's PASS line.
	for _, l := range strings.Split(out, "\n") {
		if l == "PASS" || strings.Contains(l, "hello") || strings.Contains(l, "looking for the thing") ||
			strings.Contains(l, "=== RUN") || strings.Contains(l, "--- PASS") {
			t.Errorf("line %q printed; a plain go test would not:\n%s", l, out)
		}
	}
}

// keepPackages returns the events of input that belong to the given packages.
func keepPackages(input []byte, pkgs ...string) []byte {
	var out []byte
	for _, l := range bytes.SplitAfter(input, []byte("\n")) {
		for _, p := range pkgs {
			if bytes.Contains(l, []byte(`"Package":"`+p+`"`)) {
				out = append(out, l...)
				break
			}
		}
	}
	return out
}

func TestPassingRun(t *testing.T) {
	out, ok := runOn(t, keepPackages(readFile(t, "run.json"), "example.com/tr/pass", "example.com/tr/skip", "example.com/tr/notests"))
	if !ok {
		t.Errorf("a run with passes and skips only reported failure:\n%s", out)
	}
	if strings.Contains(out, "FAIL") {
		t.Errorf("FAIL printed for a passing run:\n%s", out)
	}
	inOrder(t, out,
		"ok  \texample.com/tr/pass\t0.006s",
		"ok  \texample.com/tr/skip\t0.007s",
		"skipped tests: 2 (package, test, the message it skipped with)",
		"tests: 7 passed, 0 failed, 2 skipped; packages: 2 ok, 0 failed, 1 without tests",
	)
}

func TestNoSkips(t *testing.T) {
	out, ok := runOn(t, keepPackages(readFile(t, "run.json"), "example.com/tr/pass"))
	if !ok {
		t.Errorf("a passing run reported failure:\n%s", out)
	}
	inOrder(t, out, "skipped tests: none", "tests: 4 passed, 0 failed, 0 skipped; packages: 1 ok, 0 failed, 0 without tests")
}

func TestTimeout(t *testing.T) {
	out, ok := runOn(t, readFile(t, "timeout.json"))
	if ok {
		t.Errorf("a package killed by -timeout reported success:\n%s", out)
	}
	inOrder(t, out,
		"    h_test.go:10: waiting for a reply that never comes",
		"panic: test timed out after 1s",
		"example.com/tr/hang.TestHangs(0x346d91356908?)",
		"FAIL\texample.com/tr/hang\t1.007s",
		"tests: 1 passed, 0 failed, 0 skipped; packages: 0 ok, 1 failed, 0 without tests",
		"FAIL: example.com/tr/hang",
	)
}

// A stream cut short (go test killed) fails and prints what the package held.
func TestTruncated(t *testing.T) {
	in := readFile(t, "run.json")
	cut := bytes.Index(in, []byte(`"Test":"TestSub/skips","Output":"--- SKIP`))
	if cut < 0 {
		t.Fatal("fixture changed: no TestSub/skips SKIP line")
	}
	cut = bytes.LastIndexByte(in[:cut], '\n') + 1
	out, ok := runOn(t, in[:cut])
	if ok {
		t.Errorf("a stream that ended inside a package reported success:\n%s", out)
	}
	inOrder(t, out,
		"    s_test.go:11: needs root:",
		"FAIL: the output ended before these packages did: example.com/tr/skip",
	)
}

func TestNotJSON(t *testing.T) {
	in := append([]byte("go: updates to go.mod needed; to update it:\n"), keepPackages(readFile(t, "run.json"), "example.com/tr/pass")...)
	out, _ := runOn(t, in)
	if !strings.HasPrefix(out, "go: updates to go.mod needed; to update it:\n") {
		t.Errorf("a line that is not an event was not passed through:\n%s", out)
	}
}

func TestSave(t *testing.T) {
	in := readFile(t, "run.json")
	save := filepath.Join(t.TempDir(), "test.json")
	var out bytes.Buffer
	if _, err := run(bytes.NewReader(in), &out, save); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(save)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, in) {
		t.Errorf("saved %d bytes, want the %d bytes of input unchanged", len(got), len(in))
	}
	if !strings.Contains(out.String(), "every line of them is in "+save) {
		t.Errorf("the skip table does not name the saved file:\n%s", out.String())
	}
}

func TestSkipMessage(t *testing.T) {
	for _, tt := range []struct {
		name  string
		lines []string
		want  []string
	}{
		{"none", []string{"=== RUN   TestA\n", "--- SKIP: TestA (0.00s)\n"}, []string{"(no message)"}},
		{"after a log", []string{"=== RUN   TestA\n", "    a_test.go:3: looking\n", "    a_test.go:4: gone\n", "--- SKIP: TestA (0.00s)\n"}, []string{"a_test.go:4: gone"}},
		{"two lines", []string{"    a_test.go:4: needs root:\n", "        because\n", "    --- SKIP: TestA/b (0.00s)\n"}, []string{"a_test.go:4: needs root:", "because"}},
		{"paused", []string{"=== PAUSE TestA\n", "=== CONT  TestA\n", "    a_test.go:9: later\n", "--- SKIP: TestA (0.00s)\n"}, []string{"a_test.go:9: later"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := skipMessage(tt.lines); !slices.Equal(got, tt.want) {
				t.Errorf("skipMessage = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLongSkipMessage(t *testing.T) {
	var r bytes.Buffer
	rep := newReport(&r)
	rep.skips = []skip{{pkg: "p", test: "TestA", why: []string{"a.go:1: x", "1", "2", "3", "4", "5"}}}
	rep.finish("")
	var lines []string
	for _, l := range strings.Split(r.String(), "\n") {
		lines = append(lines, strings.TrimSpace(l))
	}
	inOrder(t, strings.Join(lines, "\n"), "p  TestA  a.go:1: x", "1", "2", "3", "… 2 more lines", "tests: 0 passed, 0 failed, 1 skipped; packages: 0 ok, 0 failed, 0 without tests")
	if slices.Contains(lines, "4") {
		t.Errorf("more than %d lines of a message printed:\n%s", maxWhyLines, r.String())
	}
}

func TestSkipThenPass(t *testing.T) {
	in := readFile(t, "race-then-allocs.json")
	out, ok := runOn(t, in)
	if !ok {
		t.Errorf("two passing runs reported failure:\n%s", out)
	}
	inOrder(t, out,
		"ok  \texample.com/tr/allocs\t1.016s",
		"ok  \texample.com/tr/allocs\t0.019s",
		"skipped tests: none",
		"not listed: 1 skipped test(s) that a later run passed (make test runs the allocation tests again without the race detector)",
		"tests: 2 passed, 0 failed, 0 skipped; packages: 1 ok, 0 failed, 0 without tests",
	)

	// The second run failing fails the package, and the skip of the first
	// run stays listed.
	lines := bytes.Split(bytes.TrimSpace(in), []byte("\n"))
	second := bytes.LastIndex(in, []byte(`"Action":"start"`))
	var failing []byte
	for _, l := range lines {
		if bytes.Index(in, l) > second && (bytes.Contains(l, []byte(`"Action":"pass"`))) {
			l = bytes.Replace(l, []byte(`"Action":"pass"`), []byte(`"Action":"fail"`), 1)
		}
		failing = append(append(failing, l...), '\n')
	}
	out, ok = runOn(t, failing)
	if ok {
		t.Errorf("a failing second run reported success:\n%s", out)
	}
	inOrder(t, out,
		"skipped tests: 1 (package, test, the message it skipped with)",
		"  example.com/tr/allocs  TestNothingAllocates  a_test.go:9: allocation counts are not meaningful under -race",
		"tests: 1 passed, 1 failed, 1 skipped; packages: 0 ok, 1 failed, 0 without tests",
		"FAIL: example.com/tr/allocs",
	)
}

func TestBenchmarks(t *testing.T) {
	out, ok := runOn(t, readFile(t, "bench.json"))
	if ok {
		t.Errorf("a run with a failed benchmark and a panic reported success:\n%s", out)
	}
	inOrder(t, out,
		"    b_test.go:28: 0 Pieces relayed: not a relay measurement",
		"--- FAIL: BenchmarkBroken/bad",
		"--- FAIL: BenchmarkBroken",
		"FAIL\texample.com/tr/bench\t0.043s",
		"ok  \texample.com/tr/benchok\t0.025s",
		"panic: assignment to entry in nil map",
		"FAIL\texample.com/tr/benchpanic\t0.015s",
		"skipped tests: 1 (package, test, the message it skipped with)",
		"  example.com/tr/bench  BenchmarkNeedsGPU  b_test.go:21: no GPU driver",
		"tests: 0 passed, 0 failed, 0 skipped; packages: 1 ok, 2 failed, 0 without tests",
		// Passed: Fast, Sizes and its two, Broken/ok and After (after the
		// failure, its result line printed), Copy and its two, Last, and
		// First (before the panic).
		"benchmarks: 11 passed, 2 failed, 1 skipped",
		"FAIL: example.com/tr/bench example.com/tr/benchpanic",
	)
	// A passing benchmark's result and logs stay in the saved stream, as
	// a passing test's logs do; so does the line with a benchmark's name
	// alone that -json adds.
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "ns/op") || strings.Contains(l, "setting up") || strings.HasPrefix(l, "Benchmark") {
			t.Errorf("line %q printed; it belongs to a passing benchmark or is -json's framing:\n%s", l, out)
		}
	}

	out, ok = runOn(t, keepPackages(readFile(t, "bench.json"), "example.com/tr/benchok"))
	if !ok {
		t.Errorf("a run of passing benchmarks reported failure:\n%s", out)
	}
	inOrder(t, out, "skipped tests: none", "benchmarks: 4 passed, 0 failed, 0 skipped")
}

// A run without benchmarks prints no benchmark line.
func TestNoBenchmarkLine(t *testing.T) {
	out, _ := runOn(t, readFile(t, "run.json"))
	if strings.Contains(out, "benchmarks:") {
		t.Errorf("a benchmark count printed for a run without benchmarks:\n%s", out)
	}
}
