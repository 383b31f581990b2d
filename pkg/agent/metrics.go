// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	discoveries prometheus.Counter
	publishes   *prometheus.CounterVec
	errors      *prometheus.CounterVec
	rails       prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
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
	}
	for _, target := range []string{"map", "status", "node-labels"} {
		m.publishes.WithLabelValues(target)
	}
	for _, op := range []string{"discover", "publish"} {
		m.errors.WithLabelValues(op)
	}
	for _, c := range []prometheus.Collector{m.discoveries, m.publishes, m.errors, m.rails} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register agent metrics: %w", err)
		}
	}
	return m, nil
}
