// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/pxn-project/pxn/pkg/nodestate"
	"github.com/pxn-project/pxn/pkg/rail"
)

// Attributes of the relay device, in the driver's domain: a CEL selector
// reads them as device.attributes["pxn.io"].rails and so on.
const (
	AttrRails        = "rails"        // int: distinct rails
	AttrRailsReady   = "railsReady"   // bool: a railed HCA port is ACTIVE and discovery succeeded
	AttrGPUs         = "gpus"         // int
	AttrHCAs         = "hcas"         // int
	AttrRailStrategy = "railStrategy" // string: pci-order, subnet or static
	AttrVersion      = "version"      // version: the driver's
)

// Attributes of a rail device, one per railed HCA, in the driver's domain
// (device.attributes["pxn.io"].rail), beside the standard
// resource.kubernetes.io/pcieRoot, pciBusID and numaNode.
const (
	AttrRail         = "rail"         // string: the HCA's canonical rail
	AttrHCA          = "hca"          // string: the HCA's kernel name, mlx5_0
	AttrLinkLayer    = "linkLayer"    // string: InfiniBand or Ethernet
	AttrLinkRateGbps = "linkRateGbps" // int: the main port's rate, when a whole number of Gb/s
	AttrPortState    = "portState"    // string: ACTIVE, DOWN, ...
	AttrHealthy      = "healthy"      // bool: the port is ACTIVE and the latest discovery succeeded
)

// Standard attributes of a rail device.
const (
	AttrPCIeRoot = deviceattribute.StandardDeviceAttributePCIeRoot
	AttrPCIBusID = deviceattribute.StandardDeviceAttributePCIBusID
	AttrNUMANode = deviceattribute.StandardDeviceAttributeNUMANode
)

// TaintUnhealthy is the key of the taint a rail device carries while it
// cannot carry data; its value says why: the port's state, or
// DiscoveryFailed.
const TaintUnhealthy = DriverName + "/unhealthy"

// taintDiscoveryFailed is TaintUnhealthy's value while the latest
// discovery failed: the ports' states are not known.
const taintDiscoveryFailed = "DiscoveryFailed"

// railDevicePrefix opens every rail device's name; the relay device's
// name does not start with it.
const railDevicePrefix = "hca-"

// RailDeviceName is the name of the rail device of an HCA: "hca-" and the
// HCA's name lowercased with every character a DNS label cannot hold as
// '-' (mlx5_0: hca-mlx5-0).
func RailDeviceName(hca string) string {
	b := []byte(strings.ToLower(hca))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return railDevicePrefix + string(b)
}

// railDevice is one railed HCA the driver publishes.
type railDevice struct {
	name string
	hca  rail.HCA
}

// railDevices lists a layout's railed HCAs as devices, in the layout's
// (PCI bus) order. An HCA whose device name is not a DNS label, or is
// another HCA's too, gets none.
func railDevices(l *rail.Layout) []railDevice {
	if l == nil {
		return nil
	}
	var out []railDevice
	seen := map[string]bool{}
	for _, h := range l.HCAs {
		if h.Rail == "" {
			continue
		}
		name := RailDeviceName(h.Name)
		if len(validation.IsDNS1123Label(name)) > 0 || seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, railDevice{name: name, hca: h})
	}
	return out
}

// unhealthy says why a rail device cannot carry data, or "".
func (r railDevice) unhealthy(st nodestate.NodeState) string {
	switch {
	case st.Err != nil:
		return taintDiscoveryFailed
	case r.hca.State != rail.StateActive:
		return r.hca.State
	}
	return ""
}

// devices is the node's device list for a rail state: one relay device
// that any number of claims may be allocated at once (KEP-5075's
// allowMultipleAllocations, on by default since Kubernetes 1.36), then one
// rail device per railed HCA of the latest successful discovery. A rail
// device whose port is not ACTIVE carries a NoSchedule taint, so no new
// claim gets it; with taints false (the API server drops them) it is left
// out instead.
func (d *Driver) devices(st nodestate.NodeState, taints bool) []resourceapi.Device {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrRails:        {IntValue: ptr.To(int64(st.Summary.Rails))},
		AttrRailsReady:   {BoolValue: ptr.To(ready(d.cfg.NodeName, st) == nil)},
		AttrGPUs:         {IntValue: ptr.To(int64(st.Summary.GPUs))},
		AttrHCAs:         {IntValue: ptr.To(int64(st.Summary.HCAs))},
		AttrRailStrategy: {StringValue: ptr.To(st.Summary.Strategy)},
	}
	if v := strings.TrimPrefix(d.cfg.Version, "v"); v != "" {
		if _, err := version.ParseSemantic(v); err == nil {
			attrs[AttrVersion] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
		}
	}
	devs := []resourceapi.Device{{
		Name:                     DeviceName,
		Attributes:               attrs,
		AllowMultipleAllocations: ptr.To(true),
	}}
	for _, r := range railDevices(st.Layout) {
		why := r.unhealthy(st)
		if why != "" && !taints {
			continue
		}
		dev := resourceapi.Device{
			Name:       r.name,
			Attributes: railAttributes(r.hca, why == ""),
			// An HCA serves every GPU near it: which GPU a rank holds is
			// its GPU driver's to allocate exclusively, not the NIC.
			AllowMultipleAllocations: ptr.To(true),
		}
		if why != "" {
			dev.Taints = []resourceapi.DeviceTaint{{Key: TaintUnhealthy, Value: why, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}
		devs = append(devs, dev)
	}
	return devs
}

func railAttributes(h rail.HCA, healthy bool) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrRail:      {StringValue: ptr.To(h.Rail)},
		AttrHCA:       {StringValue: ptr.To(h.Name)},
		AttrLinkLayer: {StringValue: ptr.To(h.LinkLayer)},
		AttrPortState: {StringValue: ptr.To(h.State)},
		AttrHealthy:   {BoolValue: ptr.To(healthy)},
		AttrPCIBusID:  {StringValue: ptr.To(h.PCIBusID)},
	}
	if h.PCIeRoot != "" {
		attrs[AttrPCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(h.PCIeRoot)}
	}
	// A device without NUMA affinity publishes no numaNode (the standard
	// attribute's rule).
	if h.NUMANode >= 0 {
		attrs[AttrNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(h.NUMANode))}
	}
	if gbps, ok := linkRateGbps(h.Rate); ok {
		attrs[AttrLinkRateGbps] = resourceapi.DeviceAttribute{IntValue: ptr.To(gbps)}
	}
	return attrs
}

// linkRateGbps reads sysfs's rate, "400 Gb/sec (4X NDR)", as 400; a rate
// that is not a whole number of Gb/s (2.5 Gb/sec) has none.
func linkRateGbps(rate string) (int64, bool) {
	num, rest, ok := strings.Cut(strings.TrimSpace(rate), " ")
	if !ok || !strings.HasPrefix(rest, "Gb/sec") {
		return 0, false
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}
