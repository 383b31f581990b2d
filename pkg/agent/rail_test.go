// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/rail"
)

func TestRailDiscovererFixture(t *testing.T) {
	tests := []struct {
		name       string
		fixture    string
		strategy   string
		static     string
		wantReady  bool
		wantInMsg  string
		wantRails  int32
		wantGPUs   int
		wantHCAs   int
		wantRailOf map[string]string
	}{
		{name: "hgx pci-order", fixture: "hgx-8gpu", wantReady: true, wantRails: 8, wantGPUs: 8, wantHCAs: 10,
			wantRailOf: map[string]string{"mlx5_0": "rail0"}},
		{name: "hgx static", fixture: "hgx-8gpu", strategy: rail.StrategyStatic, static: railTestdata("static", "hgx-8gpu.json"),
			wantReady: true, wantRails: 8, wantGPUs: 8, wantHCAs: 10, wantRailOf: map[string]string{"mlx5_0": "rail-a"}},
		{name: "hgx port down", fixture: "hgx-8gpu-portdown", wantReady: false, wantInMsg: "mlx5_3", wantRails: 8, wantGPUs: 8, wantHCAs: 10},
		{name: "hgx subnet, one InfiniBand prefix", fixture: "hgx-8gpu-defaultprefix", strategy: rail.StrategySubnet, wantReady: false,
			wantInMsg: "rail strategy subnet: HCAs mlx5_0, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_7, mlx5_8, mlx5_9 share InfiniBand subnet prefix fe80:0000:0000:0000",
			wantRails: 0, wantGPUs: 8, wantHCAs: 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := agent.RailDiscoverer{Options: rail.Options{
				NodeRoot: railTestdata("sysfs", tc.fixture), Strategy: tc.strategy, StaticFile: tc.static,
			}}
			got, err := d.Discover(context.Background())
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			l := got.Layout
			if l.Rails != tc.wantRails || len(l.GPUs) != tc.wantGPUs || len(l.HCAs) != tc.wantHCAs {
				t.Errorf("rails, gpus, hcas = %d, %d, %d; want %d, %d, %d", l.Rails, len(l.GPUs), len(l.HCAs), tc.wantRails, tc.wantGPUs, tc.wantHCAs)
			}
			if got.Ready != tc.wantReady || !strings.Contains(got.NotReadyMessage, tc.wantInMsg) {
				t.Errorf("ready = %v %q; want %v containing %q", got.Ready, got.NotReadyMessage, tc.wantReady, tc.wantInMsg)
			}
			if shared := strings.Contains(tc.wantInMsg, "subnet prefix"); shared != (got.SharedSubnetMessage != "") || shared && !strings.Contains(got.SharedSubnetMessage, tc.wantInMsg) {
				t.Errorf("shared subnet message %q, want one containing %q exactly when the strategy refused a prefix", got.SharedSubnetMessage, tc.wantInMsg)
			}
			if tc.wantReady && got.NotReadyMessage != "" {
				t.Errorf("ready layout has not-ready message %q", got.NotReadyMessage)
			}
			for hca, r := range tc.wantRailOf {
				if l.RailMap[hca] != r {
					t.Errorf("railMap[%s] = %q, want %q", hca, l.RailMap[hca], r)
				}
			}
			for _, g := range l.GPUs {
				if g.HCA == "" || g.Distance == "" || g.Rail != l.RailMap[g.HCA] {
					t.Errorf("GPU %d: hca %q distance %q rail %q (railMap %q)", g.Index, g.HCA, g.Distance, g.Rail, l.RailMap[g.HCA])
				}
			}
			if len(l.Pairs) != tc.wantGPUs*tc.wantHCAs {
				t.Errorf("%d pairs, want %d", len(l.Pairs), tc.wantGPUs*tc.wantHCAs)
			}
		})
	}
}

func TestFingerprintFollowsHost(t *testing.T) {
	root := copyFixture(t, "hgx-8gpu")
	static := filepath.Join(t.TempDir(), "static.json")
	if err := os.WriteFile(static, []byte(`{"mlx5_0":"a"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d := agent.RailDiscoverer{Options: rail.Options{NodeRoot: root, StaticFile: static}}
	fp := func() string {
		t.Helper()
		s, err := d.Fingerprint()
		if err != nil {
			t.Fatalf("Fingerprint: %v", err)
		}
		return s
	}
	base := fp()
	if again := fp(); again != base {
		t.Fatalf("fingerprint of an unchanged host changed: %s then %s", base, again)
	}
	changes := []struct {
		name   string
		change func()
	}{
		{"port down", func() { setPortState(t, root, "mlx5_2", "1: DOWN") }},
		{"port back up", func() { setPortState(t, root, "mlx5_2", "4: ACTIVE") }},
		{"HCA gone", func() {
			if err := os.Remove(filepath.Join(root, "sys", "class", "infiniband", "mlx5_9")); err != nil {
				t.Fatal(err)
			}
		}},
		{"GPU unbound", func() {
			dir := filepath.Join(root, "sys", "bus", "pci", "drivers", "nvidia")
			entries, err := os.ReadDir(dir)
			if err != nil || len(entries) == 0 {
				t.Fatalf("read %s: %v", dir, err)
			}
			if err := os.Remove(filepath.Join(dir, entries[0].Name())); err != nil {
				t.Fatal(err)
			}
		}},
		{"static table edited", func() {
			if err := os.WriteFile(static, []byte(`{"mlx5_0":"b"}`), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	prev := base
	for _, c := range changes {
		c.change()
		now := fp()
		if now == prev {
			t.Errorf("fingerprint did not change after %q", c.name)
		}
		prev = now
	}
}
