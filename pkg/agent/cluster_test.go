// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/rail"
)

func TestInconsistentRailNames(t *testing.T) {
	cfg := controlPlane(t)
	c := newClient(t, cfg)
	a := createNode(t, c, "gpu-node-pci")
	b := createNode(t, c, "gpu-node-static")
	// Same hardware, two strategies: mlx5_0 is rail0 on one node and rail-a
	// on the other.
	pci := startAgent(t, cfg, railAgent(a.Name, railTestdata("sysfs", "hgx-8gpu"), time.Second, time.Hour))
	static := railAgent(b.Name, railTestdata("sysfs", "hgx-8gpu"), time.Second, time.Hour)
	static.Discoverer = agent.RailDiscoverer{Options: rail.Options{
		NodeRoot: railTestdata("sysfs", "hgx-8gpu"), Strategy: rail.StrategyStatic, StaticFile: railTestdata("static", "hgx-8gpu.json"),
	}}
	startAgent(t, cfg, static)

	for _, n := range []string{a.Name, b.Name} {
		cond := mapCondition(t, c, n, pxnv1alpha1.ConditionConsistent, metav1.ConditionFalse, 30*time.Second)
		t.Logf("%s Consistent: %s", n, cond.Message)
		want := []string{`HCA mlx5_0 is on rail "rail-a" on gpu-node-static and on rail "rail0" on gpu-node-pci`, "mlx5_9"}
		for _, w := range want {
			if !strings.Contains(cond.Message, w) {
				t.Errorf("%s: Consistent message %q lacks %q", n, cond.Message, w)
			}
		}
		if cond.Reason != agent.ReasonRailsConflict {
			t.Errorf("%s: reason %s, want %s", n, cond.Reason, agent.ReasonRailsConflict)
		}
		// The conflict is about naming, not ports.
		mapCondition(t, c, n, pxnv1alpha1.ConditionReady, metav1.ConditionTrue, time.Second)
	}
	eventually(t, agentSettle, func() error {
		if r, c := pci.metric(t, "pxn_agent_rail_map_condition", "condition", "Ready"), pci.metric(t, "pxn_agent_rail_map_condition", "condition", "Consistent"); r != 1 || c != 0 {
			return fmt.Errorf("pxn_agent_rail_map_condition Ready %v Consistent %v, want 1 and 0", r, c)
		}
		return nil
	})
}

func TestAgentSurvivesAPIServerRestart(t *testing.T) {
	cfg := controlPlane(t)
	c := newClient(t, cfg)
	node := createNode(t, c, "gpu-node-restart")
	root := copyFixture(t, "hgx-8gpu")
	a := startAgent(t, cfg, railAgent(node.Name, root, 300*time.Millisecond, time.Hour))
	mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionTrue, 30*time.Second)

	apiServer := shared.env.ControlPlane.APIServer
	if err := apiServer.Stop(); err != nil {
		t.Fatalf("stop kube-apiserver: %v", err)
	}
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			if err := apiServer.Start(); err != nil {
				t.Errorf("restart kube-apiserver: %v", err)
			}
		}
	})
	setPortState(t, root, "mlx5_7", "1: DOWN")
	errs := a.metric(t, "pxn_agent_errors_total", "op", "publish")
	eventually(t, agentSettle, func() error {
		if got := a.metric(t, "pxn_agent_errors_total", "op", "publish"); got <= errs {
			return fmt.Errorf("no failed publish while the API server is down (errors %v)", got)
		}
		return nil
	})
	if err := apiServer.Start(); err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}
	restarted = true
	cond := mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionFalse, 60*time.Second)
	if !strings.Contains(cond.Message, "mlx5_7") {
		t.Errorf("Ready message %q does not name mlx5_7", cond.Message)
	}
	waitLabels(t, c, node.Name, "false", "8")
}

