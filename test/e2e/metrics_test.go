// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	metricsNS = "pxn-e2e-metrics"
	// agentMetricsPort is agent.metricsBindAddress of the chart's values.
	agentMetricsPort = "9640"
	// benchRanks and benchBytes are the demo Job's --ranks and --bytes
	// (hack/e2e/bench-job.yaml): one rank per rail, each writing benchBytes
	// across rails.
	benchRanks = 8
	benchBytes = 64 << 20
	// relayedByRail is the query the step, and make cluster-demo, ask.
	relayedByRail = `sum by (rail) (pxn_relayed_bytes_total)`
)

// promSample is one series of an instant query's answer.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s promSample) value() float64 {
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return -1
	}
	return v
}

// prometheus is a Prometheus process of hack/e2e/prometheus.sh.
type prometheus struct {
	c   *cluster
	dir string
	url string
}

// get reads the body of Prometheus's answer at path, with its status line.
func (p *prometheus) get(path string) (body []byte, status string, err error) {
	resp, err := http.Get(p.url + path)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	return body, resp.Status, err
}

// query asks for an instant vector.
func (p *prometheus) query(expr string) ([]promSample, error) {
	body, status, err := p.get("/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	var ans struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string       `json:"resultType"`
			Result     []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		return nil, fmt.Errorf("query %q: %s: %w: %s", expr, status, err, body)
	}
	if ans.Status != "success" {
		return nil, fmt.Errorf("query %q: %s: %s", expr, ans.Status, ans.Error)
	}
	if ans.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %q: a %s, want a vector", expr, ans.Data.ResultType)
	}
	return ans.Data.Result, nil
}

func formatSamples(ss []promSample) string {
	var lines []string
	for _, s := range ss {
		var labels []string
		for k, v := range s.Metric {
			labels = append(labels, fmt.Sprintf("%s=%q", k, v))
		}
		sort.Strings(labels)
		lines = append(lines, fmt.Sprintf("{%s} %v", strings.Join(labels, ", "), s.Value[1]))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// agentTarget returns the agent's metrics address as the chart's metrics
// Service lists it: the EndpointSlice's address and the Service's port.
func (c *cluster) agentTarget() string {
	var target string
	c.poll("the agent's metrics Service lists the agent", time.Minute, func() (bool, string) {
		out, err := c.kc("get", "endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name="+release+"-agent-metrics",
			"-o", `jsonpath={range .items[*].endpoints[*]}{.addresses[0]}{" "}{.conditions.ready}{"\n"}{end}`)
		if err != nil {
			return false, err.Error()
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[1] == "true" {
				target = f[0] + ":" + agentMetricsPort
				return true, ""
			}
		}
		return false, "endpoints: " + out
	})
	return target
}

// startPrometheus runs Prometheus on this host, scraping target, until the
// step ends.
func (c *cluster) startPrometheus(target string) *prometheus {
	t := c.t
	script := filepath.Join(c.repo, "hack", "e2e", "prometheus.sh")
	dir := t.TempDir()
	t.Cleanup(func() {
		if out, err := c.detached().run(time.Minute, "bash", script, "stop", dir); err != nil {
			t.Errorf("stop prometheus: %v\n%s", err, out)
		}
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "prometheus.log")); err == nil {
				t.Logf("prometheus log:\n%s", lastLines(string(b), 40))
			}
		}
	})
	// prometheus.sh bounds its own wait for readiness (60 s).
	out, err := c.run(2*time.Minute, "bash", script, "start", dir, target)
	if err != nil {
		t.Fatalf("start prometheus: %v\n%s", err, out)
	}
	u, err := os.ReadFile(filepath.Join(dir, "url"))
	if err != nil {
		t.Fatal(err)
	}
	return &prometheus{c: c, dir: dir, url: strings.TrimSpace(string(u))}
}

