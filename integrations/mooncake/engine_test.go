// SPDX-License-Identifier: Apache-2.0

package mooncake

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
)

// mooncakeTree is the Mooncake tree hack/mooncake.sh builds from:
// MOONCAKE_TREE, else the reference tree CI keeps beside the clone, else the
// clone make mooncake fetched. Without one the engine tests skip.
func mooncakeTree(t *testing.T, root string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "hack", "mooncake.sh"), "tree")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		testtools.Missing(t, "no Mooncake tree (%v): %s; set MOONCAKE_TREE to one to build the engine with PXN's transport",
			err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out))
}

// mooncakeScript runs hack/mooncake.sh with args and returns its stdout.
func mooncakeScript(ctx context.Context, root, tree string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "mooncake.sh"), args...)
	cmd.Env = append(os.Environ(), "MOONCAKE_TREE="+tree)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/mooncake.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// engineBuild brings the engine with PXN's transport in configuration cfg
// up to date (make test built it already: what changed since is rebuilt)
// and returns its CMake build folder. A cold build takes longer than go
// test's default timeout: without one, the test skips and says to run make
// mooncake, unless PXN_REQUIRE_TOOLS=1 (make test), which builds.
func engineBuild(t *testing.T, root, tree, cfg string) string {
	t.Helper()
	required := os.Getenv("PXN_REQUIRE_TOOLS") == "1"
	if _, err := exec.LookPath("cmake"); err != nil {
		testtools.Missing(t, "cmake not found: hack/host-packages.sh install mooncake")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	out, err := mooncakeScript(ctx, root, tree, "dir", cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := strings.TrimSpace(out)
	if _, err := os.Stat(filepath.Join(dir, ".built")); err != nil && !required {
		t.Skipf("the engine's %s configuration is not built in %s: run make mooncake (a cold build takes minutes)", cfg, dir)
	}
	start := time.Now()
	if _, err := mooncakeScript(ctx, root, tree, "build", cfg); err != nil {
		t.Fatal(err)
	}
	t.Logf("engine %s up to date in %s", cfg, time.Since(start).Round(time.Millisecond))
	return dir
}

// runProgram runs one test program of the build with the MC_* settings of
// this environment removed, and returns its output.
func runProgram(t *testing.T, bin string, timeout time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Dir = filepath.Dir(bin)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MC_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("ran past %s: %w", timeout, ctx.Err())
	}
	return string(out), err
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestMooncakeEngine builds Mooncake's transfer engine with PXN's transport
// compiled inside it, in each configuration hack/mooncake.sh knows, and runs
// there PXN's layout check and Mooncake's own test programs that pass on an
// unpatched engine without an RDMA device or a metadata server.
func TestMooncakeEngine(t *testing.T) {
	root := repoRoot(t)
	tree := mooncakeTree(t, root)
	ctx := context.Background()
	out, err := mooncakeScript(ctx, root, tree, "configs")
	if err != nil {
		t.Fatal(err)
	}
	configs := strings.Fields(out)
	out, err = mooncakeScript(ctx, root, tree, "tests")
	if err != nil {
		t.Fatal(err)
	}
	programs := strings.Fields(out)
	if len(configs) < 2 || len(programs) == 0 {
		t.Fatalf("hack/mooncake.sh lists configurations %q and tests %q", configs, programs)
	}

	layouts := map[string]map[string]uint64{}
	for _, cfg := range configs {
		t.Run(cfg, func(t *testing.T) {
			dir := engineBuild(t, root, tree, cfg)
			t.Run("layout", func(t *testing.T) {
				layouts[cfg] = testLayout(t, filepath.Join(dir, "src", "transport", "pxn_transport", "pxn_layout_test"))
			})
			for _, name := range programs {
				t.Run(name, func(t *testing.T) {
					out, err := runProgram(t, filepath.Join(dir, "tests", name), 5*time.Minute)
					if err != nil {
						t.Fatalf("%s: %v\n%s", name, err, lastLines(out, 60))
					}
				})
			}
		})
	}

	// The configurations must build different engines: event-driven
	// completion grows TransferTask and BatchDesc.
	def, ev := layouts["default"], layouts["event"]
	if def == nil || ev == nil {
		return
	}
	for _, field := range []string{"sizeof(mooncake::Transport::TransferTask)", "sizeof(mooncake::Transport::BatchDesc)"} {
		if def[field] == 0 || def[field] >= ev[field] {
			t.Errorf("%s is %d in the default build and %d in the event-driven one: the configurations did not change the engine",
				field, def[field], ev[field])
		}
	}
}

// testLayout runs pxn_layout_test and returns the engine's view it prints.
func testLayout(t *testing.T, bin string) map[string]uint64 {
	out, err := runProgram(t, bin, time.Minute)
	view := map[string]uint64{}
	var r results
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "LAYOUT "); ok {
			i := strings.LastIndexByte(rest, ' ')
			if i < 0 {
				t.Fatalf("bad layout line %q", line)
			}
			v, perr := strconv.ParseUint(rest[i+1:], 10, 64)
			if perr != nil {
				t.Fatalf("bad layout line %q: %v", line, perr)
			}
			view[rest[:i]] = v
			continue
		}
		r.add(line)
	}
	r.report(t, func() string { return out })
	if err != nil && !t.Failed() {
		t.Fatalf("pxn_layout_test: %v\n%s", err, out)
	}
	return view
}
