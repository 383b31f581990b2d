// SPDX-License-Identifier: Apache-2.0

// Package imports_test enforces the levels and the package map of
// docs/architecture.md: which packages of the module each package may link.
package imports_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
)

const module = "github.com/pxn-project/pxn/"

// A pattern is a module-relative package path; "x/..." is x and every
// package below it.
func matches(pattern, pkg string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

// isSim reports a simulation package: one for tests and benchmarks only,
// named so by a path element under pkg/ that starts with "sim".
func isSim(pkg string) bool {
	return strings.HasPrefix(pkg, "pkg/") && strings.Contains(pkg, "/sim")
}

var (
	controlPlane = []string{"api/...", "pkg/agent/...", "pkg/group/...", "pkg/nodestate/...", "pkg/deviceplugin/...", "pkg/dra/...", "pkg/rail/...", "cmd/pxn-agent", "cmd/pxn-device-plugin", "cmd/pxn-dra-plugin"}
	engine       = []string{"pkg/relay/...", "pkg/engineopen/...", "pkg/staging/...", "pkg/engineconfig/...", "pkg/cuda/...", "pkg/gpu/...", "pkg/cpucopy/...", "pkg/memrange/..."}
	shipped      = []string{"cmd/libpxn", "cmd/pxn-agent", "cmd/pxn-device-plugin", "cmd/pxn-dra-plugin"}
	testHelpers  = []string{"internal/testtools/...", "internal/testmem/...", "internal/sanitize/...", "internal/fakecuda/...", "internal/testkernel/..."}
)

// levels lists the module's packages from the bottom up (docs/architecture.md,
// "Levels"). A package links packages of its own level or below, never one
// above. A package no level names fails the test until it is given one.
var levels = []struct {
	name string
	pkgs []string
}{
	{"contract", []string{"pkg/contract/..."}},
	{"primitives", []string{"api/...", "pkg/rail/...", "pkg/staging", "pkg/engineconfig/...", "pkg/cuda/...", "pkg/memrange/...", "pkg/gpu/kernel/..."}},
	{"registry", []string{"pkg/staging/registry/..."}},
	{"engine core", []string{"pkg/relay/..."}},
	{"components", []string{"pkg/gpu", "pkg/cpucopy/...", "pkg/engineopen/...", "pkg/group/...", "pkg/nodestate/...", "pkg/deviceplugin/...", "pkg/dra/...", "pkg/agent/..."}},
	{"stand-ins", []string{"pkg/sim/..."}},
	{"program parts", []string{"internal/..."}},
	{"programs", []string{"cmd/...", "hack/...", "test/...", "integrations/..."}},
}

// levelOf returns the index in levels of the level that names pkg, or an
// error when none or more than one does.
func levelOf(pkg string) (int, error) {
	found := -1
	for i, l := range levels {
		if !anyMatch(l.pkgs, pkg) {
			continue
		}
		if found >= 0 {
			return 0, fmt.Errorf("%s is on two levels, %s and %s", pkg, levels[found].name, l.name)
		}
		found = i
	}
	if found < 0 {
		return 0, fmt.Errorf("%s is on no level: give it one in docs/architecture.md and here", pkg)
	}
	return found, nil
}

type rule struct {
	name string
	from []string
	// forbid reports whether a dependency (module-relative) is refused.
	forbid func(from, dep string) bool
}

func anyMatch(patterns []string, pkg string) bool {
	for _, p := range patterns {
		if matches(p, pkg) {
			return true
		}
	}
	return false
}

var rules = []rule{
	{
		name:   "no library package links internal/",
		from:   []string{"pkg/...", "api/..."},
		forbid: func(_, dep string) bool { return matches("internal/...", dep) },
	},
	{
		name: "test helpers are linked by test files only",
		from: []string{"api/...", "pkg/...", "internal/...", "cmd/...", "hack/..."},
		forbid: func(from, dep string) bool {
			return anyMatch(testHelpers, dep) && !anyMatch(testHelpers, from)
		},
	},
	{
		name: "the control plane never links the engine",
		from: controlPlane,
		forbid: func(from, dep string) bool {
			// pxn-agent inspect and the agent's rank metrics decode
			// registry control files: the agent links the registry reader
			// and the ABI, never the pump, the copiers or CUDA.
			if (from == "cmd/pxn-agent" || matches("pkg/agent/...", from)) && matches("pkg/staging/...", dep) {
				return false
			}
			return anyMatch(engine, dep) || isSim(dep)
		},
	},
	{
		name:   "the agent never links the device plugin: the group-folder layout they share is the contract's",
		from:   []string{"pkg/agent/..."},
		forbid: func(_, dep string) bool { return matches("pkg/deviceplugin/...", dep) },
	},
	{
		name:   "the DRA driver never links the device plugin: what they share is in pkg/group and pkg/nodestate",
		from:   []string{"pkg/dra/...", "cmd/pxn-dra-plugin"},
		forbid: func(_, dep string) bool { return matches("pkg/deviceplugin/...", dep) },
	},
	{
		name:   "the benchmark never links the control plane",
		from:   []string{"internal/bench/...", "cmd/pxn-bench"},
		forbid: func(_, dep string) bool { return anyMatch(controlPlane, dep) },
	},
	{
		name:   "the engine never links the control plane",
		from:   append([]string{"cmd/libpxn"}, engine...),
		forbid: func(_, dep string) bool { return anyMatch(controlPlane, dep) },
	},
	{
		name:   "the staging ABI imports nothing of the module but the contract",
		from:   []string{"pkg/staging"},
		forbid: func(_, dep string) bool { return !matches("pkg/contract/...", dep) },
	},
	{
		name: "the engine never links the inspection reports: only the agent and tools read registries",
		from: append([]string{"cmd/libpxn", "pkg/staging/registry"}, engine...),
		forbid: func(from, dep string) bool {
			return matches("pkg/staging/registry/inspect/...", dep) && !matches("pkg/staging/registry/inspect/...", from)
		},
	},
	{
		name:   "the engine's configuration imports nothing of the module but the contract",
		from:   []string{"pkg/engineconfig/..."},
		forbid: func(_, dep string) bool { return !matches("pkg/contract/...", dep) },
	},
	{
		name:   "the release helpers never link the engine",
		from:   []string{"internal/version/...", "internal/buildinfo/...", "internal/cli/...", "internal/daemon/..."},
		forbid: func(_, dep string) bool { return anyMatch(engine, dep) },
	},
	{
		name: "staging never imports the relay, CUDA or the GPU copier",
		from: []string{"pkg/staging/..."},
		forbid: func(_, dep string) bool {
			return anyMatch([]string{"pkg/relay/...", "pkg/cuda/...", "pkg/gpu/..."}, dep)
		},
	},
	{
		name:   "rail never imports the API or the engine",
		from:   []string{"pkg/rail/..."},
		forbid: func(_, dep string) bool { return matches("api/...", dep) || anyMatch(engine, dep) },
	},
	{
		name:   "the contract imports nothing of the module",
		from:   []string{"pkg/contract/..."},
		forbid: func(from, dep string) bool { return !matches("pkg/contract/...", dep) },
	},
	{
		name:   "nothing shipped links a simulation package",
		from:   shipped,
		forbid: func(_, dep string) bool { return isSim(dep) },
	},
}

// deps lists every package of the module with the module's packages it
// links (go list -deps: transitive, test files left out).
func deps(t *testing.T) map[string][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...")
	cmd.Dir = testtools.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list: %v\n%s", err, msg)
	}
	all := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, ok := strings.CutPrefix(f[0], module)
		if !ok {
			continue
		}
		var own []string
		for _, d := range f[1:] {
			if rel, ok := strings.CutPrefix(d, module); ok {
				own = append(own, rel)
			}
		}
		all[pkg] = own
	}
	return all
}