// checkMetrics runs a real Prometheus against the agent while the demo Job's
// ranks run: relayed bytes by rail are above zero on every rail the Job
// used, none fell back, the ranks carry their pod's labels, every query of
// the chart's dashboard is valid PromQL, and the ranks' series end when the
// Job's ranks do.
func (c *cluster) checkMetrics() {
	t := c.t
	prom := c.startPrometheus(c.agentTarget())
	c.poll("Prometheus scrapes the agent", time.Minute, func() (bool, string) {
		ss, err := prom.query(`up{job="pxn-agent"}`)
		if err != nil {
			return false, err.Error()
		}
		return len(ss) == 1 && ss[0].value() == 1, formatSamples(ss)
	})

	c.mustKC("create", "namespace", metricsNS)
	c.root.Cleanup(func() {
		if c.root.Failed() && c.reuse {
			_, _ = c.detached().kc("delete", "namespace", metricsNS, "--ignore-not-found", "--wait=false")
		}
	})
	job, err := os.ReadFile(filepath.Join(c.repo, "hack", "e2e", "bench-job.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	manifest := strings.NewReplacer("namespace: pxn-demo", "namespace: "+metricsNS, "image: pxn:local", "image: "+c.image).Replace(string(job))
	if !strings.Contains(manifest, "--hold-after") || !strings.Contains(manifest, "--bytes=64MiB") || !strings.Contains(manifest, "--ranks=8") {
		t.Fatalf("hack/e2e/bench-job.yaml is not the Job this step knows (--ranks=8, --bytes=64MiB, --hold-after):\n%s", manifest)
	}
	c.apply(manifest)

	// While the ranks run (the Job's --hold-after keeps them registered
	// after the transfer). The bound covers the pod's start and the
	// bench's transfer on a loaded machine.
	var byRail []promSample
	c.poll("relayed bytes above zero on every rail of the Job", podStartTimeout+5*time.Minute, func() (bool, string) {
		if st := c.jobState(); st != "" {
			t.Fatalf("the Job finished (%s) before Prometheus saw relayed bytes on every rail; last answer:\n%s", st, formatSamples(byRail))
		}
		ss, err := prom.query(relayedByRail)
		if err != nil {
			return false, err.Error()
		}
		byRail = ss
		positive := 0
		for _, s := range ss {
			if s.value() > 0 {
				positive++
			}
		}
		return positive == benchRanks, fmt.Sprintf("%d of %d rails above zero:\n%s", positive, benchRanks, formatSamples(ss))
	})
	t.Logf("%s, first answer above zero on every rail:\n%s", relayedByRail, formatSamples(byRail))
	// Then, once the transfer is over, every rank's 64 MiB (and the
	// bench's later 10 KiB write).
	c.poll("every rail's relayed bytes at least the Job's --bytes", 5*time.Minute, func() (bool, string) {
		if st := c.jobState(); st != "" {
			t.Fatalf("the Job finished (%s) before Prometheus saw %d relayed bytes on every rail; last answer:\n%s", st, benchBytes, formatSamples(byRail))
		}
		ss, err := prom.query(relayedByRail)
		if err != nil {
			return false, err.Error()
		}
		byRail = ss
		full := 0
		for _, s := range ss {
			if s.value() >= benchBytes {
				full++
			}
		}
		return full == benchRanks, fmt.Sprintf("%d of %d rails at %d bytes:\n%s", full, benchRanks, benchBytes, formatSamples(ss))
	})
	t.Logf("%s:\n%s", relayedByRail, formatSamples(byRail))
	rails := map[string]bool{}
	for _, s := range byRail {
		rails[s.Metric["rail"]] = true
	}
	for k := range benchRanks {
		if !rails[fmt.Sprintf("rail%d", k)] {
			t.Errorf("no relayed bytes for rail%d, a rail of the Job's ranks: %v", k, rails)
		}
	}

	pod := strings.TrimSpace(c.mustKC("get", "pods", "-n", metricsNS, "-l", "job-name=pxn-bench", "-o", "jsonpath={.items[0].metadata.name}"))
	for _, tc := range []struct {
		expr  string
		check func([]promSample) bool
	}{
		{`sum(pxn_fallback_bytes_total)`, func(ss []promSample) bool { return len(ss) == 1 && ss[0].value() == 0 }},
		{`sum by (node, namespace, pod, device) (pxn_ranks)`, func(ss []promSample) bool {
			return len(ss) == 1 && ss[0].value() == benchRanks && ss[0].Metric["node"] == c.node &&
				ss[0].Metric["namespace"] == metricsNS && ss[0].Metric["pod"] == pod && ss[0].Metric["device"] == "host"
		}},
		{`sum(pxn_failed_pieces_total)`, func(ss []promSample) bool { return len(ss) == 1 && ss[0].value() == 0 }},
	} {
		ss, err := prom.query(tc.expr)
		if err != nil {
			t.Error(err)
			continue
		}
		t.Logf("%s:\n%s", tc.expr, formatSamples(ss))
		if !tc.check(ss) {
			t.Errorf("%s answers\n%s\nwant it for the Job's %d ranks in pod %s/%s on %s, nothing fallen back or failed", tc.expr, formatSamples(ss), benchRanks, metricsNS, pod, c.node)
		}
	}
	c.checkDashboardQueries(prom)

	c.poll("the Job complete", 10*time.Minute, func() (bool, string) {
		st := c.jobState()
		if st == "Failed" {
			logs, _ := c.kc("-n", metricsNS, "logs", "job/pxn-bench")
			t.Fatalf("the Job failed:\n%s", logs)
		}
		return st == "Complete", "conditions: " + st
	})
	t.Logf("the Job's table:\n%s", lastLines(c.mustKC("-n", metricsNS, "logs", "job/pxn-bench"), 6))
	c.poll("the departed ranks' series gone", 2*time.Minute, func() (bool, string) {
		ss, err := prom.query(`pxn_ranks`)
		if err != nil {
			return false, err.Error()
		}
		return len(ss) == 0, formatSamples(ss)
	})
	c.mustKC("delete", "namespace", metricsNS, "--wait=true", "--timeout=2m")
}

// jobState is the demo Job's final condition (Complete, Failed), or "".
func (c *cluster) jobState() string {
	out, err := c.kc("get", "job", "-n", metricsNS, "pxn-bench", "-o", `jsonpath={range .status.conditions[?(@.status=="True")]}{.type} {end}`)
	if err != nil {
		return ""
	}
	for _, s := range strings.Fields(out) {
		if s == "Complete" || s == "Failed" {
			return s
		}
	}
	return ""
}

// checkDashboardQueries asks Prometheus every query of the chart's
// dashboard, with the dashboard's variables set to match everything: each
// must be valid PromQL, and the panel of relayed bytes per rail must show
// the Job's rails. (A unit test checks the metric names against the
// agent's output; this checks the language.)
func (c *cluster) checkDashboardQueries(prom *prometheus) {
	t := c.t
	b, err := os.ReadFile(filepath.Join(c.repo, "charts", "pxn", "dashboards", "pxn.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	var d any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	walk(d)
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)
	vars := strings.NewReplacer("$__rate_interval", "1m", "$node", ".*", "$namespace", ".*")
	relayedPanel := false
	for _, e := range exprs {
		q := vars.Replace(e)
		if m := labelValues.FindStringSubmatch(q); m != nil {
			q = m[1]
		}
		if _, err := prom.query(q); err != nil {
			t.Errorf("dashboard query %q: %v", e, err)
			continue
		}
		if strings.HasPrefix(e, "sum by (rail) (rate(pxn_relayed_bytes_total") {
			relayedPanel = true
			// A rate needs two scrapes of a series: the ranks may be
			// younger than that.
			c.poll("the dashboard's relayed-per-rail panel shows the Job's rails", time.Minute, func() (bool, string) {
				ss, err := prom.query(q)
				if err != nil {
					return false, err.Error()
				}
				return len(ss) == benchRanks, fmt.Sprintf("%d rails, want %d:\n%s", len(ss), benchRanks, formatSamples(ss))
			})
		}
	}
	if len(exprs) < 8 || !relayedPanel {
		t.Errorf("%d dashboard queries, relayed-per-rail panel found: %v", len(exprs), relayedPanel)
	}
}
