// SPDX-License-Identifier: Apache-2.0

// Package imports_test enforces the package map of docs/architecture.md:
// which packages of the module each package may link.
package imports_test

import (
	"context"
	"os/exec"
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
	controlPlane = []string{"api/...", "pkg/agent/...", "pkg/deviceplugin/...", "pkg/rail/...", "cmd/pxn-agent", "cmd/pxn-device-plugin"}
	engine       = []string{"pkg/relay/...", "pkg/hostengine/...", "pkg/staging/...", "internal/cuda/...", "pkg/gpu/...", "pkg/hosthop/..."}
	shipped      = []string{"cmd/libpxn", "cmd/pxn-agent", "cmd/pxn-device-plugin"}
)

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
		name:   "the release helpers never link the engine",
		from:   []string{"internal/version/...", "internal/buildinfo/...", "internal/cli/..."},
		forbid: func(_, dep string) bool { return anyMatch(engine, dep) },
	},
	{
		name: "staging never imports the relay, CUDA or the GPU copier",
		from: []string{"pkg/staging/..."},
		forbid: func(_, dep string) bool {
			return anyMatch([]string{"pkg/relay/...", "internal/cuda/...", "pkg/gpu/..."}, dep)
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