func TestImportRules(t *testing.T) {
	all := deps(t)
	if len(all) < 20 {
		t.Fatalf("go list found %d packages of the module", len(all))
	}
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			var checked []string
			for pkg, ds := range all {
				if !anyMatch(r.from, pkg) {
					continue
				}
				checked = append(checked, pkg)
				for _, d := range ds {
					if d != pkg && r.forbid(pkg, d) {
						t.Errorf("%s links %s", pkg, d)
					}
				}
			}
			for _, p := range r.from {
				found := false
				for _, c := range checked {
					found = found || matches(p, c)
				}
				if !found {
					t.Errorf("no package matches %s: the rule guards nothing", p)
				}
			}
			sort.Strings(checked)
			t.Logf("checked %d packages: %s", len(checked), strings.Join(checked, " "))
		})
	}
}

func TestLevels(t *testing.T) {
	all := deps(t)
	pkgs := make([]string, 0, len(all))
	for pkg := range all {
		pkgs = append(pkgs, pkg)
	}
	sort.Strings(pkgs)
	for _, pkg := range pkgs {
		own, err := levelOf(pkg)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, d := range all[pkg] {
			dl, err := levelOf(d)
			if err != nil {
				t.Error(err)
				continue
			}
			if dl > own {
				t.Errorf("%s (%s) links %s, a level above (%s)", pkg, levels[own].name, d, levels[dl].name)
			}
		}
	}
	for _, l := range levels {
		for _, p := range l.pkgs {
			if !slices.ContainsFunc(pkgs, func(pkg string) bool { return matches(p, pkg) }) {
				t.Errorf("no package matches %s (level %s): the level names nothing", p, l.name)
			}
		}
	}
}

