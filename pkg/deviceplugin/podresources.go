// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResourcesLister lists the devices the kubelet has assigned to pods.
type PodResourcesLister interface {
	List(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error)
}

// PodResourcesClient is a PodResourcesLister over the kubelet's PodResources
// v1 unix socket.
type PodResourcesClient struct {
	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient
}

// maxPodResourcesMsg bounds a List answer; a node with hundreds of pods fits.
const maxPodResourcesMsg = 16 << 20

// NewPodResourcesClient returns a client of the socket at path. It connects
// lazily, so the kubelet need not be up yet.
func NewPodResourcesClient(path string) (*PodResourcesClient, error) {
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxPodResourcesMsg)))
	if err != nil {
		return nil, fmt.Errorf("pod resources client for %s: %w", path, err)
	}
	return &PodResourcesClient{conn: conn, client: podresourcesv1.NewPodResourcesListerClient(conn)}, nil
}

// List returns every pod's assigned resources.
func (c *PodResourcesClient) List(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	return c.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
}

// Close releases the connection.
func (c *PodResourcesClient) Close() error { return c.conn.Close() }

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

// assignedDevices returns the IDs of resource that the kubelet has assigned.
func assignedDevices(resp *podresourcesv1.ListPodResourcesResponse, resource string) map[string]bool {
	ids := make(map[string]bool)
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resource {
					for _, id := range d.GetDeviceIds() {
						ids[id] = true
					}
				}
			}
		}
	}
	return ids
}
