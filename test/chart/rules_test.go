// SPDX-License-Identifier: Apache-2.0

package chart_test

import (
	"fmt"
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

// helm test runs one verify pod per node: given nodes here, since helm
// template cannot look the cluster's nodes up (the end-to-end suite runs it
// against a real node).
func TestNodeValidationPods(t *testing.T) {
	h := newHelm(t)
	for _, o := range h.template(t) {
		if o.GetAnnotations()["helm.sh/hook"] == "test" {
			t.Errorf("helm template without a cluster rendered test hook %s %s", o.GetKind(), o.GetName())
		}
	}
	// helm test --logs reads the logs of every test hook: only pods may be
	// hooks, and their RBAC comes with the chart.
	objs := h.template(t, "--set", "nodeValidation.nodes={gpu-1,gpu-2}", "--set", "nodeValidation.bytes=4MiB",
		"--set-json", `agent.extraEnv=[{"name":"KUBERNETES_SERVICE_HOST","value":"10.0.0.1"}]`)
	var pods []string
	for _, o := range objs {
		if o.GetAnnotations()["helm.sh/hook"] != "test" {
			continue
		}
		if o.GetKind() != "Pod" {
			t.Errorf("test hook %s %s: only pods may be test hooks", o.GetKind(), o.GetName())
			continue
		}
		pods = append(pods, o.GetName())
		node, _, _ := unstructured.NestedString(o.Object, "spec", "nodeName")
		sa, _, _ := unstructured.NestedString(o.Object, "spec", "serviceAccountName")
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "containers")
		if len(cs) != 1 {
			t.Fatalf("pod %s: %d containers, want 1 (helm test --logs reads one)", o.GetName(), len(cs))
		}
		c := cs[0].(map[string]any)
		args, _, _ := unstructured.NestedStringSlice(c, "args")
		cmd, _, _ := unstructured.NestedStringSlice(c, "command")
		limit, _, _ := unstructured.NestedFieldNoCopy(c, "resources", "limits", "pxn.io/relay")
		relay := fmt.Sprint(limit)
		env, _, _ := unstructured.NestedSlice(c, "env")
		if len(env) != 1 || env[0].(map[string]any)["value"] != "10.0.0.1" {
			t.Errorf("pod %s env %v, want agent.extraEnv", o.GetName(), env)
		}
		if o.GetName() != "pxn-verify-"+node || sa != "pxn-verify" || relay != "1" ||
			!slices.Equal(cmd, []string{"/usr/local/bin/pxn-agent", "verify-node"}) ||
			!slices.Equal(args, []string{"--node-name=" + node, "--bytes=4MiB", "--timeout=5m"}) {
			t.Errorf("pod %s: node %s, sa %s, relay %q, command %v %v", o.GetName(), node, sa, relay, cmd, args)
		}
	}
	if !slices.Equal(pods, []string{"pxn-verify-gpu-1", "pxn-verify-gpu-2"}) {
		t.Errorf("verify pods %v, want one per node", pods)
	}
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
		if o := find(objs, kind, "pxn-verify"); o == nil || len(o.GetAnnotations()) != 0 {
			t.Errorf("%s pxn-verify: %v, want one installed with the chart", kind, o)
		}
	}
	cr := find(objs, "ClusterRole", "pxn-verify")
	if rules, _, _ := unstructured.NestedSlice(cr.Object, "rules"); len(rules) != 1 {
		t.Errorf("verify ClusterRole rules %v, want get pxnrailmaps only", rules)
	}
	for _, o := range h.template(t, "--set", "nodeValidation.nodes={gpu-1}", "--set", "nodeValidation.enabled=false") {
		if o.GetAnnotations()["helm.sh/hook"] == "test" || strings.HasSuffix(o.GetName(), "-verify") {
			t.Errorf("nodeValidation.enabled=false rendered %s %s", o.GetKind(), o.GetName())
		}
	}
}
