// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/bench"
)

// TestCLI runs the binary's help, version and usage errors as a user would.
func TestCLI(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing", "x.json")
	tests := []struct {
		args []string
		code int
		want []string
		// not: what the output must lack; a usage error starts no work.
		not []string
	}{
		{[]string{"-h"}, 0, []string{"Usage:", "pxn-bench [command]", "run ", "soak "}, nil},
		{[]string{"--help"}, 0, []string{"Available Commands:"}, nil},
		{[]string{"help"}, 0, []string{"Available Commands:"}, nil},
		{nil, 0, []string{"Available Commands:"}, nil},
		{[]string{"help", "run"}, 0, []string{"--device", "--pattern", "--registry-root", "--suite"}, nil},
		{[]string{"run", "-h"}, 0, []string{"--alloc-pass", "--credit-timeout", "--hold-after"}, nil},
		{[]string{"--version"}, 0, []string{"pxn-bench ", "revision"}, nil},
		{[]string{"frobnicate"}, 2, []string{`unknown command "frobnicate"`}, nil},
		{[]string{"run", "--frobnicate"}, 2, []string{"unknown flag: --frobnicate"}, nil},
		{[]string{"run", "extra"}, 2, []string{`takes no arguments`}, nil},
		{[]string{"run", "--bytes", "lots"}, 2, []string{`--bytes: size "lots"`}, nil},
		{[]string{"run", "--device", "tpu", "--ranks", "2", "--bytes", "1KiB"}, 2, []string{`--device "tpu": want host or cuda`}, nil},
		{[]string{"version"}, 0, []string{"pxn-bench ", "revision"}, nil},
		{[]string{"run", "--ranks", "2", "--bytes", "1KiB", "--json", missing}, 2, []string{"--json " + missing, "no such file or directory"}, []string{"host-memory path", "starting"}},
		{[]string{"run", "--ranks", "2", "--bytes", "1KiB", "--json", t.TempDir()}, 2, []string{"is a folder, want a file name"}, []string{"starting"}},
		{[]string{"soak", "--duration", "1s", "--json", missing}, 2, []string{"pxn-bench soak: --json " + missing}, nil},
		{[]string{"run", "--ranks", "2", "--pattern", "ring"}, 2, []string{`--pattern "ring": want cross-rail, fan-in, same-rail, all-to-all or kv`}, []string{"host-memory path"}},
		{[]string{"run", "--ranks", "2", "--pattern", "kv", "--bytes", "1MiB"}, 2, []string{"--bytes would be ignored: --pattern kv sizes its requests with --kv-shape"}, []string{"host-memory path"}},
		{[]string{"run", "--pattern", "kv", "--bytes", "1MiB", "--block", "4KiB"}, 2, []string{"--bytes, --block would be ignored"}, nil},
		{[]string{"run", "--pattern", "fan-in", "--kv-shape", "kv-large"}, 2, []string{"--kv-shape would be ignored", "--pattern fan-in moves --bytes per rank"}, nil},
		{[]string{"run", "--device", "cuda", "--suite", "p1", "--bytes", "1MiB"}, 2, []string{"--bytes would be ignored: --suite runs the scenarios"}, nil},
		{[]string{"run", "--ranks", "9"}, 2, []string{"--ranks 9: want 2..8"}, []string{"host-memory path"}},
		{[]string{"run", "--suite", "p1"}, 2, []string{"--suite: CUDA only, want --device cuda"}, nil},
		{[]string{"run", "--raw"}, 2, []string{"--raw", "--device cuda"}, nil},
		{[]string{"run", "--arena-share", "posix"}, 2, []string{`--arena-share: arena share "posix": want auto, ipc or fd`}, nil},
		{[]string{"help", "run"}, 0, []string{"--pidns", "--arena-share"}, nil},
		{[]string{"run", "--ranks", "2", "--pattern", "kv", "--kv-shape", "kv-huge"}, 2, []string{`--kv-shape "kv-huge": want one of kv-small, kv-medium, kv-large`}, nil},
		{[]string{"run", "--ranks", "2", "--pattern", "kv", "--kv-traffic", "ring"}, 2, []string{`--kv-traffic "ring"`}, nil},
		{[]string{"run", "--ranks", "2", "--pattern", "kv", "--latency", "10"}, 2, []string{"--pattern kv: --raw, --latency"}, nil},
		{[]string{"help", "run"}, 0, []string{"--kv-shape", "--kv-traffic", "--kv-requests", "--kv-inflight", "--first-piece"}, nil},
		{[]string{"run", "--first-piece", "2KiB"}, 2, []string{`--first-piece "2KiB": want a whole number of KiB from 4KiB to 8192KiB`}, nil},
		{[]string{"run", "--first-piece", "16MiB"}, 2, []string{`--first-piece "16MiB"`}, nil},
		{[]string{"run", "--first-piece", "5000"}, 2, []string{`--first-piece "5000"`}, nil},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, err := exec.Command(benchBin, tt.args...).CombinedOutput()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.code {
				t.Errorf("exit status %d, want %d\n%s", code, tt.code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tt.not {
				if strings.Contains(string(out), w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestRunProgress: a run says on stderr what each step does as it starts,
// in order, while stdout keeps the table; with a node's rail map the ranks
// use its HCA names (mlx5_1 is on no rail here, so a rank using it would
// not relay).
func TestRunProgress(t *testing.T) {
	out := filepath.Join(t.TempDir(), "rows.json")
	cmd := exec.Command(benchBin, "run", "--device", "host", "--ranks", "2", "--bytes", "64KiB", "--credit-timeout", "60000",
		"--rail-map", `{"mlx5_0":"rail0","mlx5_2":"rail1","mlx5_3":"rail1"}`, "--json", out)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	steps := []string{
		"PXN phase (MC_PXN_ENABLE=1): starting 2 ranks",
		"PXN phase (MC_PXN_ENABLE=1): every rank transfers",
		"PXN phase (MC_PXN_ENABLE=1): the ranks stay idle for 10s",
		"PXN phase (MC_PXN_ENABLE=1): the ranks exit; the targets check every byte",
		"baseline phase (MC_PXN_ENABLE=0, the hop alone): starting 2 ranks",
		"baseline phase (MC_PXN_ENABLE=0, the hop alone): every rank transfers",
		"baseline phase (MC_PXN_ENABLE=0, the hop alone): the ranks exit",
	}
	rest := stderr.String()
	for _, s := range steps {
		i := strings.Index(rest, s)
		if i < 0 {
			t.Fatalf("stderr lacks %q after the steps before it:\n%s", s, stderr.String())
		}
		rest = rest[i+len(s):]
	}
	if strings.Contains(stdout.String(), "starting 2 ranks") {
		t.Errorf("progress on stdout:\n%s", stdout.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rows []bench.Row
	if err := json.Unmarshal(data, &rows); err != nil || len(rows) == 0 {
		t.Fatalf("rows %s: %v", data, err)
	}
	if r := rows[0]; r.RelayedBytes != 2*64<<10 || r.FallbackBytes != 0 || !r.Verified {
		t.Errorf("first row %+v: want 2 × 64 KiB relayed through mlx5_0 and mlx5_2, no fallback, verified", r)
	}
	if r := rows[0]; len(r.Problems) != 0 || r.Problems == nil {
		t.Errorf("first row's problems %q: want judged and none", r.Problems)
	}
	// The write after idle is timed through PXN and, as the baseline it
	// is judged against, on a direct hop that waited as long.
	p4 := map[string]bool{}
	for _, r := range rows {
		if strings.HasPrefix(r.Scenario, "P4 first 10KiB write") && r.Value > 0 && r.Verified {
			p4[r.Scenario] = true
		}
	}
	for _, want := range []string{"P4 first 10KiB write through PXN after 10s idle", "P4 first 10KiB write direct after 10s idle"} {
		if !p4[want] {
			t.Errorf("no verified row %q with a time: %v", want, p4)
		}
	}
}
