// SPDX-License-Identifier: Apache-2.0

// Package buildinfo exports a binary's version as a Prometheus metric.
package buildinfo

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pxn-project/pxn/internal/version"
)

// Collector is the pxn_build_info gauge: always 1, its labels say what runs.
func Collector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "pxn_build_info",
		Help:        "Always 1; the labels are the PXN release, the VCS revision and the Go version the binary was built from.",
		ConstLabels: prometheus.Labels{"version": version.String(), "revision": version.Revision(), "goversion": runtime.Version()},
	}, func() float64 { return 1 })
}

// Register adds Collector to reg; a second registration of the same gauge
// (a process that starts its command twice, as tests do) is not an error.
func Register(reg prometheus.Registerer) error {
	err := reg.Register(Collector())
	if _, ok := err.(prometheus.AlreadyRegisteredError); ok {
		return nil
	}
	return err
}
