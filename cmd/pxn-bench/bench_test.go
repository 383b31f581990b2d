// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/bench"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

var benchBin string

// TestMain builds pxn-bench once; the tests run it as a user would, every
// rank and target a separate process.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pxn-bench-test-")
	if err != nil {
		panic(err)
	}
	benchBin = filepath.Join(dir, "pxn-bench")
	out, err := exec.Command("go", "build", "-o", benchBin, ".").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		panic("build pxn-bench: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func runBench(t *testing.T, args ...string) []bench.Row {
	t.Helper()
	return runBenchEnv(t, nil, args...)
}

// runBenchEnv is runBench with env added to the ranks' environment.
func runBenchEnv(t *testing.T, env []string, args ...string) []bench.Row {
	t.Helper()
	out := filepath.Join(t.TempDir(), "rows.json")
	// A healthy run must not fall back; on a starved test machine the 1 s
	// default credit timeout can fire, so the healthy cases allow a minute.
	cmd := exec.Command(benchBin, append([]string{"run", "--device", "host", "--credit-timeout", "60000", "--json", out}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pxn-bench %v: %v\n%s", args, err, b)
	}
	t.Logf("pxn-bench %v:\n%s", args, b)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rows []bench.Row
	if err := json.Unmarshal(data, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 2 {
		t.Fatalf("%d rows", len(rows))
	}
	return rows
}

func TestBenchHealthyPaths(t *testing.T) {
	cases := []struct {
		name        string
		args        []string
		wantRelayed uint64
	}{
		{"same-rail direct", []string{"--ranks", "2", "--bytes", "8MiB", "--pattern", "same-rail"}, 0},
		{"cross-rail 10KiB", []string{"--ranks", "2", "--bytes", "10KiB", "--pattern", "cross-rail"}, 2 * 10 << 10},
		{"cross-rail 8MiB-1", []string{"--ranks", "2", "--bytes", "8388607", "--pattern", "cross-rail"}, 2 * (8<<20 - 1)},
		{"cross-rail 8MiB", []string{"--ranks", "2", "--bytes", "8MiB", "--pattern", "cross-rail"}, 2 * 8 << 20},
		{"cross-rail 8MiB+1", []string{"--ranks", "2", "--bytes", "8388609", "--pattern", "cross-rail"}, 2 * (8<<20 + 1)},
		{"ring rounds 300MiB of 64KiB blocks", []string{"--ranks", "2", "--bytes", "300MiB", "--block", "64KiB", "--pattern", "cross-rail"}, 2 * 300 << 20},
		{"seven senders, one relay", []string{"--ranks", "8", "--bytes", "40MiB", "--pattern", "fan-in"}, 7 * 40 << 20},
		{"all-to-all", []string{"--ranks", "4", "--bytes", "24MiB", "--pattern", "all-to-all"}, 4 * 24 << 20},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows := runBench(t, c.args...)
			main, base := rows[0], rows[1]
			if !main.Verified || !base.Verified || main.Failed != 0 || base.Failed != 0 {
				t.Fatalf("not verified or failed tasks: %+v / %+v", main, base)
			}
			if main.RelayedBytes != c.wantRelayed {
				t.Errorf("relayed %d bytes, want %d", main.RelayedBytes, c.wantRelayed)
			}
			if main.FallbackBytes != 0 {
				t.Errorf("healthy run fell back %d bytes", main.FallbackBytes)
			}
			if main.RelayedBytes+main.DirectBytes != main.Bytes {
				t.Errorf("relayed %d + direct %d != %d bytes", main.RelayedBytes, main.DirectBytes, main.Bytes)
			}
		})
	}
}

