// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/pxn-project/pxn/pkg/contract"
)

const (
	alertsNS  = "pxn-e2e-alerts"
	refuser   = "refuser"
	badRail   = `{"mlx5_0":`
	alertWait = 3 * time.Minute
)

// chartRuleFile renders the chart's PrometheusRule with the suite's values
// and short waits, and writes its groups as a Prometheus rule file.
func (c *cluster) chartRuleFile() string {
	t := c.t
	out, err := c.run(time.Minute, c.helm, "template", release, filepath.Join(c.repo, "charts", "pxn"),
		"--namespace", namespace,
		"-f", filepath.Join(c.repo, "hack", "e2e", "values.yaml"),
		"-f", filepath.Join(c.dir, "helm-values.yaml"),
		"--set", "prometheusRule.enabled=true", "--set", "prometheusRule.for.configRefused=4s",
		"--show-only", "templates/prometheusrule.yaml")
	if err != nil {
		t.Fatalf("helm template the PrometheusRule: %v\n%s", err, out)
	}
	var rule struct {
		Kind string         `json:"kind"`
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(out), &rule); err != nil || rule.Kind != "PrometheusRule" {
		t.Fatalf("the rendered PrometheusRule (%v):\n%s", err, out)
	}
	b, err := json.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "pxn-rules.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// promRule is one rule of Prometheus' /api/v1/rules answer.
type promRule struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	Health string `json:"health"`
	Error  string `json:"lastError"`
	State  string `json:"state"`
	Alerts []struct {
		Labels map[string]string `json:"labels"`
		State  string            `json:"state"`
	} `json:"alerts"`
}

func (p *prometheus) rules() ([]promRule, error) {
	body, status, err := p.get("/api/v1/rules")
	if err != nil {
		return nil, err
	}
	var ans struct {
		Status string `json:"status"`
		Data   struct {
			Groups []struct {
				Name  string     `json:"name"`
				Rules []promRule `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ans); err != nil || ans.Status != "success" {
		return nil, fmt.Errorf("/api/v1/rules: %s %v: %s", status, err, body)
	}
	var out []promRule
	for _, g := range ans.Data.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// checkAlerts loads the chart's alerts into a real Prometheus scraping the
// agent: Prometheus accepts every rule and evaluates each without error,
// and a pod that refuses its MC_PXN_RAIL_MAP fires PxnConfigRefused,
// naming the variable and the pod, while the node's rail map keeps
// PxnRailMapNotReady quiet.
func (c *cluster) checkAlerts() {
	t := c.t
	rules := c.chartRuleFile()
	c.helmEnv = append(slices.Clone(c.helmEnv), "PXN_PROMETHEUS_RULES="+rules)
	prom := c.startPrometheus(c.agentTarget())

	want := []string{"PxnConfigRefused", "PxnFallbackSustained", "PxnRelayStale", "PxnRailMapNotReady"}
	c.poll("Prometheus loads the chart's alerts and evaluates each", time.Minute, func() (bool, string) {
		rs, err := prom.rules()
		if err != nil {
			return false, err.Error()
		}
		var names, states []string
		healthy := true
		for _, r := range rs {
			names = append(names, r.Name)
			states = append(states, fmt.Sprintf("%s %s health=%s %s", r.Type, r.Name, r.Health, r.Error))
			healthy = healthy && r.Type == "alerting" && r.Health == "ok"
		}
		return healthy && slices.Equal(names, want), strings.Join(states, "; ")
	})
	c.poll("the agent's rail map condition in Prometheus", time.Minute, func() (bool, string) {
		ss, err := prom.query(`pxn_agent_rail_map_condition{condition="Ready"}`)
		if err != nil {
			return false, err.Error()
		}
		return len(ss) == 1 && ss[0].value() == 1 && ss[0].Metric["node"] == c.node, formatSamples(ss)
	})

	c.mustKC("create", "namespace", alertsNS)
	t.Cleanup(func() {
		if out, err := c.detached().kc("delete", "namespace", alertsNS, "--wait=true", "--timeout=2m"); err != nil {
			t.Errorf("delete namespace %s: %v\n%s", alertsNS, err, out)
		}
	})
	cmd, err := json.Marshal([]string{"/probe", "open", contract.EnvRailMap + "=" + badRail})
	if err != nil {
		t.Fatal(err)
	}
	c.apply(strings.Replace(probePod(alertsNS, refuser, relayHolder{}), `command: ["/probe", "sleep"]`, "command: "+string(cmd), 1))
	c.poll("the refusing pod runs with PXN off", podStartTimeout, func() (bool, string) {
		logs, err := c.kc("logs", "-n", alertsNS, refuser)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(logs, "pxn active false") && strings.Contains(logs, "PXN configuration refused") &&
			strings.Contains(logs, contract.EnvRailMap), logs
	})
	logs, _ := c.kc("logs", "-n", alertsNS, refuser)
	t.Logf("the refusing pod's log:\n%s", lastLines(logs, 4))

	c.poll("PxnConfigRefused firing for the pod", alertWait, func() (bool, string) {
		rs, err := prom.rules()
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, r := range rs {
			for _, a := range r.Alerts {
				seen = append(seen, fmt.Sprintf("%s %s %v", r.Name, a.State, a.Labels))
				if r.Name == "PxnConfigRefused" && a.State == "firing" && a.Labels["variable"] == contract.EnvRailMap &&
					a.Labels["pod"] == refuser && a.Labels["namespace"] == alertsNS && a.Labels["node"] == c.node {
					return true, ""
				}
			}
		}
		return false, "alerts: " + strings.Join(seen, "; ")
	})
	rs, err := prom.rules()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		t.Logf("rule %s: health %s, state %s, %d alerts", r.Name, r.Health, r.State, len(r.Alerts))
		if r.Name == "PxnRailMapNotReady" && len(r.Alerts) != 0 {
			t.Errorf("PxnRailMapNotReady has alerts on a Ready node: %+v", r.Alerts)
		}
	}
}
