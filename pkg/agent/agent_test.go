// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/rail"
)

func TestAgentPublishesFixtureNode(t *testing.T) {
	cfg := controlPlane(t)
	c := newClient(t, cfg)
	node := createNode(t, c, "gpu-node-a")
	root := copyFixture(t, "hgx-8gpu")
	const resync = time.Second
	// The fingerprint poll is off here, so only the resync can see the port
	// change below.
	a := startAgent(t, cfg, railAgent(node.Name, root, resync, time.Hour))

	mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionTrue, 30*time.Second)
	m, err := getMap(c, node.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.OwnerReferences; len(got) != 1 || got[0].UID != node.UID || got[0].Kind != "Node" || got[0].Name != node.Name {
		t.Errorf("ownerReferences = %+v, want the Node %s/%s", got, node.Name, node.UID)
	}
	s := m.Status
	if s.Rails != 8 || s.GPUCount != 8 || s.HCACount != 10 || len(s.GPUs) != 8 || len(s.HCAs) != 10 ||
		s.RailMap["mlx5_0"] != "rail0" || s.Strategy != rail.StrategyPCIOrder || s.AgentVersion != "test" || len(s.Pairs) != 80 {
		t.Errorf("status = rails %d gpuCount %d hcaCount %d gpus %d hcas %d railMap %v strategy %q agentVersion %q pairs %d",
			s.Rails, s.GPUCount, s.HCACount, len(s.GPUs), len(s.HCAs), s.RailMap, s.Strategy, s.AgentVersion, len(s.Pairs))
	}
	mapCondition(t, c, node.Name, pxnv1alpha1.ConditionConsistent, metav1.ConditionTrue, agentSettle)
	waitLabels(t, c, node.Name, "true", "8")
	for _, f := range m.ManagedFields {
		if f.Manager != agent.FieldManager || f.Operation != metav1.ManagedFieldsOperationApply {
			t.Errorf("managed fields entry %s/%s, want only %s/Apply", f.Manager, f.Operation, agent.FieldManager)
		}
	}
	if a.metric(t, "pxn_agent_rails") != 8 || a.metric(t, "pxn_agent_discoveries_total") < 1 ||
		a.metric(t, "pxn_agent_publishes_total", "target", "status") < 1 {
		t.Errorf("metrics: rails %v discoveries %v status publishes %v", a.metric(t, "pxn_agent_rails"),
			a.metric(t, "pxn_agent_discoveries_total"), a.metric(t, "pxn_agent_publishes_total", "target", "status"))
	}

	eventually(t, agentSettle, func() error {
		if r, c := a.metric(t, "pxn_agent_rail_map_condition", "condition", "Ready"), a.metric(t, "pxn_agent_rail_map_condition", "condition", "Consistent"); r != 1 || c != 1 {
			return fmt.Errorf("pxn_agent_rail_map_condition Ready %v Consistent %v, want 1 and 1", r, c)
		}
		return nil
	})

	table := kubectl(t, "get", "pxnrailmaps", node.Name)
	t.Logf("kubectl get pxnrailmaps %s:\n%s", node.Name, table)
	header := regexp.MustCompile(`^NAME\s+RAILS\s+GPUS\s+HCAS\s+READY\s+CONSISTENT\s+AGE\n`)
	row := regexp.MustCompile(`\n` + node.Name + `\s+8\s+8\s+10\s+True\s+True\s+\d+s\n`)
	if !header.MatchString(table) || !row.MatchString(table) {
		t.Errorf("kubectl table does not show the columns and values:\n%s", table)
	}
	yaml := kubectl(t, "get", "prm", node.Name, "-o", "yaml")
	t.Logf("kubectl get prm %s -o yaml:\n%s", node.Name, yaml)
	for _, want := range []string{"kind: PxnRailMap", "mlx5_0: rail0", "distance: PIX", "type: Ready", "reason: PortsActive", "gpuCount: 8"} {
		if !strings.Contains(yaml, want) {
			t.Errorf("kubectl get prm -o yaml lacks %q", want)
		}
	}

	// A port goes down: the next resync notices.
	readySince := mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionTrue, time.Second).LastTransitionTime
	setPortState(t, root, "mlx5_4", "1: DOWN")
	changed := time.Now()
	cond := mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionFalse, resync+agentSettle)
	t.Logf("Ready flipped %v after the port went down (resync %v): %s %s: %s",
		time.Since(changed).Round(10*time.Millisecond), resync, cond.Status, cond.Reason, cond.Message)
	if cond.Reason != agent.ReasonPortsNotActive || !strings.Contains(cond.Message, "mlx5_4") || !strings.Contains(cond.Message, "DOWN") {
		t.Errorf("Ready = %s %q, want %s naming mlx5_4 DOWN", cond.Reason, cond.Message, agent.ReasonPortsNotActive)
	}
	if !cond.LastTransitionTime.After(readySince.Time) && !cond.LastTransitionTime.Equal(&readySince) {
		t.Errorf("lastTransitionTime went back: %v then %v", readySince, cond.LastTransitionTime)
	}
	waitLabels(t, c, node.Name, "false", "8")
	table = kubectl(t, "get", "prm")
	t.Logf("kubectl get prm:\n%s", table)
	if !regexp.MustCompile(`\n` + node.Name + `\s+8\s+8\s+10\s+False\s+`).MatchString(table) {
		t.Errorf("kubectl table does not show READY False:\n%s", table)
	}
	m, err = getMap(c, node.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range m.Status.HCAs {
		if h.Name == "mlx5_4" && h.State != "DOWN" {
			t.Errorf("mlx5_4 state %q, want DOWN", h.State)
		}
	}
}