// TestBenchAllocPass runs the PXN phase's transfer twice and reports the
// allocations of the warm pass, counted over its own Pieces.
func TestBenchAllocPass(t *testing.T) {
	rows := runBench(t, "--ranks", "2", "--bytes", "64MiB", "--pattern", "cross-rail", "--alloc-pass", "--first-piece", "8MiB")
	if !rows[0].Verified || rows[0].Failed != 0 || rows[0].FallbackBytes != 0 {
		t.Fatalf("main row %+v", rows[0])
	}
	var allocs *bench.Row
	for i := range rows {
		if strings.HasPrefix(rows[i].Scenario, "P5 heap allocations per piece, second pass") {
			allocs = &rows[i]
		}
	}
	// Each of the two ranks sends 8 Pieces, and relays those of the other
	// that arrive before its own pass ends.
	if allocs == nil || allocs.Pieces < 16 || allocs.Pieces > 32 {
		t.Fatalf("no second-pass allocation row over 16..32 Pieces: %+v", rows)
	}
	// The warm pass has fixed costs per process (the runtime starting
	// threads, the harness's own bookkeeping) but none per Piece; a few
	// hundred over 32 Pieces would mean the steady state allocates.
	if allocs.Value > 8 {
		t.Errorf("%.2f heap allocations per Piece in the warm pass", allocs.Value)
	}
}

// TestBenchKV runs KV-shaped requests end to end on the host path: scattered
// blocks through PXN and through the hop alone, every byte of every target
// pool checked, and per-request completion times reported.
func TestBenchKV(t *testing.T) {
	cases := []struct {
		name        string
		args        []string
		wantRelayed uint64
		// wantPieces follows the planner: by default (no ramp) a 4 MiB
		// request is one Piece; with a 256 KiB ramp on an idle lane (one
		// in flight) it is Pieces of 256 KiB, 512 KiB, 1 MiB, 2 MiB and
		// 256 KiB; a 256 KiB one is one Piece either way.
		wantPieces uint64
	}{
		{"kv-small 1 to 1", []string{"--ranks", "2", "--kv-shape", "kv-small", "--kv-requests", "3", "--kv-inflight", "1"}, 3 * 32 * 2 * 4 * 16 << 10, 3},
		{"kv-small 1 to 1 with a 256 KiB ramp", []string{"--ranks", "2", "--kv-shape", "kv-small", "--kv-requests", "3", "--kv-inflight", "1", "--first-piece", "256KiB"}, 3 * 32 * 2 * 4 * 16 << 10, 3 * 5},
		{"all-to-all, 4 KiB blocks", []string{"--ranks", "3", "--kv-traffic", "all-to-all", "--kv-shape", "4x8x4KiB", "--kv-requests", "2"}, 3 * 2 * 2 * 4 * 2 * 8 * 4 << 10, 3 * 2 * 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows := runBench(t, append([]string{"--pattern", "kv"}, c.args...)...)
			main, base := rows[0], rows[1]
			if !main.Verified || !base.Verified || main.Failed != 0 || base.Failed != 0 {
				t.Fatalf("not verified or failed tasks: %+v / %+v", main, base)
			}
			if main.RelayedBytes != c.wantRelayed || main.FallbackBytes != 0 || base.DirectBytes != c.wantRelayed {
				t.Errorf("relayed %d, fallback %d, direct baseline %d bytes; want %d relayed and sent direct", main.RelayedBytes, main.FallbackBytes, base.DirectBytes, c.wantRelayed)
			}
			if main.Pieces != c.wantPieces {
				t.Errorf("%d Pieces, want %d", main.Pieces, c.wantPieces)
			}
			if main.Ratio <= 0 || main.BaselineGBps != base.GBps {
				t.Errorf("ratio %.3f against %.3f GB/s, want a ratio against the direct row's %.3f", main.Ratio, main.BaselineGBps, base.GBps)
			}
			seen := map[string]float64{}
			for _, r := range rows {
				if strings.HasPrefix(r.Scenario, "request completion") {
					seen[r.Scenario] = r.Value
				}
			}
			for _, want := range []string{"through PXN, p50", "through PXN, p99", "direct, p50", "direct, p99"} {
				if v, ok := seen["request completion "+want]; !ok || v <= 0 {
					t.Errorf("row %q: %v (present %v)", want, v, ok)
				}
			}
		})
	}
}

