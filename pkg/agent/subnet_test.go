// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/rail"
)

// TestSharedInfiniBandPrefixOnPxnRailMap: an InfiniBand node whose subnet
// managers kept the default prefix, discovered with the subnet strategy,
// publishes no rails and says why on its PxnRailMap.
func TestSharedInfiniBandPrefixOnPxnRailMap(t *testing.T) {
	cfg := controlPlane(t)
	c := newClient(t, cfg)
	node := createNode(t, c, "gpu-node-default-prefix")
	root := copyFixture(t, "hgx-8gpu-defaultprefix")
	opts := railAgent(node.Name, root, time.Hour, time.Hour)
	opts.Discoverer = agent.RailDiscoverer{Options: rail.Options{NodeRoot: root, Strategy: rail.StrategySubnet}}
	startAgent(t, cfg, opts)

	cond := mapCondition(t, c, node.Name, pxnv1alpha1.ConditionReady, metav1.ConditionFalse, 30*time.Second)
	if cond.Reason != agent.ReasonSubnetPrefixShared ||
		!strings.Contains(cond.Message, "rail strategy subnet: HCAs mlx5_0, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_7, mlx5_8, mlx5_9 share InfiniBand subnet prefix fe80:0000:0000:0000") {
		t.Errorf("Ready condition %s: %s, want reason %s naming the strategy, the HCAs and the prefix", cond.Reason, cond.Message, agent.ReasonSubnetPrefixShared)
	}
	m, err := getMap(c, node.Name)
	if err != nil {
		t.Fatal(err)
	}
	if s := m.Status; s.Rails != 0 || len(s.RailMap) != 0 || s.HCACount != 10 || s.Strategy != rail.StrategySubnet {
		t.Errorf("status: rails %d, rail map %v, %d HCAs, strategy %q; want no rails, 10 HCAs, subnet", s.Rails, s.RailMap, s.HCACount, s.Strategy)
	}
}
