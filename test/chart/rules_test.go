// SPDX-License-Identifier: Apache-2.0

package chart_test

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The alerts' names, in the order the chart lists them, with the metric
// each one watches.
var chartAlerts = []struct{ name, metric string }{
	{"PxnConfigRefused", "pxn_rank_config_refused"},
	{"PxnFallbackSustained", "pxn_fallback_bytes_total"},
	{"PxnRelayStale", "pxn_stale_ranks"},
	{"PxnRailMapNotReady", "pxn_agent_rail_map_condition"},
}

func TestPrometheusRule(t *testing.T) {
	h := newHelm(t)
	if r := find(h.template(t), "PrometheusRule", "pxn"); r != nil {
		t.Fatal("a PrometheusRule rendered by default; it is off like the ServiceMonitor")
	}
	objs := h.template(t, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.labels.release=prometheus",
		"--set", "prometheusRule.for.configRefused=30s", "--set", "prometheusRule.fallbackWindow=2m",
		"--set", "prometheusRule.fallbackBytesPerSecond=1048576", "--set", "prometheusRule.severity=critical")
	r := find(objs, "PrometheusRule", "pxn")
	if r == nil {
		t.Fatalf("no PrometheusRule rendered; have %v", names(objs))
	}
	if r.GetAPIVersion() != "monitoring.coreos.com/v1" || r.GetNamespace() != namespace || r.GetLabels()["release"] != "prometheus" {
		t.Errorf("PrometheusRule %s %s/%s labels %v", r.GetAPIVersion(), r.GetNamespace(), r.GetName(), r.GetLabels())
	}
	groups, _, _ := unstructured.NestedSlice(r.Object, "spec", "groups")
	if len(groups) != 1 {
		t.Fatalf("%d rule groups, want 1", len(groups))
	}
	rules, _, _ := unstructured.NestedSlice(groups[0].(map[string]any), "rules")
	var got []string
	for i, x := range rules {
		rule := x.(map[string]any)
		name, _ := rule["alert"].(string)
		got = append(got, name)
		expr, _ := rule["expr"].(string)
		labels, _ := rule["labels"].(map[string]any)
		ann, _ := rule["annotations"].(map[string]any)
		if i < len(chartAlerts) && !strings.Contains(expr, chartAlerts[i].metric) {
			t.Errorf("%s: expr %q does not watch %s", name, expr, chartAlerts[i].metric)
		}
		if labels["severity"] != "critical" || ann["summary"] == nil || ann["description"] == nil {
			t.Errorf("%s: labels %v annotations %v", name, labels, ann)
		}
		// Prometheus' own templates reach Prometheus unexpanded.
		if d, _ := ann["description"].(string); !strings.Contains(d, "{{ $labels.") {
			t.Errorf("%s: description %q lost its Prometheus template", name, d)
		}
	}
	want := make([]string, len(chartAlerts))
	for i, a := range chartAlerts {
		want[i] = a.name
	}
	if !slices.Equal(got, want) {
		t.Fatalf("alerts %v, want %v", got, want)
	}
	refused, fallback := rules[0].(map[string]any), rules[1].(map[string]any)
	if refused["for"] != "30s" || rules[2].(map[string]any)["for"] != "5m" {
		t.Errorf("for: %v and %v, want the value given (30s) and the default (5m)", refused["for"], rules[2].(map[string]any)["for"])
	}
	if e := fallback["expr"].(string); !strings.Contains(e, "[2m]") || !strings.HasSuffix(e, "> 1048576") {
		t.Errorf("PxnFallbackSustained expr %q, want the 2m window and the 1048576 B/s threshold", e)
	}
}
