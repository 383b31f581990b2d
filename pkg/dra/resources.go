// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"

	"github.com/pxn-project/pxn/pkg/nodestate"
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

// devices is the node's device list for a rail state: one relay device
// that any number of claims may be allocated at once (KEP-5075's
// allowMultipleAllocations, on by default since Kubernetes 1.36).
func (d *Driver) devices(st nodestate.NodeState) []resourceapi.Device {
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
	return []resourceapi.Device{{
		Name:                     DeviceName,
		Attributes:               attrs,
		AllowMultipleAllocations: ptr.To(true),
	}}
}
