// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"fmt"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
)

// ReportingController names the agent in the Events it writes.
const ReportingController = "pxn.io/agent"

// Event actions, one per condition type.
const (
	ActionDiscover = "Discover"
	ActionCompare  = "CompareRails"
)

// maxEventNote is the API server's limit on an Event's note.
const maxEventNote = 1024

// recordConditionChanges writes one Event on the node's PxnRailMap and one on
// the Node for every condition whose status or reason differs from old (the
// published one; nil before the first publish). It is called after cur was
// written, so a write that fails and is retried does not repeat the Events,
// and an unchanged node, whose conditions equal old, writes none.
func recordConditionChanges(rec events.EventRecorder, node *corev1.Node, railMap runtime.Object, old, cur []metav1.Condition) {
	for _, c := range cur {
		if prev := meta.FindStatusCondition(old, c.Type); prev != nil && prev.Status == c.Status && prev.Reason == c.Reason {
			continue
		}
		typ := corev1.EventTypeWarning
		if c.Status == metav1.ConditionTrue {
			typ = corev1.EventTypeNormal
		}
		action := ActionDiscover
		if c.Type == pxnv1alpha1.ConditionConsistent {
			action = ActionCompare
		}
		note := truncate(fmt.Sprintf("%s is %s: %s", c.Type, c.Status, c.Message), maxEventNote)
		rec.Eventf(railMap, node, typ, c.Reason, action, "%s", note)
		rec.Eventf(node, railMap, typ, c.Reason, action, "%s", note)
	}
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "..."
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