// TestUnchangedNodeMakesNoRequests is perf.md's K3: among 500 other maps, an
// unchanged node costs the API server nothing per resync beyond the watches
// its informers opened at start.
func TestUnchangedNodeMakesNoRequests(t *testing.T) {
	const others, resyncs = 500, 10
	cfg := controlPlane(t)
	c := newClient(t, cfg)
	ctx := context.Background()

	d, err := agent.RailDiscoverer{Options: rail.Options{NodeRoot: railTestdata("sysfs", "hgx-8gpu")}}.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	createOtherMaps(t, c, others, d.Layout)

	node := createNode(t, c, "gpu-node-quiet")
	root := copyFixture(t, "hgx-8gpu")
	var counter requestCounter
	const resync = 200 * time.Millisecond
	a := startAgent(t, counter.wrap(cfg), railAgent(node.Name, root, resync, 50*time.Millisecond))
	mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionTrue, 30*time.Second)
	mapCondition(t, c, node.Name, pxnv1alpha1.ConditionConsistent, metav1.ConditionTrue, agentSettle)
	waitLabels(t, c, node.Name, "true", "8")

	reconciles := func() float64 {
		return gathered(t, ctrlmetrics.Registry, "controller_runtime_reconcile_total", "controller", "pxn-agent")
	}
	// waitResyncs waits for n more discoveries and n more reconciliations.
	waitResyncs := func(n int) {
		t.Helper()
		discoveries, reconciled := a.metric(t, "pxn_agent_discoveries_total"), reconciles()
		eventually(t, time.Duration(n)*resync+agentSettle, func() error {
			d, r := a.metric(t, "pxn_agent_discoveries_total")-discoveries, reconciles()-reconciled
			if d < float64(n) || r < float64(n) {
				return fmt.Errorf("%v discoveries and %v reconciles, waiting for %d of each", d, r, n)
			}
			return nil
		})
	}

	// The first publish settles, and its Events (Ready and Consistent, on
	// the map and the node) are written.
	waitResyncs(2)
	eventually(t, agentSettle, func() error {
		if n := counter.snapshot()["post events"]; n < 4 {
			return fmt.Errorf("%d Events posted, waiting for the first publish's 4", n)
		}
		return nil
	})
	startup := counter.snapshot()
	t.Logf("requests while starting and publishing: %v", startup)
	if n := startup["list pxnrailmaps"]; n > 1 {
		t.Errorf("%d lists of pxnrailmaps at start, want at most one (the informer's)", n)
	}
	if startup["watch pxnrailmaps"] < 1 || startup["watch nodes"] < 1 {
		t.Errorf("no watch of pxnrailmaps and nodes at start: %v", startup)
	}

	waitResyncs(resyncs)
	quiet := counter.snapshot()
	during := diffCounts(startup, quiet)
	t.Logf("requests during %d resyncs of an unchanged node among %d maps: %v", resyncs, others, during)
	if len(during) != 0 {
		t.Errorf("an unchanged node made API requests during %d resyncs: %v", resyncs, during)
	}

	// One real change costs one status apply, one label patch and one Event
	// on each of the map and the node (written asynchronously).
	setPortState(t, root, "mlx5_2", "1: DOWN")
	mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionFalse, agentSettle)
	waitLabels(t, c, node.Name, "false", "8")
	waitResyncs(3)
	want := map[string]int{"apply pxnrailmaps/status": 1, "patch nodes": 1, "post events": 2}
	var change map[string]int
	eventually(t, agentSettle, func() error {
		change = diffCounts(quiet, counter.snapshot())
		if change["post events"] < want["post events"] {
			return fmt.Errorf("requests %v, waiting for the Events", change)
		}
		return nil
	})
	waitResyncs(3)
	change = diffCounts(quiet, counter.snapshot())
	t.Logf("requests for one port going down: %v", change)
	if !maps.Equal(change, want) {
		t.Errorf("one change made requests %v, want %v", change, want)
	}
}

// createOtherMaps creates n PxnRailMaps of other nodes, each with the
// layout in its status, and deletes them at the end of the test.
func createOtherMaps(t *testing.T, c client.Client, n int, layout pxnv1alpha1.RailLayout) {
	t.Helper()
	ctx := context.Background()
	names := make(chan string)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				m := &pxnv1alpha1.PxnRailMap{
					ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pxn.test/bulk": "true"}},
					Spec:       pxnv1alpha1.PxnRailMapSpec{NodeName: name},
				}
				if err := c.Create(ctx, m); err != nil {
					errs <- err
					continue
				}
				layout.DeepCopyInto(&m.Status.RailLayout)
				m.Status.GPUCount, m.Status.HCACount = int32(len(layout.GPUs)), int32(len(layout.HCAs))
				if err := c.Status().Update(ctx, m); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range n {
		names <- fmt.Sprintf("other-node-%03d", i)
	}
	close(names)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("create other maps: %v", err)
	}
	t.Cleanup(func() {
		err := c.DeleteAllOf(context.Background(), &pxnv1alpha1.PxnRailMap{}, client.MatchingLabels{"pxn.test/bulk": "true"})
		if err != nil {
			t.Errorf("delete other maps: %v", err)
		}
	})
}
