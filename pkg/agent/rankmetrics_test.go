// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	dto "github.com/prometheus/client_model/go"

	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

const (
	mib        = 1 << 20
	testNode   = "gpu-node-7"
	relayedA   = 20 * mib // three Pieces from rank 0 through rank 1
	relayedB   = 1 * mib  // one Piece from rank 1 through rank 0
	sameRail   = 64 << 10 // rank 0 to its own rail: direct
	scrapeWait = time.Minute
)

// pollScrape scrapes c until done accepts the families or scrapeWait
// passes (the ranks publish with their heartbeat, every 100 ms while
// busy and a fifth of the heartbeat timeout when idle; the minute is for
// a loaded machine).
func pollScrape(t *testing.T, c *agent.RankCollector, what string, done func(map[string]*dto.MetricFamily) bool) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	deadline := time.Now().Add(scrapeWait)
	for {
		text, fams := scrape(t, c)
		if done(fams) {
			return text, fams
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen within %v; last scrape:\n%s", what, scrapeWait, text)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRankMetrics(t *testing.T) {
	n := newRankNode(t)
	r0, r1, r2 := n.ranks[0], n.ranks[1], n.ranks[2]
	r0.call("route rail1", "routed true")
	r1.call("route rail0", "routed true")
	r0.call(fmt.Sprintf("write rail1 %d", relayedA), "done true")
	r1.call(fmt.Sprintf("write rail0 %d", relayedB), "done true")
	r0.call(fmt.Sprintf("write rail0 %d", sameRail), "done true")

	c, err := agent.NewRankCollector(agent.RankMetricsOptions{NodeName: testNode, ShmDirs: []string{n.shm},
		Pods: n.pods()})
	if err != nil {
		t.Fatal(err)
	}
	rail := func(k int) map[string]string { return map[string]string{"rail": rankRail(k)} }
	text, fams := pollScrape(t, c, "every transfer in the published counters", func(f map[string]*dto.MetricFamily) bool {
		a, _ := value(f, "pxn_relayed_bytes_total", rail(0))
		b, _ := value(f, "pxn_relayed_bytes_total", rail(1))
		fa, _ := value(f, "pxn_forwarded_bytes_total", rail(1))
		fb, _ := value(f, "pxn_forwarded_bytes_total", rail(0))
		d, _ := value(f, "pxn_direct_bytes_total", rail(0))
		return a == relayedA && b == relayedB && fa == relayedA && fb == relayedB && d == sameRail
	})

	t.Run("labels", func(t *testing.T) {
		want := map[int]map[string]string{
			0: {"node": testNode, "rail": "rail0", "hca": "mlx5_0", "device": "host", "group": n.jobA, "namespace": "team-a", "pod": ""},
			1: {"node": testNode, "rail": "rail1", "hca": "mlx5_1", "device": "host", "group": n.jobA, "namespace": "team-a", "pod": ""},
			2: {"node": testNode, "rail": "rail2", "hca": "mlx5_2", "device": "host", "group": n.jobB, "namespace": "team-b", "pod": "b-0"},
		}
		for _, labels := range want {
			if v, ok := value(fams, "pxn_ranks", labels); !ok || v != 1 {
				t.Errorf("pxn_ranks%v = %v (found %v), want one rank\n%s", labels, v, ok, text)
			}
		}
		if got := len(fams["pxn_ranks"].GetMetric()); got != 3 {
			t.Errorf("%d pxn_ranks series, want 3", got)
		}
		for _, fam := range fams {
			if !strings.HasPrefix(fam.GetName(), "pxn_") {
				t.Errorf("metric %s lacks the pxn_ prefix", fam.GetName())
			}
		}
	})

	t.Run("values", func(t *testing.T) {
		for r := range staging.FallbackReasons {
			reason := staging.FallbackReasonName(r)
			for k := range 3 {
				l := map[string]string{"rail": rankRail(k), "reason": reason}
				if v, ok := value(fams, "pxn_fallback_bytes_total", l); !ok || v != 0 {
					t.Errorf("pxn_fallback_bytes_total%v = %v (found %v), want a zero series", l, v, ok)
				}
			}
		}
		for _, tc := range []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"pxn_relayed_pieces_total", rail(0), 3},
			{"pxn_relayed_pieces_total", rail(1), 1},
			{"pxn_forwarded_pieces_total", rail(1), 3},
			{"pxn_relayed_bytes_total", rail(2), 0},
			{"pxn_failed_pieces_total", rail(0), 0},
			{"pxn_lanes", map[string]string{"rail": "rail0", "direction": "outbound"}, 1},
			{"pxn_lanes", map[string]string{"rail": "rail0", "direction": "inbound"}, 1},
			{"pxn_lanes", map[string]string{"rail": "rail1", "direction": "inbound"}, 1},
			{"pxn_lanes", map[string]string{"rail": "rail2", "direction": "outbound"}, 0},
		} {
			if v, ok := value(fams, tc.name, tc.labels); !ok || v != tc.want {
				t.Errorf("%s%v = %v (found %v), want %v", tc.name, tc.labels, v, ok, tc.want)
			}
		}
		if v, _ := value(fams, "pxn_pump_cpu_seconds_total", rail(0)); v <= 0 {
			t.Errorf("pxn_pump_cpu_seconds_total of rail0 = %v, want the pump's CPU time", v)
		}
		if fams["pxn_relayed_bytes_total"].GetType() != dto.MetricType_COUNTER || fams["pxn_lanes"].GetType() != dto.MetricType_GAUGE {
			t.Errorf("types: relayed %v, lanes %v", fams["pxn_relayed_bytes_total"].GetType(), fams["pxn_lanes"].GetType())
		}
	})

	t.Run("dashboard", func(t *testing.T) { checkDashboard(t, fams) })

	t.Run("label allowlist", func(t *testing.T) {
		few, err := agent.NewRankCollector(agent.RankMetricsOptions{NodeName: testNode, ShmDirs: []string{n.shm},
			Pods: n.pods(), Labels: []string{"group", "node"}})
		if err != nil {
			t.Fatal(err)
		}
		_, f := scrape(t, few)
		jobA := map[string]string{"group": n.jobA}
		if v, _ := value(f, "pxn_relayed_bytes_total", jobA); v != relayedA+relayedB {
			t.Errorf("job A's relayed bytes summed over its ranks: %v, want %d", v, relayedA+relayedB)
		}
		if v, _ := value(f, "pxn_ranks", jobA); v != 2 {
			t.Errorf("job A's ranks: %v, want 2", v)
		}
		for _, m := range f["pxn_fallback_bytes_total"].GetMetric() {
			var names []string
			for _, l := range m.GetLabel() {
				names = append(names, l.GetName())
			}
			slices.Sort(names)
			if !slices.Equal(names, []string{"group", "node", "reason"}) {
				t.Errorf("labels %v, want group, node and reason only", names)
			}
		}
		for _, bad := range [][]string{{"gpu"}, {"rail", "rail"}} {
			if _, err := agent.NewRankCollector(agent.RankMetricsOptions{ShmDirs: []string{n.shm}, Labels: bad}); err == nil || !strings.Contains(err.Error(), bad[len(bad)-1]) {
				t.Errorf("labels %v: %v, want an error naming %q", bad, err, bad[len(bad)-1])
			}
		}
	})

	t.Run("departed ranks disappear", func(t *testing.T) {
		r2.call("exit", "closed")
		if err := r1.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		short, err := agent.NewRankCollector(agent.RankMetricsOptions{NodeName: testNode, ShmDirs: []string{n.shm}, StaleAfter: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		text, f := pollScrape(t, short, "only rank 0 left", func(f map[string]*dto.MetricFamily) bool {
			return len(f["pxn_ranks"].GetMetric()) == 1
		})
		if v, ok := value(f, "pxn_ranks", map[string]string{"rail": "rail0", "pod": ""}); !ok || v != 1 {
			t.Errorf("the rank left is not rank 0 (without a pod lister, with no pod label):\n%s", text)
		}
		r0.call("exit", "closed")
		_, f = pollScrape(t, short, "no rank left", func(f map[string]*dto.MetricFamily) bool {
			return len(f["pxn_ranks"].GetMetric()) == 0
		})
		if _, ok := f["pxn_agent_rank_read_errors_total"]; !ok {
			t.Errorf("no pxn_agent_rank_read_errors_total family once the ranks are gone")
		}
	})
}

// A workload owns its group folder and may fill it with anything: fake
// ranks beyond any job's size, names that are not UTF-8, a link to another
// job's folder. The scrape stays whole and bounded, and only that folder's
// series are affected.
func TestRankMetricsBoundAHostileGroup(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "pxn-agent-hostile-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	hostile := group.UnkeyedKey("evil", group.SourceUID, "x")
	other := group.UnkeyedKey("good", group.SourceUID, "y")
	groups := contract.GroupsDir(shm)
	for _, k := range []string{hostile, other} {
		if err := os.MkdirAll(filepath.Join(groups, k), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	r, err := registry.Register(context.Background(), registry.Options{Root: filepath.Join(groups, hostile), Group: "g", UID: os.Geteuid(),
		Rail: "rail0", HCA: "mlx5_0", HeartbeatTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	page := make([]byte, 4096)
	f, err := os.Open(filepath.Join(r.Dir(), r.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(page, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// fake writes a control file of another identity on rail, beating now.
	fake := func(pid int, rail string) {
		t.Helper()
		b := slices.Clone(page)
		h := (*staging.Header)(unsafe.Pointer(&b[0]))
		h.Pid, h.RailLen, h.Rail = uint64(pid), uint32(len(rail)), [48]byte{}
		copy(h.Rail[:], rail)
		h.Heartbeat = uint64(staging.MonoNanos())
		name := fmt.Sprintf("rank-%d-%d-%016x", pid, h.StartTime, h.BootEpoch)
		path := filepath.Join(r.Dir(), name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, int64(staging.ControlSize)); err != nil {
			t.Fatal(err)
		}
	}
	const fakes = 80
	for i := range fakes {
		fake(100000+i, fmt.Sprintf("fake%d", i))
	}
	fake(200000, "rail\xff\xfe")
	if err := os.Symlink(filepath.Join(groups, other), filepath.Join(groups, hostile, "link")); err != nil {
		t.Fatal(err)
	}

	c, err := agent.NewRankCollector(agent.RankMetricsOptions{NodeName: testNode, ShmDirs: []string{shm}})
	if err != nil {
		t.Fatal(err)
	}
	text, fams := scrape(t, c)
	if n := len(fams["pxn_ranks"].GetMetric()); n != 64 {
		t.Errorf("%d ranks of the hostile folder exported, want the bound, 64", n)
	}
	for _, m := range fams["pxn_ranks"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "group" && l.GetValue() != hostile {
				t.Errorf("a series of group %s, want only the hostile folder's", l.GetValue())
			}
		}
	}
	// The invalid name and the ranks over the bound, at this scrape.
	if v, _ := value(fams, "pxn_agent_rank_read_errors_total", nil); v != 1+fakes+1-64 {
		t.Errorf("read errors %v, want %d (one name not UTF-8, %d ranks over the bound)\n%s", v, 1+fakes+1-64, fakes+1-64, text)
	}
}

// A process that refused its configuration registers no control file; the
// agent counts its refusal record, by variable, in the group folder's
// labels. A rank whose heartbeat went stale leaves pxn_ranks for
// pxn_stale_ranks.
func TestRankMetricsRefusedAndStale(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "pxn-agent-refused-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	job := group.UnkeyedKey("team-a", group.SourceLabel, "job-a")
	dir := filepath.Join(contract.GroupsDir(shm), job)
	bench := filepath.Join(dir, "bench-registry")
	if err := os.MkdirAll(bench, 0o777); err != nil {
		t.Fatal(err)
	}
	writeOwner(t, shm, job, group.OwnerSlotPrefix+"dev-0", group.Owner{Namespace: "team-a", Pods: []string{"a-0"}})
	refuse := func(root string, pid int, vars ...string) {
		t.Helper()
		r := registry.Refusal{Pid: pid}
		for _, v := range vars {
			r.Variables = append(r.Variables, registry.RefusedVariable{Name: v, Value: "junk", Reason: "test"})
		}
		if err := registry.WriteRefusal(root, r); err != nil {
			t.Fatal(err)
		}
	}
	refuse(dir, 10, "MC_PXN_RAIL_MAP", "MC_PXN_GROUP_ID")
	refuse(dir, 11, "MC_PXN_RAIL_MAP")
	refuse(bench, 12, "MC_PXN_RAIL_MAP", "MC_PXN_RAIL_MAP")
	if err := os.WriteFile(filepath.Join(dir, registry.RefusalPrefix+"13"), []byte(`{"pid":13,"variables":[{"name":"HOME"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := registry.Register(context.Background(), registry.Options{Root: dir, Group: "g", UID: os.Geteuid(),
		Rail: "rail0", HCA: "mlx5_0", HeartbeatTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })

	const staleAfter = 200 * time.Millisecond
	c, err := agent.NewRankCollector(agent.RankMetricsOptions{NodeName: testNode, ShmDirs: []string{shm},
		Pods: fakePods{"dev-0": {"team-a", "a-0"}}, StaleAfter: staleAfter})
	if err != nil {
		t.Fatal(err)
	}
	group := map[string]string{"node": testNode, "group": job, "namespace": "team-a", "pod": "a-0"}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for gk, gv := range group {
			m[gk] = gv
		}
		return m
	}
	text, fams := scrape(t, c)
	for v, want := range map[string]float64{"MC_PXN_RAIL_MAP": 3, "MC_PXN_GROUP_ID": 1} {
		if got, ok := value(fams, "pxn_rank_config_refused", with("variable", v)); !ok || got != want {
			t.Errorf("pxn_rank_config_refused{variable=%s} = %v (%v), want %v\n%s", v, got, ok, want, text)
		}
	}
	if n := len(fams["pxn_rank_config_refused"].GetMetric()); n != 2 {
		t.Errorf("%d refused series, want 2 (the variable outside the contract is left out)\n%s", n, text)
	}
	if v, _ := value(fams, "pxn_agent_rank_read_errors_total", nil); v != 1 {
		t.Errorf("read errors %v, want 1 (the record naming HOME)", v)
	}
	if rs := c.Refused(); len(rs) != 3 || rs[0].Pod != "a-0" {
		t.Errorf("Refused() = %+v, want 3 processes of pod a-0", rs)
	}

	// The registered rank never beats again: it goes stale.
	_, fams = pollScrape(t, c, "the rank stale", func(f map[string]*dto.MetricFamily) bool {
		v, _ := value(f, "pxn_stale_ranks", with("rail", "rail0"))
		return v == 1
	})
	if _, ok := value(fams, "pxn_ranks", group); ok {
		t.Errorf("a stale rank is still in pxn_ranks")
	}

	// A record removed (the process restarted with a good configuration)
	// leaves the next scrape.
	for _, root := range []string{dir, bench} {
		for _, pid := range []int{10, 11, 12} {
			if err := registry.RemoveRefusal(root, pid); err != nil {
				t.Fatal(err)
			}
		}
	}
	if text, fams := scrape(t, c); len(fams["pxn_rank_config_refused"].GetMetric()) != 0 {
		t.Errorf("refusals after their records went:\n%s", text)
	}
}