func TestLevelOf(t *testing.T) {
	for _, tc := range []struct {
		pkg  string
		want string
	}{
		{"pkg/contract", "contract"},
		{"pkg/staging", "primitives"},
		{"pkg/engineconfig", "primitives"},
		{"pkg/staging/registry", "registry"},
		{"pkg/staging/registry/inspect", "registry"},
		{"pkg/staging/registry/internal/folder", "registry"},
		{"pkg/gpu/kernel", "primitives"},
		{"pkg/gpu", "components"},
		{"pkg/sim/fabric", "stand-ins"},
		{"internal/bench", "program parts"},
		{"cmd/libpxn", "programs"},
	} {
		i, err := levelOf(tc.pkg)
		if err != nil || levels[i].name != tc.want {
			t.Errorf("levelOf(%q) = %d (%v), want level %s", tc.pkg, i, err, tc.want)
		}
	}
	for _, pkg := range []string{"pkg/staging/newthing", "pkg/gpu/newthing", "tools/x"} {
		if _, err := levelOf(pkg); err == nil {
			t.Errorf("levelOf(%q) found a level for a package no level names", pkg)
		}
	}
}

func TestMatching(t *testing.T) {
	for _, tc := range []struct {
		pattern, pkg string
		want         bool
	}{
		{"pkg/staging/...", "pkg/staging", true},
		{"pkg/staging/...", "pkg/staging/registry", true},
		{"pkg/staging/...", "pkg/stagingx", false},
		{"cmd/pxn-agent", "cmd/pxn-agent", true},
		{"cmd/pxn-agent", "cmd/pxn-agent/sub", false},
	} {
		if got := matches(tc.pattern, tc.pkg); got != tc.want {
			t.Errorf("matches(%q, %q) = %v", tc.pattern, tc.pkg, got)
		}
	}
	for pkg, want := range map[string]bool{"pkg/sim/nic": true, "pkg/gpu/simnic": true, "pkg/sim": true, "cmd/sim": false, "pkg/gpu": false} {
		if got := isSim(pkg); got != want {
			t.Errorf("isSim(%q) = %v", pkg, got)
		}
	}
}
