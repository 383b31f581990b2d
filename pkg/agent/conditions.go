// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
)

// Reasons of the Ready condition.
const (
	ReasonPortsActive     = "PortsActive"
	ReasonPortsNotActive  = "PortsNotActive"
	ReasonNoRails         = "NoRails"
	ReasonDiscoveryFailed = "DiscoveryFailed"
	// ReasonSubnetPrefixShared: the subnet strategy found HCAs sharing one
	// InfiniBand subnet prefix and railed none of them; the message names
	// the strategy, the prefix and the HCAs.
	ReasonSubnetPrefixShared = "SubnetPrefixShared"
)

// Reasons of the Consistent condition.
const (
	ReasonRailsAgree    = "RailsAgree"
	ReasonRailsConflict = "RailsConflict"
)

// maxConflictMessage bounds the Consistent message; conflicts past it are
// counted, not listed.
const maxConflictMessage = 4096

// readyCondition judges the node's ports. d is the last successful discovery
// (nil if none) and err the latest discovery error.
func readyCondition(d *Discovery, err error) metav1.Condition {
	c := metav1.Condition{Type: pxnv1alpha1.ConditionReady, Status: metav1.ConditionFalse}
	switch {
	case err != nil:
		c.Reason, c.Message = ReasonDiscoveryFailed, err.Error()
	case d == nil:
		c.Status, c.Reason, c.Message = metav1.ConditionUnknown, ReasonDiscoveryFailed, "no discovery has completed yet"
	case d.SharedSubnetMessage != "":
		c.Reason, c.Message = ReasonSubnetPrefixShared, d.SharedSubnetMessage
	case d.Layout.Rails == 0:
		c.Reason, c.Message = ReasonNoRails, "no HCA is on a rail"
	case !d.Ready:
		c.Reason, c.Message = ReasonPortsNotActive, d.NotReadyMessage
	default:
		c.Status, c.Reason = metav1.ConditionTrue, ReasonPortsActive
		c.Message = fmt.Sprintf("every port of the %d rails is ACTIVE", d.Layout.Rails)
	}
	return c
}

// consistentCondition compares the node's rail map with the other nodes'
// maps: an HCA name must map to the same rail on every node that has it.
func consistentCondition(node string, own map[string]string, others []pxnv1alpha1.PxnRailMap) metav1.Condition {
	// hca -> rail -> nodes
	seen := map[string]map[string][]string{}
	for hca, rail := range own {
		seen[hca] = map[string][]string{rail: {node}}
	}
	for i := range others {
		o := &others[i]
		if o.Name == node {
			continue
		}
		for hca, rail := range o.Status.RailMap {
			if byRail, ok := seen[hca]; ok {
				byRail[rail] = append(byRail[rail], o.Name)
			}
		}
	}
	var conflicts []string
	for hca, byRail := range seen {
		if len(byRail) > 1 {
			conflicts = append(conflicts, describeConflict(hca, byRail))
		}
	}
	if len(conflicts) == 0 {
		return metav1.Condition{
			Type: pxnv1alpha1.ConditionConsistent, Status: metav1.ConditionTrue, Reason: ReasonRailsAgree,
			Message: "every HCA name of this node maps to the same rail on every node that has it",
		}
	}
	sort.Strings(conflicts)
	var b strings.Builder
	for i, s := range conflicts {
		if b.Len()+len(s) > maxConflictMessage {
			fmt.Fprintf(&b, "; and %d more HCAs", len(conflicts)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(s)
	}
	return metav1.Condition{
		Type: pxnv1alpha1.ConditionConsistent, Status: metav1.ConditionFalse, Reason: ReasonRailsConflict,
		Message: b.String(),
	}
}

// describeConflict says e.g. `HCA mlx5_0 is on rail "rail0" on node-a, node-b
// and on rail "rail1" on node-c`, naming at most a few nodes per rail.
func describeConflict(hca string, byRail map[string][]string) string {
	const maxNodes = 3
	rails := make([]string, 0, len(byRail))
	for r := range byRail {
		rails = append(rails, r)
	}
	sort.Strings(rails)
	parts := make([]string, 0, len(rails))
	for _, r := range rails {
		nodes := slices.Sorted(slices.Values(byRail[r]))
		list := strings.Join(nodes[:min(len(nodes), maxNodes)], ", ")
		if len(nodes) > maxNodes {
			list += fmt.Sprintf(" and %d more", len(nodes)-maxNodes)
		}
		parts = append(parts, fmt.Sprintf("on rail %q on %s", r, list))
	}
	return fmt.Sprintf("HCA %s is %s", hca, strings.Join(parts, " and "))
}

// keepTransitionTimes gives each desired condition the transition time of the
// existing condition of the same type when its status did not change, and now
// otherwise, so that an unchanged node produces an identical status.
func keepTransitionTimes(desired, existing []metav1.Condition, now metav1.Time) {
	for i := range desired {
		c := &desired[i]
		if old := meta.FindStatusCondition(existing, c.Type); old != nil && old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		} else {
			c.LastTransitionTime = now
		}
	}
}
