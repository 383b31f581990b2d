// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"context"
	"strconv"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/pxn-project/pxn/pkg/nodestate"
)

// healthTimeout is how long the kubelet trusts a health report; reports
// are re-sent three times within it.
const healthTimeout = 30 * time.Second

// WatchHealthStatus reports the relay device's and the rail devices'
// health, from the node's rail state, at once, at every change and every
// healthTimeout/3.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	t := time.NewTicker(healthTimeout / 3)
	defer t.Stop()
	for {
		st, changed := d.state.State()
		select {
		case <-ctx.Done():
			return nil
		case reports <- d.healthReport(st, time.Now()):
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-t.C:
		}
	}
}

func (d *Driver) healthReport(st nodestate.NodeState, now time.Time) kubeletplugin.DeviceHealthReport {
	h := kubeletplugin.DeviceHealth{PoolName: d.cfg.NodeName, DeviceName: DeviceName, LastUpdated: now, HealthCheckTimeout: healthTimeout}
	switch err := ready(d.cfg.NodeName, st); {
	case !st.Discovered:
		h.Health, h.Message = kubeletplugin.HealthStatusUnknown, err.Error()
	case err != nil:
		h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, err.Error()
	default:
		h.Health, h.Message = kubeletplugin.HealthStatusHealthy, st.Summary.Detail
	}
	report := kubeletplugin.DeviceHealthReport{Devices: []kubeletplugin.DeviceHealth{h}}
	for _, r := range railDevices(st.Layout) {
		rh := kubeletplugin.DeviceHealth{PoolName: d.cfg.NodeName, DeviceName: r.name, LastUpdated: now, HealthCheckTimeout: healthTimeout,
			Health: kubeletplugin.HealthStatusHealthy, Message: r.hca.Name + " port " + strconv.Itoa(r.hca.Port) + " " + r.hca.State}
		switch why := r.unhealthy(st); {
		case why == taintDiscoveryFailed:
			rh.Health, rh.Message = kubeletplugin.HealthStatusUnknown, ready(d.cfg.NodeName, st).Error()
		case why != "":
			rh.Health = kubeletplugin.HealthStatusUnhealthy
		}
		report.Devices = append(report.Devices, rh)
	}
	return report
}
