// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/pkg/agent"
)

// TestEventsExplainChanges runs the agent with its own Event recorder on a
// real API server and checks the Events a port going down and a failing
// discovery leave on the node and its PxnRailMap: one per change and object,
// none per resync.
func TestEventsExplainChanges(t *testing.T) {
	cfg := controlPlane(t)
	c := newClient(t, cfg)
	clients := kubernetes.NewForConfigOrDie(cfg)
	// A node name of its own for each run: Events outlive their Node, and
	// a run of -count above 1 would see the runs' before it.
	node := createNode(t, c, fmt.Sprintf("gpu-node-events-%x", time.Now().UnixNano()))
	root := copyFixture(t, "hgx-8gpu")
	const resync = 200 * time.Millisecond
	a := startAgent(t, cfg, railAgent(node.Name, root, resync, 50*time.Millisecond))
	ctx := context.Background()

	// eventsAbout returns "Type Reason" of the Events regarding the node's
	// map and the node, in creation order, with the Events themselves.
	eventsAbout := func() (onMap, onNode []string, all []eventsv1.Event) {
		t.Helper()
		list, err := clients.EventsV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Regarding.Name != node.Name || e.ReportingController != agent.ReportingController {
				continue
			}
			all = append(all, e)
			s := e.Type + " " + e.Reason
			switch e.Regarding.Kind {
			case "PxnRailMap":
				onMap = append(onMap, s)
			case "Node":
				onNode = append(onNode, s)
				if e.Regarding.UID != node.UID {
					t.Errorf("Event %s regards node UID %s, want %s", e.Name, e.Regarding.UID, node.UID)
				}
			}
		}
		return onMap, onNode, all
	}
	waitEvents := func(want ...string) []eventsv1.Event {
		t.Helper()
		var all []eventsv1.Event
		eventually(t, agentSettle, func() error {
			var onMap, onNode []string
			onMap, onNode, all = eventsAbout()
			for _, got := range [][]string{onMap, onNode} {
				if !sameSet(got, want) {
					return fmt.Errorf("Events on the map %q and on the node %q, want %q on each", onMap, onNode, want)
				}
			}
			return nil
		})
		return all
	}
	// settled waits for a few resyncs, then checks that they added no Event.
	settled := func(want ...string) {
		t.Helper()
		n := a.metric(t, "pxn_agent_discoveries_total")
		eventually(t, agentSettle, func() error {
			if d := a.metric(t, "pxn_agent_discoveries_total") - n; d < 5 {
				return fmt.Errorf("%v discoveries, waiting for 5", d)
			}
			return nil
		})
		for _, e := range waitEvents(want...) {
			if e.Series != nil {
				t.Errorf("Event %s %s repeated %d times", e.Reason, e.Note, e.Series.Count)
			}
		}
	}

	mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionTrue, 30*time.Second)
	settled("Normal PortsActive", "Normal RailsAgree")

	setPortState(t, root, "mlx5_2", "1: DOWN")
	mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionFalse, agentSettle)
	all := waitEvents("Normal PortsActive", "Normal RailsAgree", "Warning PortsNotActive")
	for _, e := range all {
		if e.Reason == agent.ReasonPortsNotActive && (e.Action != agent.ActionDiscover || !strings.Contains(e.Note, "mlx5_2 port 1 DOWN")) {
			t.Errorf("PortsNotActive Event: action %q note %q, want %s naming the port", e.Action, e.Note, agent.ActionDiscover)
		}
	}
	settled("Normal PortsActive", "Normal RailsAgree", "Warning PortsNotActive")

	// Discovery fails: the host root is gone, at once (a rename; removing
	// the tree file by file would show a discovery a half-removed host).
	if err := os.Rename(root, root+".gone"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root + ".gone") })
	cond := mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionFalse, agentSettle)
	eventually(t, agentSettle, func() error {
		cond = mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionFalse, time.Second)
		if cond.Reason != agent.ReasonDiscoveryFailed {
			return fmt.Errorf("Ready reason %s", cond.Reason)
		}
		return nil
	})
	all = waitEvents("Normal PortsActive", "Normal RailsAgree", "Warning PortsNotActive", "Warning DiscoveryFailed")
	for _, e := range all {
		if e.Reason == agent.ReasonDiscoveryFailed && !strings.Contains(e.Note, "host root") {
			t.Errorf("DiscoveryFailed Event note %q, want the discovery error", e.Note)
		}
	}
	settled("Normal PortsActive", "Normal RailsAgree", "Warning PortsNotActive", "Warning DiscoveryFailed")

	out := kubectl(t, "describe", "node", node.Name)
	if !strings.Contains(out, "DiscoveryFailed") || !strings.Contains(out, "PortsNotActive") {
		t.Errorf("kubectl describe node shows no PXN Events:\n%s", out)
	}
	out = kubectl(t, "describe", "prm", node.Name)
	if !strings.Contains(out, "DiscoveryFailed") {
		t.Errorf("kubectl describe prm shows no PXN Events:\n%s", out)
	}
}

func sameSet(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	seen := map[string]int{}
	for _, s := range got {
		seen[s]++
	}
	for _, s := range want {
		if seen[s] != 1 {
			return false
		}
	}
	return true
}
