// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
)

func TestRecordConditionChanges(t *testing.T) {
	ready := metav1.Condition{Type: pxnv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonPortsActive, Message: "every port of the 8 rails is ACTIVE"}
	down := metav1.Condition{Type: pxnv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonPortsNotActive, Message: "mlx5_2 port 1 DOWN"}
	failed := metav1.Condition{Type: pxnv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonDiscoveryFailed, Message: "host root: no such file"}
	agree := metav1.Condition{Type: pxnv1alpha1.ConditionConsistent, Status: metav1.ConditionTrue, Reason: ReasonRailsAgree, Message: "agree"}
	conflict := metav1.Condition{Type: pxnv1alpha1.ConditionConsistent, Status: metav1.ConditionFalse, Reason: ReasonRailsConflict, Message: strings.Repeat("HCA mlx5_0 is on rail \"a\" on n1 and on rail \"b\" on n2; ", 60)}
	moreConflict := conflict
	moreConflict.Message = "HCA mlx5_1 is on rail \"a\" on n1 and on rail \"b\" on n3"

	tests := []struct {
		name     string
		old, cur []metav1.Condition
		want     []string // per changed condition: "TYPE REASON ACTION", each on the map then the node
	}{
		{name: "first publish", cur: []metav1.Condition{ready, agree},
			want: []string{"Normal PortsActive Discover", "Normal RailsAgree CompareRails"}},
		{name: "unchanged", old: []metav1.Condition{ready, agree}, cur: []metav1.Condition{ready, agree}},
		{name: "port down", old: []metav1.Condition{ready, agree}, cur: []metav1.Condition{down, agree},
			want: []string{"Warning PortsNotActive Discover"}},
		{name: "discovery fails while ports are down", old: []metav1.Condition{down, agree}, cur: []metav1.Condition{failed, agree},
			want: []string{"Warning DiscoveryFailed Discover"}},
		{name: "conflict", old: []metav1.Condition{ready, agree}, cur: []metav1.Condition{ready, conflict},
			want: []string{"Warning RailsConflict CompareRails"}},
		{name: "a conflict's message changes", old: []metav1.Condition{ready, conflict}, cur: []metav1.Condition{ready, moreConflict}},
	}
	node := &corev1.Node{TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1"}}
	railMap := &pxnv1alpha1.PxnRailMap{TypeMeta: metav1.TypeMeta{Kind: "PxnRailMap", APIVersion: pxnv1alpha1.GroupVersion.String()},
		ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u2"}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := events.NewFakeRecorder(16)
			rec.Verbose = true
			recordConditionChanges(rec, node, railMap, tc.old, tc.cur)
			close(rec.Events)
			var got []string
			for e := range rec.Events {
				got = append(got, e)
			}
			if len(got) != 2*len(tc.want) {
				t.Fatalf("events %q, want two (map, node) for each of %q", got, tc.want)
			}
			for i, w := range tc.want {
				for j, regarding := range []string{"PxnRailMap", "Node"} {
					e := got[2*i+j]
					objs := strings.Index(e, " {kind=")
					if !strings.HasPrefix(e, w+" ") || objs < 0 || !strings.HasPrefix(e[objs:], " {kind="+regarding+",") {
						t.Errorf("event %q, want %q regarding the %s", e, w, regarding)
						continue
					}
					if note := e[len(w)+1 : objs]; len(note) > maxEventNote || !strings.HasPrefix(note, tc.cur[0].Type) && !strings.HasPrefix(note, tc.cur[1].Type) {
						t.Errorf("note %q (%d bytes): want at most %d bytes, naming the condition", note, len(note), maxEventNote)
					}
				}
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"0123456789abc", 10, "0123456..."},
		{"ééééé", 8, "éé..."}, // 2 bytes per é: cut on a rune boundary
	} {
		if got := truncate(tc.in, tc.n); got != tc.want || len(got) > tc.n {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
