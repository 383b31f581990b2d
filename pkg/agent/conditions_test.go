// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
)

func railMapOf(name string, railMap map[string]string) pxnv1alpha1.PxnRailMap {
	m := pxnv1alpha1.PxnRailMap{}
	m.Name = name
	m.Status.RailMap = railMap
	return m
}

func TestConsistentCondition(t *testing.T) {
	tests := []struct {
		name       string
		own        map[string]string
		others     []pxnv1alpha1.PxnRailMap
		wantStatus metav1.ConditionStatus
		wantMsg    []string
		notInMsg   []string
	}{
		{
			name:       "alone",
			own:        map[string]string{"mlx5_0": "rail0"},
			wantStatus: metav1.ConditionTrue,
		},
		{
			name: "agreeing and unrelated nodes",
			own:  map[string]string{"mlx5_0": "rail0", "mlx5_1": "rail1"},
			others: []pxnv1alpha1.PxnRailMap{
				railMapOf("b", map[string]string{"mlx5_0": "rail0"}),
				railMapOf("c", map[string]string{"mlx5_7": "rail9"}),
				railMapOf("d", nil),
			},
			wantStatus: metav1.ConditionTrue,
		},
		{
			name: "own stale map in the list is ignored",
			own:  map[string]string{"mlx5_0": "rail0"},
			others: []pxnv1alpha1.PxnRailMap{
				railMapOf("a", map[string]string{"mlx5_0": "rail5"}),
			},
			wantStatus: metav1.ConditionTrue,
		},
		{
			name: "one conflict names HCA, nodes and rails",
			own:  map[string]string{"mlx5_0": "rail0", "mlx5_1": "rail1"},
			others: []pxnv1alpha1.PxnRailMap{
				railMapOf("b", map[string]string{"mlx5_0": "rail-a", "mlx5_1": "rail1"}),
				railMapOf("c", map[string]string{"mlx5_0": "rail0"}),
			},
			wantStatus: metav1.ConditionFalse,
			wantMsg:    []string{`HCA mlx5_0 is on rail "rail-a" on b and on rail "rail0" on a, c`},
			notInMsg:   []string{"mlx5_1"},
		},
		{
			name: "many nodes are elided",
			own:  map[string]string{"mlx5_0": "rail0"},
			others: []pxnv1alpha1.PxnRailMap{
				railMapOf("n1", map[string]string{"mlx5_0": "x"}),
				railMapOf("n2", map[string]string{"mlx5_0": "x"}),
				railMapOf("n3", map[string]string{"mlx5_0": "x"}),
				railMapOf("n4", map[string]string{"mlx5_0": "x"}),
				railMapOf("n5", map[string]string{"mlx5_0": "x"}),
			},
			wantStatus: metav1.ConditionFalse,
			wantMsg:    []string{`on rail "x" on n1, n2, n3 and 2 more`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := consistentCondition("a", tc.own, tc.others)
			if c.Type != pxnv1alpha1.ConditionConsistent || c.Status != tc.wantStatus {
				t.Fatalf("condition = %+v, want status %s", c, tc.wantStatus)
			}
			wantReason := ReasonRailsAgree
			if tc.wantStatus == metav1.ConditionFalse {
				wantReason = ReasonRailsConflict
			}
			if c.Reason != wantReason {
				t.Errorf("reason = %s, want %s", c.Reason, wantReason)
			}
			for _, s := range tc.wantMsg {
				if !strings.Contains(c.Message, s) {
					t.Errorf("message %q does not contain %q", c.Message, s)
				}
			}
			for _, s := range tc.notInMsg {
				if strings.Contains(c.Message, s) {
					t.Errorf("message %q contains %q", c.Message, s)
				}
			}
		})
	}
}

func TestConsistentMessageIsBounded(t *testing.T) {
	own := map[string]string{}
	other := map[string]string{}
	for i := range 2000 {
		hca := "mlx5_" + strings.Repeat("x", 20) + string(rune('a'+i%26)) + strings.Repeat("y", i%50)
		own[hca] = "r1"
		other[hca] = "r2"
	}
	c := consistentCondition("a", own, []pxnv1alpha1.PxnRailMap{railMapOf("b", other)})
	if len(c.Message) > maxConflictMessage+100 || !strings.Contains(c.Message, "more HCAs") {
		t.Errorf("message of %d bytes, want at most about %d ending in a count: %.200q", len(c.Message), maxConflictMessage, c.Message)
	}
}

func TestReadyCondition(t *testing.T) {
	ready := &Discovery{Layout: pxnv1alpha1.RailLayout{Rails: 8}, Ready: true}
	tests := []struct {
		name       string
		d          *Discovery
		err        error
		wantStatus metav1.ConditionStatus
		wantReason string
		wantMsg    string
	}{
		{"ready", ready, nil, metav1.ConditionTrue, ReasonPortsActive, "8 rails"},
		{"port down", &Discovery{Layout: pxnv1alpha1.RailLayout{Rails: 8}, NotReadyMessage: "not active: mlx5_3 port 1 DOWN"}, nil,
			metav1.ConditionFalse, ReasonPortsNotActive, "mlx5_3 port 1 DOWN"},
		{"no rails", &Discovery{}, nil, metav1.ConditionFalse, ReasonNoRails, "no HCA"},
		{"discovery failed after success", ready, errors.New("host root: gone"), metav1.ConditionFalse, ReasonDiscoveryFailed, "host root: gone"},
		{"nothing yet", nil, nil, metav1.ConditionUnknown, ReasonDiscoveryFailed, "no discovery"},
		{"shared subnet prefix", &Discovery{SharedSubnetMessage: "rail strategy subnet: HCAs a, b share InfiniBand subnet prefix fe80:0000:0000:0000"}, nil,
			metav1.ConditionFalse, ReasonSubnetPrefixShared, "rail strategy subnet: HCAs a, b share InfiniBand subnet prefix fe80:0000:0000:0000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := readyCondition(tc.d, tc.err)
			if c.Status != tc.wantStatus || c.Reason != tc.wantReason || !strings.Contains(c.Message, tc.wantMsg) {
				t.Errorf("got %s/%s %q, want %s/%s containing %q", c.Status, c.Reason, c.Message, tc.wantStatus, tc.wantReason, tc.wantMsg)
			}
		})
	}
}

func TestKeepTransitionTimes(t *testing.T) {
	then := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	now := metav1.NewTime(then.Add(time.Hour))
	existing := []metav1.Condition{
		{Type: "Ready", Status: metav1.ConditionTrue, LastTransitionTime: then},
		{Type: "Consistent", Status: metav1.ConditionTrue, LastTransitionTime: then},
	}
	desired := []metav1.Condition{
		{Type: "Ready", Status: metav1.ConditionTrue, Message: "new message, same status"},
		{Type: "Consistent", Status: metav1.ConditionFalse},
		{Type: "Other", Status: metav1.ConditionTrue},
	}
	keepTransitionTimes(desired, existing, now)
	want := []metav1.Time{then, now, now}
	for i, c := range desired {
		if !c.LastTransitionTime.Equal(&want[i]) {
			t.Errorf("%s: lastTransitionTime %v, want %v", c.Type, c.LastTransitionTime, want[i])
		}
	}
}
