// SPDX-License-Identifier: Apache-2.0

package agent

import (
	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/pkg/rail"
)

// NewDiscovery converts a discovered layout to what the agent publishes.
func NewDiscovery(l *rail.Layout) *Discovery {
	d := &Discovery{Layout: LayoutFromRail(l), Warnings: l.Warnings, SharedSubnetMessage: l.SharedSubnetMessage()}
	d.Ready, d.NotReadyMessage = l.Ready()
	if d.Ready {
		d.NotReadyMessage = ""
	}
	return d
}

// LayoutFromRail converts a discovered layout to the PxnRailMap status form.
func LayoutFromRail(l *rail.Layout) pxnv1alpha1.RailLayout {
	out := pxnv1alpha1.RailLayout{
		Rails:     int32(l.Rails),
		Strategy:  l.Strategy,
		GPUSource: l.GPUSource,
	}
	for _, g := range l.GPUs {
		out.GPUs = append(out.GPUs, pxnv1alpha1.GPU{
			Index: int32(g.Index), UUID: g.UUID, Name: g.Name, PCIBusID: g.PCIBusID, NUMANode: int32(g.NUMANode),
			HCA: g.HCA, Distance: g.Distance, Rail: g.Rail,
		})
	}
	for _, h := range l.HCAs {
		out.HCAs = append(out.HCAs, pxnv1alpha1.HCA{
			Name: h.Name, PCIBusID: h.PCIBusID, NUMANode: int32(h.NUMANode), LinkLayer: h.LinkLayer,
			State: h.State, PhysState: h.PhysState, Rate: h.Rate, Netdev: h.Netdev, Rail: h.Rail, Port: int32(h.Port),
		})
	}
	for _, p := range l.Pairs {
		out.Pairs = append(out.Pairs, pxnv1alpha1.Pair{GPU: int32(p.GPU), HCA: p.HCA, Distance: p.Distance})
	}
	if len(l.RailMap) > 0 {
		out.RailMap = make(map[string]string, len(l.RailMap))
		for k, v := range l.RailMap {
			out.RailMap[k] = v
		}
	}
	return out
}
