// SPDX-License-Identifier: Apache-2.0

// Package contract_test holds the tests that feed what the control plane
// publishes through what the engine parses.
package contract_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/rail"
	"github.com/pxn-project/pxn/pkg/staging"
)

// TestEveryStrategyOnEveryFixture runs each rail strategy on each sysfs
// fixture and hands the published rail map, as the device plugin does, to
// the engine's own environment parser: the engine must turn PXN on and put
// every railed HCA on the rail discovery gave it.
func TestEveryStrategyOnEveryFixture(t *testing.T) {
	testdata := filepath.Join(testtools.RepoRoot(), "pkg", "rail", "testdata")
	entries, err := os.ReadDir(filepath.Join(testdata, "sysfs"))
	if err != nil {
		t.Fatal(err)
	}
	var fixtures []string
	for _, e := range entries {
		if e.IsDir() {
			fixtures = append(fixtures, e.Name())
		}
	}
	if len(fixtures) < 5 {
		t.Fatalf("found %d fixtures (%v) in %s, want at least 5", len(fixtures), fixtures, testdata)
	}
	type run struct {
		strategy string
		opts     func(fixture string) rail.Options
	}
	runs := []run{
		{rail.StrategyPCIOrder, func(string) rail.Options { return rail.Options{} }},
		{rail.StrategySubnet, func(string) rail.Options { return rail.Options{} }},
		{rail.StrategySubnet + "/16", func(string) rail.Options { return rail.Options{SubnetPrefixLen: 16} }},
		{rail.StrategySubnet + "/32", func(string) rail.Options { return rail.Options{SubnetPrefixLen: 32} }},
		{rail.StrategyStatic, func(fixture string) rail.Options {
			table := filepath.Join(testdata, "static", fixture+".json")
			if _, err := os.Stat(table); err != nil {
				// The HGX variants have the HGX's HCA names.
				table = filepath.Join(testdata, "static", strings.Join(strings.Split(fixture, "-")[:2], "-")+".json")
			}
			return rail.Options{StaticFile: table}
		}},
	}
	seen := map[string]bool{}
	for _, fixture := range fixtures {
		for _, r := range runs {
			t.Run(fixture+"/"+r.strategy, func(t *testing.T) {
				opts := r.opts(fixture)
				opts.NodeRoot = filepath.Join(testdata, "sysfs", fixture)
				opts.Strategy, _, _ = strings.Cut(r.strategy, "/")
				l, err := rail.Discover(context.Background(), opts)
				if err != nil {
					t.Fatal(err)
				}
				env := map[string]string{
					contract.EnvEnable:  contract.EnableOn,
					contract.EnvGroupID: "job-1",
					contract.EnvRailMap: l.RailMapJSON(),
				}
				cfg, errs := engineconfig.FromEnv(func(k string) (string, bool) {
					v, ok := env[k]
					return v, ok
				})
				if len(errs) > 0 || !cfg.Enable {
					t.Fatalf("the engine refuses %s=%s: enabled %v, %v", contract.EnvRailMap, env[contract.EnvRailMap], cfg.Enable, errs)
				}
				if !maps.Equal(cfg.RailMap, l.RailMap) {
					t.Fatalf("the engine reads rail map %v, discovery published %v", cfg.RailMap, l.RailMap)
				}
				for _, h := range l.HCAs {
					if h.Rail == "" {
						continue
					}
					if got := staging.CanonicalRail(cfg.RailMap, h.Name); got != h.Rail {
						t.Errorf("HCA %s: the engine puts it on rail %q, discovery on %q", h.Name, got, h.Rail)
					}
				}
				for _, name := range l.RailMap {
					for _, c := range ":/" {
						if strings.ContainsRune(name, c) {
							seen[string(c)] = true
						}
					}
				}
			})
		}
	}
	if !seen[":"] || !seen["/"] {
		t.Errorf("no published rail name held ':' (%v) or '/' (%v): the runs miss the subnet strategy's names", seen[":"], seen["/"])
	}
}
