// SPDX-License-Identifier: Apache-2.0

package mooncake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/staging"
)

// seamModule links a test build of mooncake.engine against the link seam
// (test/module-seam.sh) from the module CONFIG's build folder holds, into a
// cache folder of this checkout, and returns the module's path.
func seamModule(t *testing.T, root, tree, cfg string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := mooncakeScript(ctx, root, tree, "module-dir", cfg)
	if err != nil {
		t.Fatal(err)
	}
	build := strings.TrimSpace(out)
	if _, err := os.Stat(filepath.Join(build, ".module-built")); err != nil {
		testtools.Missing(t, "the %s module is not built in %s (make mooncake-wheel builds it): %v", cfg, build, err)
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	sum := sha256.Sum256([]byte(root + "\x00" + build))
	dir := filepath.Join(base, "pxn", "mooncake-module-seam-"+hex.EncodeToString(sum[:6]))
	start := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "integrations", "mooncake", "test", "module-seam.sh"), build, dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	o, err := cmd.Output()
	if err != nil {
		t.Fatalf("test/module-seam.sh %s %s: %v\n%s", build, dir, err, stderr.String())
	}
	t.Logf("module linked against the seam in %s", time.Since(start).Round(time.Millisecond))
	return strings.TrimSpace(string(o))
}

// pxnAgent builds pxn-agent, whose inspect command reads the ranks'
// counters for the Python tests.
func pxnAgent(t *testing.T, root string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pxn-agent")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/pxn-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS="+testtools.WithoutRace(os.Getenv("GOFLAGS")))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/pxn-agent: %v\n%s", err, out)
	}
	return bin
}

// TestMooncakeSeamModule installs each configuration's wheel into a virtual
// environment, puts in it a build of its module linked against the link
// seam in place of the wheel's, and runs python/test_seam.py there: SGLang's
// and vLLM's calls with PXN on among processes standing for four ranks of a
// node and a decode side on another rail, and a relay killed mid-transfer.
func TestMooncakeSeamModule(t *testing.T) {
	root, tree, python, configs := moduleSetup(t)
	ctx := context.Background()
	agent := pxnAgent(t, root)
	for _, cfg := range configs {
		t.Run(cfg, func(t *testing.T) {
			whl, err := wheelScript(ctx, root, tree, "path", cfg)
			if err != nil {
				testtools.Missing(t, "no %s wheel (make mooncake-wheel builds it): %v", cfg, err)
			}
			module := seamModule(t, root, tree, cfg)
			venv := filepath.Join(t.TempDir(), "venv")
			cmd := exec.Command(filepath.Join(root, "hack", "mooncake-wheel.sh"), "install", whl, venv)
			cmd.Env = append(os.Environ(), "PYTHON="+python)
			if o, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("installing %s: %v\n%s", whl, err, o)
			}
			installed, err := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages", "mooncake", filepath.Base(module)))
			if err != nil || len(installed) != 1 {
				t.Fatalf("the environment holds %q, want one mooncake/%s (%v)", installed, filepath.Base(module), err)
			}
			if err := os.WriteFile(installed[0], mustRead(t, module), 0o755); err != nil {
				t.Fatal(err)
			}
			runPytest(t, filepath.Join(venv, "bin", "python"),
				[]string{filepath.Join(root, "integrations", "mooncake", "python", "test_seam.py")},
				[]string{"PXN_AGENT=" + agent, "PXN_SLOTS_PER_LANE=" + strconv.Itoa(staging.SlotsPerLane)})
			t.Run("P15", func(t *testing.T) { runP15(t, root, filepath.Join(venv, "bin", "python"), agent) })
		})
	}
}

// runP15 runs P15's benchmark (make bench-mooncake) for a few calls a row:
// the script itself fails unless every cross-rail byte with PXN on was
// relayed and nothing fell back, and same-rail went direct; its timings are
// printed, never judged here.
func runP15(t *testing.T, root, python, agent string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "bench_p15.py", "--rounds", "2", "--calls", "3", "--warmup", "2", "--commit", "test")
	cmd.Dir = filepath.Join(root, "integrations", "mooncake", "python")
	cmd.Env = append(os.Environ(), "PXN_AGENT="+agent, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench_p15.py: %v\n%s", err, out)
	}
	for _, row := range []string{"\nsame-rail ", "\ncross-rail "} {
		if !strings.Contains(string(out), row) {
			t.Errorf("bench_p15.py printed no %q row:\n%s", strings.TrimSpace(row), out)
		}
	}
	t.Logf("%s", out)
}
