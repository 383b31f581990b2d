// SPDX-License-Identifier: Apache-2.0

// Package fuzz runs every fuzz target of the module for a short, fixed
// number of executions, so that go test ./... (and make test) exercises
// each parser with inputs beyond its seeds. make fuzz runs the same
// targets for longer (hack/fuzz.sh).
package fuzz

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
)

// execsEnv sets the executions of each target; 0 skips the test.
const execsEnv = "PXN_FUZZ_EXECS"

const defaultExecs = 2000

// seamsTag builds the C seams libpxn's targets call the C ABI through
// (cmd/libpxn/seams.go); the shipped library is built without it.
const seamsTag = "pxnseams"

// targetWait bounds one target's run, build excluded: a fuzzer that never
// comes back fails its target instead of holding the whole run.
const targetWait = 5 * time.Minute

var fuzzFunc = regexp.MustCompile(`(?m)^func (Fuzz[A-Za-z0-9_]*)\(f \*testing\.F\)`)

// fuzzTargets finds the fuzz targets below root, by package folder
// (relative to root), as hack/fuzz.sh does: a func Fuzz... in a _test.go
// file.
func fuzzTargets(root string) (map[string][]string, error) {
	targets := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, m := range fuzzFunc.FindAllSubmatch(b, -1) {
			targets[rel] = append(targets[rel], string(m[1]))
		}
		return nil
	})
	for _, ts := range targets {
		slices.Sort(ts)
	}
	return targets, err
}

func TestFuzzTargetsFound(t *testing.T) {
	targets, err := fuzzTargets(testtools.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	// Parsers of bytes from another process: each has a target.
	for pkg, want := range map[string][]string{
		"pkg/staging/registry":         {"FuzzArenaSocketAnswer", "FuzzDecodeFDRequest", "FuzzDecodeHeader", "FuzzHostHandleName", "FuzzHostOpenLaneFD", "FuzzReadRefusals"},
		"pkg/staging/registry/inspect": {"FuzzStatsReport"},
		"pkg/dra":                      {"FuzzCheckpoint", "FuzzDecodeRelayConfig", "FuzzPrepareAllocation"},
		"pkg/gpu":                      {"FuzzOpenIPCHandle"},
		"cmd/libpxn":                   {"FuzzOpen", "FuzzRegisterTargets", "FuzzSubmit"},
	} {
		for _, name := range want {
			if !slices.Contains(targets[pkg], name) {
				t.Errorf("%s has no fuzz target %s (found %v)", pkg, name, targets[pkg])
			}
		}
	}
	// The Mooncake transport's, in C++: each with its seeds.
	root := testtools.RepoRoot()
	out, err := exec.Command("bash", filepath.Join(root, mooncakeFuzz), "targets").Output()
	if err != nil {
		t.Fatalf("%s targets: %v", mooncakeFuzz, err)
	}
	cxx := strings.Fields(string(out))
	for _, name := range []string{"segment", "switches"} {
		if !slices.Contains(cxx, name) {
			t.Errorf("integrations/mooncake/fuzz has no target %s (found %v)", name, cxx)
		}
	}
	for _, name := range cxx {
		seeds, err := os.ReadDir(filepath.Join(root, "integrations", "mooncake", "fuzz", "corpus", name))
		if err != nil || len(seeds) == 0 {
			t.Errorf("integrations/mooncake/fuzz target %s has no seeds in corpus/%s (%v)", name, name, err)
		}
	}
}

// fuzzExecs is the executions each target runs, from PXN_FUZZ_EXECS; it
// skips the test under -short or for 0.
func fuzzExecs(t *testing.T) int {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the fuzz targets' short run is left out")
	}
	execs := defaultExecs
	if v := os.Getenv(execsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("%s=%q: want a count of executions", execsEnv, v)
		}
		execs = n
	}
	if execs == 0 {
		t.Skipf("%s=0", execsEnv)
	}
	return execs
}

