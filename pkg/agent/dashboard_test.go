// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/pxn-project/pxn/internal/testtools"
)

// dashboardFile is the Grafana dashboard the chart ships.
var dashboardFile = filepath.Join(testtools.RepoRoot(), "charts", "pxn", "dashboards", "pxn.json")

// query is one PromQL expression of the dashboard and where it sits.
type query struct {
	where, expr string
	// label is the label a template variable's label_values query reads.
	label string
}

// dashboardQueries returns every PromQL expression of a dashboard: the
// panels' targets (rows' nested panels included) and the query template
// variables.
func dashboardQueries(t *testing.T, b []byte) []query {
	t.Helper()
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []query
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("%s: panel: %v", dashboardFile, err)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q target %s has no expression", p.Title, tg.RefID)
					continue
				}
				out = append(out, query{where: fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), expr: tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^\s*label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var obj struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				t.Fatalf("variable %s: query %s: %v", v.Name, v.Query, err)
			}
			q = obj.Query
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(SELECTOR, LABEL)", v.Name, q)
			continue
		}
		out = append(out, query{where: "variable " + v.Name, expr: m[1], label: m[2]})
	}
	return out
}

// promqlKeywords are the words of PromQL that are neither metric nor
// function names.
var promqlKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
	"and", "or", "unless", "atan2", "inf", "nan"}

// promqlAggregations are the aggregation operators: a grouping clause may
// stand between them and their parenthesis.
var promqlAggregations = []string{"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
	"bottomk", "topk", "quantile", "limitk", "limit_ratio"}

// promqlNames returns the metric names an expression selects and the label
// names it matches or groups by. It knows enough PromQL for a dashboard:
// selectors with matchers, ranges, functions, aggregations with by or
// without, binary operators with on or ignoring, numbers, strings and
// Grafana's $variables.
func promqlNames(expr string) (metrics, labels []string, err error) {
	isStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isPart := func(c byte) bool { return isStart(c) || c >= '0' && c <= '9' }
	ident := func(i int) (string, int) {
		j := i
		for j < len(expr) && isPart(expr[j]) {
			j++
		}
		return expr[i:j], j
	}
	skipSpace := func(i int) int {
		for i < len(expr) && strings.IndexByte(" \t\n\r", expr[i]) >= 0 {
			i++
		}
		return i
	}
	skipString := func(i int) (int, error) {
		q := expr[i]
		for j := i + 1; j < len(expr); j++ {
			if expr[j] == '\\' && q != '`' {
				j++
				continue
			}
			if expr[j] == q {
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string at %d", i)
	}
	// labelList reads "(a, b)" at i and returns the names.
	labelList := func(i int) ([]string, int, error) {
		i = skipSpace(i)
		if i >= len(expr) || expr[i] != '(' {
			return nil, i, fmt.Errorf("want a label list at %d", i)
		}
		var names []string
		for i++; ; {
			i = skipSpace(i)
			if i >= len(expr) {
				return nil, i, fmt.Errorf("unterminated label list")
			}
			switch c := expr[i]; {
			case c == ')':
				return names, i + 1, nil
			case c == ',':
				i++
			case isStart(c):
				var name string
				name, i = ident(i)
				names = append(names, name)
			default:
				return nil, i, fmt.Errorf("unexpected %q in a label list at %d", c, i)
			}
		}
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case strings.IndexByte(" \t\n\r", c) >= 0:
			i++
		case c == '"' || c == '\'' || c == '`':
			if i, err = skipString(i); err != nil {
				return nil, nil, err
			}
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, nil, fmt.Errorf("unterminated range at %d", i)
			}
			i += j + 1
		case c == '{':
			// Matchers: label, operator, string, separated by commas.
			for i++; ; {
				i = skipSpace(i)
				if i >= len(expr) {
					return nil, nil, fmt.Errorf("unterminated matchers")
				}
				if expr[i] == '}' {
					i++
					break
				}
				if expr[i] == ',' {
					i++
					continue
				}
				if !isStart(expr[i]) {
					return nil, nil, fmt.Errorf("unexpected %q in matchers at %d", expr[i], i)
				}
				var name string
				name, i = ident(i)
				labels = append(labels, name)
				i = skipSpace(i)
				for i < len(expr) && strings.IndexByte("=!~", expr[i]) >= 0 {
					i++
				}
				i = skipSpace(i)
				if i >= len(expr) || strings.IndexByte("\"'`", expr[i]) < 0 {
					return nil, nil, fmt.Errorf("matcher %s has no string value", name)
				}
				if i, err = skipString(i); err != nil {
					return nil, nil, err
				}
			}
		case c == '$':
			_, i = ident(i + 1)
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '.') {
				i++
			}
		case isStart(c):
			var word string
			word, i = ident(i)
			next := skipSpace(i)
			switch {
			case slices.Contains([]string{"by", "without", "on", "ignoring", "group_left", "group_right"}, word):
				if next < len(expr) && expr[next] == '(' {
					var names []string
					if names, i, err = labelList(next); err != nil {
						return nil, nil, err
					}
					labels = append(labels, names...)
				}
			case slices.Contains(promqlKeywords, strings.ToLower(word)):
			case slices.Contains(promqlAggregations, word):
			case next < len(expr) && expr[next] == '(':
				// A function.
			default:
				metrics = append(metrics, word)
			}
		default:
			i++
		}
	}
	return metrics, labels, nil
}