// TestBenchFanInFairness runs seven senders into one relay with equal
// demand, with a second hop of one Piece at a time and of four, and judges
// the relay's order, not the senders' rates (those depend on how busy the
// machine is; pxn-bench reports them as the P12 row, a benchmark): the
// relay must take Pieces while other lanes wait, and never one out of turn.
// A fixed lane order (lane 0 first in every pass) takes lane 0's Pieces
// out of turn as soon as two lanes wait.
func TestBenchFanInFairness(t *testing.T) {
	for _, depth := range []string{"1", "4"} {
		t.Run("inflight depth "+depth, func(t *testing.T) {
			rows := runBenchEnv(t, []string{contract.EnvInflightDepth + "=" + depth},
				"--ranks", "8", "--bytes", "24MiB", "--block", "1MiB", "--per-submit", "1", "--pattern", "fan-in")
			if main := rows[0]; !main.Verified || main.Failed != 0 || main.FallbackBytes != 0 {
				t.Fatalf("main row %+v", main)
			}
			senders := 0
			byScenario := map[string]bench.Row{}
			for _, r := range rows {
				if strings.HasPrefix(r.Scenario, "fan-in sender rank ") {
					senders++
				}
				byScenario[r.Scenario] = r
			}
			_, fair := byScenario["P12 fan-in fairness: slowest sender over the mean"]
			contended, okc := byScenario["fan-in relay: Pieces taken while another lane had a ticket ready"]
			outOfTurn, oko := byScenario["fan-in relay: Pieces taken out of turn"]
			if senders != 7 || !fair || !okc || !oko {
				t.Fatalf("%d sender rows, P12 row %v, turn rows %v %v; want 7 and all three", senders, fair, okc, oko)
			}
			// Seven senders of 24 Pieces each keep the relay's lanes full:
			// a run in which no Piece met another lane's ticket judged
			// nothing.
			if contended.Value < 1 {
				t.Fatalf("the relay never took a Piece while another lane waited (%s)", contended.Note)
			}
			if outOfTurn.Value != 0 {
				t.Errorf("the relay took %v Pieces out of turn (of %v taken while another lane waited)", outOfTurn.Value, contended.Value)
			}
		})
	}
}

// --hold-after keeps the engine phase's ranks registered after their last
// step, their counters published for a scraper to read.
func TestBenchHoldsRanksForScrapers(t *testing.T) {
	root, err := os.MkdirTemp("/dev/shm", "pxn-bench-hold-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	cmd := exec.Command(benchBin, "run", "--device", "host", "--ranks", "2", "--bytes", "1MiB", "--credit-timeout", "60000",
		"--registry-root", root, "--hold-after", "15s")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	go func() {
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			t.Log(s.Text())
			if strings.Contains(s.Text(), "stay registered for 15s (--hold-after)") {
				close(held)
			}
		}
	}()
	select {
	case <-held:
	case <-time.After(5 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("pxn-bench never said it holds its ranks")
	}
	// Within the hold: both ranks registered, live, their counters
	// showing what each relayed through the other: its megabyte and the
	// 10 KiB write after the idle window. They publish with their
	// heartbeat (an idle one every 600 ms); the 10 s bound is within the
	// hold.
	const want = 2 * (1<<20 + 10<<10)
	regs, err := filepath.Glob(filepath.Join(root, "pxn-bench-registry-*"))
	if err != nil || len(regs) != 1 {
		t.Fatalf("registry folders %v (%v), want one", regs, err)
	}
	var relayed uint64
	var ranks []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		groups, err := inspect.Root(regs[0], time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		relayed, ranks = 0, nil
		for _, g := range groups {
			for _, r := range g.Ranks {
				if r.State == "READY" && r.Stats != nil {
					ranks = append(ranks, r.File)
					relayed += r.Stats.RelayedBytes
				}
			}
		}
		if len(ranks) == 2 && relayed == want || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(ranks) != 2 || relayed != want {
		t.Errorf("ranks %v held, %d bytes relayed in their counters; want 2 ranks and %d bytes", ranks, relayed, want)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("pxn-bench: %v\n%s", err, stdout.String())
	}
	if left, _ := filepath.Glob(filepath.Join(root, "pxn-bench-registry-*")); len(left) != 0 {
		t.Errorf("registry folders left after the run: %v", left)
	}
}