// TestFuzzTargetsRun runs each fuzz target for PXN_FUZZ_EXECS executions
// (default 2000), one at a time, each package's test binary built once with
// the fuzzer's instrumentation. A target that fails prints its output; go
// keeps the failing input in the package's testdata/fuzz folder, where
// go test finds it again as a seed.
func TestFuzzTargetsRun(t *testing.T) {
	execs := fuzzExecs(t)
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH to build the fuzz targets: %v", err)
	}
	root := testtools.RepoRoot()
	targets, err := fuzzTargets(root)
	if err != nil {
		t.Fatal(err)
	}
	pkgs := make([]string, 0, len(targets))
	for pkg := range targets {
		pkgs = append(pkgs, pkg)
	}
	slices.Sort(pkgs)
	bin := t.TempDir()
	for _, pkg := range pkgs {
		t.Run(pkg, func(t *testing.T) {
			exe := filepath.Join(bin, strings.ReplaceAll(pkg, string(filepath.Separator), "_")+".test")
			build := exec.Command(goTool, "test", "-c", "-tags", seamsTag, "-fuzz=.", "-o", exe, "./"+filepath.ToSlash(pkg))
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("build %s's fuzz targets: %v\n%s", pkg, err, out)
			}
			for _, target := range targets[pkg] {
				t.Run(target, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), targetWait)
					defer cancel()
					cmd := exec.CommandContext(ctx, exe, "-test.run=^$", "-test.fuzz=^"+target+"$",
						fmt.Sprintf("-test.fuzztime=%dx", execs), "-test.parallel=1",
						"-test.fuzzcachedir="+t.TempDir())
					cmd.Dir = filepath.Join(root, pkg)
					out, err := cmd.CombinedOutput()
					if ctx.Err() != nil {
						t.Fatalf("%s did not finish %d executions within %v:\n%s", target, execs, targetWait, out)
					}
					if err != nil {
						t.Fatalf("%s: %v\n%s", target, err, out)
					}
				})
			}
		})
	}
}

// mooncakeFuzz is the script that builds and runs the Mooncake transport's
// libFuzzer targets, for make fuzz and for this test alike.
const mooncakeFuzz = "hack/fuzz-mooncake.sh"

// TestMooncakeFuzzTargetsRun runs each of the Mooncake transport's libFuzzer
// targets for PXN_FUZZ_EXECS runs (default 2000) over its checked-in seeds.
// Without clang++ and libFuzzer it skips, or fails under
// PXN_REQUIRE_TOOLS=1; a target that crashes or breaks a property fails
// with libFuzzer's report, which holds the input.
func TestMooncakeFuzzTargetsRun(t *testing.T) {
	execs := fuzzExecs(t)
	root := testtools.RepoRoot()
	script := filepath.Join(root, mooncakeFuzz)
	out, err := exec.Command("bash", script, "targets").Output()
	if err != nil {
		t.Fatalf("%s targets: %v", mooncakeFuzz, err)
	}
	targets := strings.Fields(string(out))
	bin := t.TempDir()
	build := exec.Command("bash", script, "build", bin)
	if o, err := build.CombinedOutput(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 3 {
			testtools.Missing(t, "%s", strings.TrimSpace(string(o)))
		}
		t.Fatalf("%s build: %v\n%s", mooncakeFuzz, err, o)
	}
	for _, target := range targets {
		t.Run(target, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), targetWait)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", script, "run", bin, target, fmt.Sprintf("-runs=%d", execs))
			o, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("%s did not finish %d runs within %v:\n%s", target, execs, targetWait, o)
			}
			if err != nil {
				t.Fatalf("%s: %v\n%s", target, err, o)
			}
			if !strings.Contains(string(o), fmt.Sprintf("Done %d runs", execs)) {
				t.Fatalf("%s did not report %d runs:\n%s", target, execs, o)
			}
		})
	}
}