func TestPortChangeSeenByFingerprintPoll(t *testing.T) {
	cfg := controlPlane(t)
	c := newClient(t, cfg)
	node := createNode(t, c, "gpu-node-poll")
	root := copyFixture(t, "hgx-8gpu")
	// No resync during the test: only the fingerprint poll can notice.
	a := startAgent(t, cfg, railAgent(node.Name, root, time.Hour, 100*time.Millisecond))
	mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionTrue, 30*time.Second)
	discoveries := a.metric(t, "pxn_agent_discoveries_total")

	setPortState(t, root, "mlx5_0", "1: DOWN")
	cond := mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionFalse, agentSettle)
	if !strings.Contains(cond.Message, "mlx5_0") {
		t.Errorf("Ready message %q does not name mlx5_0", cond.Message)
	}
	setPortState(t, root, "mlx5_0", "4: ACTIVE")
	mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionTrue, agentSettle)
	if got := a.metric(t, "pxn_agent_discoveries_total"); got < discoveries+2 {
		t.Errorf("discoveries went from %v to %v, want two more", discoveries, got)
	}
}

func TestNodeRecreatedReownsMap(t *testing.T) {
	cfg := controlPlane(t)
	c := newClient(t, cfg)
	ctx := context.Background()
	old := createNode(t, c, "gpu-node-recreated")
	startAgent(t, cfg, railAgent(old.Name, copyFixture(t, "hgx-8gpu"), 500*time.Millisecond, time.Hour))
	waitOwner(t, c, old.Name, old.UID)
	waitLabels(t, c, old.Name, "true", "8")

	if err := c.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	eventually(t, agentSettle, func() error {
		err := c.Get(ctx, types.NamespacedName{Name: old.Name}, &corev1.Node{})
		if err == nil {
			return fmt.Errorf("node %s still there", old.Name)
		}
		return nil
	})
	renewed := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: old.Name}}
	if err := c.Create(ctx, renewed); err != nil {
		t.Fatal(err)
	}
	if renewed.UID == old.UID {
		t.Fatalf("re-created node kept UID %s", old.UID)
	}
	waitOwner(t, c, old.Name, renewed.UID)
	waitLabels(t, c, old.Name, "true", "8")
}

// waitOwner waits until the map's only owner is the Node with uid.
func waitOwner(t *testing.T, c client.Client, name string, uid types.UID) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		m, err := getMap(c, name)
		if err != nil {
			return err
		}
		if refs := m.OwnerReferences; len(refs) != 1 || refs[0].UID != uid || refs[0].Kind != "Node" {
			return fmt.Errorf("PxnRailMap %s owners %+v, want only Node %s", name, refs, uid)
		}
		return nil
	})
}

// waitLabels waits for the node's pxn.io labels.
func waitLabels(t *testing.T, c client.Client, name, capable, rails string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		n := &corev1.Node{}
		if err := c.Get(context.Background(), types.NamespacedName{Name: name}, n); err != nil {
			return err
		}
		if n.Labels[pxnv1alpha1.LabelCapable] != capable || n.Labels[pxnv1alpha1.LabelRails] != rails {
			return fmt.Errorf("node %s labels %v, want %s=%s %s=%s", name, n.Labels,
				pxnv1alpha1.LabelCapable, capable, pxnv1alpha1.LabelRails, rails)
		}
		return nil
	})
}
