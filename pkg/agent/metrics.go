// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
)

type metrics struct {
	discoveries prometheus.Counter
	publishes   *prometheus.CounterVec
	errors      *prometheus.CounterVec
	rails       prometheus.Gauge
	conditions  *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, node string) (*metrics, error) {
	m := &metrics{
		discoveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pxn_agent_discoveries_total",
			Help: "Rail discoveries run on this node.",
		}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pxn_agent_publishes_total",
			Help: "Writes to the API server, by target: map (metadata and spec), status, node-labels.",
		}, []string{"target"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pxn_agent_errors_total",
			Help: "Failed discoveries and failed reconciliations, by operation.",
		}, []string{"op"}),
		rails: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pxn_agent_rails",
			Help: "Canonical rails found by the last successful discovery.",
		}),
		conditions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "pxn_agent_rail_map_condition",
			Help:        "1 when the condition (Ready, Consistent) of the node's PxnRailMap, as the agent last published it, is True; 0 otherwise, and before the first publish.",
			ConstLabels: prometheus.Labels{"node": node},
		}, []string{"condition"}),
	}
	for _, target := range []string{"map", "status", "node-labels"} {
		m.publishes.WithLabelValues(target)
	}
	for _, op := range []string{"discover", "publish"} {
		m.errors.WithLabelValues(op)
	}
	for _, c := range []string{pxnv1alpha1.ConditionReady, pxnv1alpha1.ConditionConsistent} {
		m.conditions.WithLabelValues(c)
	}
	for _, c := range []prometheus.Collector{m.discoveries, m.publishes, m.errors, m.rails, m.conditions} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register agent metrics: %w", err)
		}
	}
	return m, nil
}