func TestPromqlNames(t *testing.T) {
	for _, tc := range []struct {
		expr            string
		metrics, labels []string
	}{
		{`sum by (rail) (rate(pxn_relayed_bytes_total{node=~"$node", reason!="x"}[$__rate_interval]))`,
			[]string{"pxn_relayed_bytes_total"}, []string{"node", "reason", "rail"}},
		{`sum(rate(a_total[5m])) / ignoring(x) (sum without (pod) (b) + 0.5) > bool 1e3 or on(node) c offset 5m`,
			[]string{"a_total", "b", "c"}, []string{"x", "pod", "node"}},
		{`topk(3, max by(node,rail)(pxn_lanes{direction="inbound"}))`, []string{"pxn_lanes"}, []string{"node", "rail", "direction"}},
	} {
		m, l, err := promqlNames(tc.expr)
		if err != nil || !slices.Equal(m, tc.metrics) || !slices.Equal(slices.Sorted(slices.Values(l)), slices.Sorted(slices.Values(tc.labels))) {
			t.Errorf("promqlNames(%q) = %v, %v, %v; want %v, %v", tc.expr, m, l, err, tc.metrics, tc.labels)
		}
	}
	if _, _, err := promqlNames(`x{a="b"`); err == nil {
		t.Error("unterminated matchers parsed")
	}
}

// checkDashboard checks every query of the chart's dashboard against the
// families of a real scrape: each metric it names is one the agent serves,
// each label it matches or groups by is one of those metrics carries.
func checkDashboard(t *testing.T, fams map[string]*dto.MetricFamily) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	qs := dashboardQueries(t, b)
	if len(qs) < 8 {
		t.Fatalf("%d queries in %s, want the dashboard's panels and variables", len(qs), dashboardFile)
	}
	used := map[string]bool{}
	for _, q := range qs {
		metrics, labels, err := promqlNames(q.expr)
		if err != nil {
			t.Errorf("%s: %q: %v", q.where, q.expr, err)
			continue
		}
		if len(metrics) == 0 {
			t.Errorf("%s: %q selects no metric", q.where, q.expr)
		}
		if q.label != "" {
			labels = append(labels, q.label)
		}
		have := map[string]bool{}
		for _, m := range metrics {
			f := fams[m]
			if f == nil {
				t.Errorf("%s: %q uses %s, which the agent does not serve", q.where, q.expr, m)
				continue
			}
			used[m] = true
			for _, s := range f.GetMetric() {
				for _, l := range s.GetLabel() {
					have[l.GetName()] = true
				}
			}
		}
		for _, l := range labels {
			if !have[l] && len(have) > 0 {
				t.Errorf("%s: %q uses label %s, which none of %v carries", q.where, q.expr, l, metrics)
			}
		}
	}
	for _, m := range []string{"pxn_relayed_bytes_total", "pxn_direct_bytes_total", "pxn_fallback_bytes_total", "pxn_lanes", "pxn_pump_cpu_seconds_total"} {
		if !used[m] {
			t.Errorf("the dashboard shows no %s", m)
		}
	}
}
