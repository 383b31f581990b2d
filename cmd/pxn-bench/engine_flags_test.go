// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// runExit runs pxn-bench with args (env added to its environment) and
// returns its exit status and output. A run that has not ended within
// five minutes is killed and fails the test.
func runExit(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, benchBin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("pxn-bench %v did not end: %v\n%s", args, ctx.Err(), out)
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	case err != nil:
		t.Fatal(err)
	}
	return 0, string(out)
}

// privateRoot is a registry root of the test's own on the tmpfs, so that
// what a run leaves there is the run's alone.
func privateRoot(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("/dev/shm", "pxn-bench-test-root-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	return root
}

// leftIn lists what a run left in root.
func leftIn(t *testing.T, root string) []string {
	t.Helper()
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestBadEngineFlag: a value the ranks' engine would refuse is a usage
// error before any process starts, naming the flag and the value; a value
// the engine refuses from the inherited environment ends the run with an
// error naming the variable and the value. Neither leaves anything in the
// registry root.
func TestBadEngineFlag(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		args []string
		code int
		want []string
	}{
		{"credit-timeout word", nil, []string{"--credit-timeout", "soon"}, 2, []string{`--credit-timeout "soon"`, "not a decimal integer"}},
		{"credit-timeout zero", nil, []string{"--credit-timeout", "0"}, 2, []string{`--credit-timeout "0"`, "out of range"}},
		{"credit-timeout over", nil, []string{"--credit-timeout", "99999999"}, 2, []string{`--credit-timeout "99999999"`, "out of range"}},
		{"credit-timeout signed", nil, []string{"--credit-timeout", "-5"}, 2, []string{`--credit-timeout "-5"`}},
		{"copy-mode", nil, []string{"--device", "cuda", "--copy-mode", "warp"}, 2, []string{`--copy-mode "warp"`, "want ce, sm or auto"}},
		{"first-piece", nil, []string{"--first-piece", "3KiB"}, 2, []string{`--first-piece "3KiB"`}},
		{"first-piece word", nil, []string{"--first-piece", "big"}, 2, []string{`--first-piece "big"`}},
		{"slot-parts", nil, []string{"--slot-parts", "99"}, 2, []string{"--slot-parts 99"}},
		{"slot-parts negative", nil, []string{"--slot-parts", "-1"}, 2, []string{"--slot-parts -1"}},
		{"refused in the ranks", []string{"MC_PXN_INFLIGHT_DEPTH=zero"}, nil, 1, []string{"rank ", "refused its configuration", `MC_PXN_INFLIGHT_DEPTH="zero"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := privateRoot(t)
			args := append([]string{"run", "--ranks", "2", "--bytes", "1MiB", "--registry-root", root}, tt.args...)
			code, out := runExit(t, tt.env, args...)
			if code != tt.code {
				t.Errorf("exit status %d, want %d\n%s", code, tt.code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if tt.code == 2 && strings.Contains(out, "starting") {
				t.Errorf("a usage error started ranks:\n%s", out)
			}
			if left := leftIn(t, root); len(left) != 0 {
				t.Errorf("left in the registry root: %v", left)
			}
		})
	}
}

// TestCUDAOnlyFlagsOnHost: each flag of --device cuda alone (its usage
// opens with "cuda:") is a usage error with --device host, naming it.
func TestCUDAOnlyFlagsOnHost(t *testing.T) {
	given := map[string][]string{
		"suite":          {"--suite", "p1"},
		"gpus":           {"--gpus", "0,1"},
		"rate":           {"--rate", "10"},
		"raw":            {"--raw"},
		"gather-ptx":     {"--gather-ptx", "gather.ptx"},
		"no-inline-plan": {"--no-inline-plan"},
		"copy-mode":      {"--copy-mode", "sm"},
		"poll-spin":      {"--poll-spin", "1ms"},
		"poll-nap":       {"--poll-nap", "1ms"},
		"arena-share":    {"--arena-share", "fd"},
	}
	var run *pflag.FlagSet
	for _, c := range newRootCommand().Commands() {
		if c.Name() == "run" {
			run = c.Flags()
		}
	}
	if run == nil {
		t.Fatal("no run command")
	}
	var cudaOnly []string
	run.VisitAll(func(f *pflag.Flag) {
		if strings.HasPrefix(f.Usage, "cuda:") {
			cudaOnly = append(cudaOnly, f.Name)
		}
	})
	if len(cudaOnly) != len(given) {
		t.Errorf("run's CUDA-only flags are %v; the test gives %d", cudaOnly, len(given))
	}
	for _, name := range cudaOnly {
		t.Run(name, func(t *testing.T) {
			args, ok := given[name]
			if !ok {
				t.Fatalf("no value to give --%s", name)
			}
			code, out := runExit(t, nil, append([]string{"run", "--device", "host"}, args...)...)
			if code != 2 || !strings.Contains(out, "--"+name+": CUDA only, want --device cuda") {
				t.Errorf("exit status %d, want 2 naming --%s:\n%s", code, name, out)
			}
			if strings.Contains(out, "host-memory path") {
				t.Errorf("a usage error started the run:\n%s", out)
			}
		})
	}
}
