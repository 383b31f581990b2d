// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/pxn-project/pxn/pkg/group"
)

// containerRef names the container that holds a set of devices.
type containerRef struct {
	Namespace, Pod, Container string
}

// findContainer returns the container that holds deviceIDs[0] of resource.
func findContainer(resp *podresourcesv1.ListPodResourcesResponse, resource string, deviceIDs []string) (containerRef, bool) {
	want := deviceIDs[0]
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() != resource {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					if id == want {
						return containerRef{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: c.GetName()}, true
					}
				}
			}
		}
	}
	return containerRef{}, false
}

// assignedDevices returns the IDs of resource that the kubelet has
// assigned, each with the pod holding it.
func assignedDevices(resp *podresourcesv1.ListPodResourcesResponse, resource string) map[string]group.Owner {
	ids := make(map[string]group.Owner)
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resource {
					for _, id := range d.GetDeviceIds() {
						ids[id] = group.Owner{Namespace: p.GetNamespace(), Pods: []string{p.GetName()}}
					}
				}
			}
		}
	}
	return ids
}
