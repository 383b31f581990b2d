// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the plugin's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	allocations   *prometheus.CounterVec
	preStarts     *prometheus.CounterVec
	preStartTime  prometheus.Histogram
	registrations *prometheus.CounterVec
	devices       *prometheus.GaugeVec
	gcRemoved     *prometheus.CounterVec
}

// NewMetrics creates the plugin's series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pxn", Subsystem: "device_plugin", Name: "allocations_total",
			Help: "Allocate calls answered, by result.",
		}, []string{"result"}),
		preStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pxn", Subsystem: "device_plugin", Name: "prestarts_total",
			Help: "PreStartContainer calls answered, by result.",
		}, []string{"result"}),
		preStartTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "pxn", Subsystem: "device_plugin", Name: "prestart_duration_seconds",
			Help:    "Time to answer PreStartContainer, including the PodResources lookup.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pxn", Subsystem: "device_plugin", Name: "registrations_total",
			Help: "Registrations with the kubelet, by result.",
		}, []string{"result"}),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "pxn", Subsystem: "device_plugin", Name: "devices",
			Help: "Advertised devices, by health.",
		}, []string{"health"}),
		gcRemoved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pxn", Subsystem: "device_plugin", Name: "gc_removed_total",
			Help: "Slot links and group directories removed by garbage collection.",
		}, []string{"kind"}),
	}
	reg.MustRegister(m.allocations, m.preStarts, m.preStartTime, m.registrations, m.devices, m.gcRemoved)
	return m
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

func (m *Metrics) allocated(err error) {
	if m != nil {
		m.allocations.WithLabelValues(result(err)).Inc()
	}
}

func (m *Metrics) preStarted(err error, seconds float64) {
	if m != nil {
		m.preStarts.WithLabelValues(result(err)).Inc()
		m.preStartTime.Observe(seconds)
	}
}

func (m *Metrics) registered(err error) {
	if m != nil {
		m.registrations.WithLabelValues(result(err)).Inc()
	}
}

// SetDeviceHealth sets the device gauge: all count devices share one health.
func (m *Metrics) SetDeviceHealth(count int, healthy bool) {
	if m == nil {
		return
	}
	h, u := float64(count), 0.0
	if !healthy {
		h, u = 0, float64(count)
	}
	m.devices.WithLabelValues("Healthy").Set(h)
	m.devices.WithLabelValues("Unhealthy").Set(u)
}

func (m *Metrics) collected(slots, groups int) {
	if m != nil {
		m.gcRemoved.WithLabelValues("slot").Add(float64(slots))
		m.gcRemoved.WithLabelValues("group").Add(float64(groups))
	}
}
