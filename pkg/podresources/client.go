// SPDX-License-Identifier: Apache-2.0

// Package podresources is a client of the kubelet's PodResources v1 API:
// which pods run on the node and the devices each container holds. The
// device plugin finds the pod behind a device with it; the agent, which
// pods still run.
package podresources

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Lister lists the node's pods with the devices the kubelet assigned them.
type Lister interface {
	List(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error)
}

// Client is a Lister over the kubelet's PodResources v1 unix socket.
type Client struct {
	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient
}

var _ Lister = (*Client)(nil)

// maxMsg bounds a List answer; a node with hundreds of pods fits.
const maxMsg = 16 << 20

// New returns a client of the socket at path. It connects lazily, so the
// kubelet need not be up yet.
func New(path string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg)))
	if err != nil {
		return nil, fmt.Errorf("pod resources client for %s: %w", path, err)
	}
	return &Client{conn: conn, client: podresourcesv1.NewPodResourcesListerClient(conn)}, nil
}

// List returns every pod's assigned resources.
func (c *Client) List(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	return c.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
}

// Close releases the connection.
func (c *Client) Close() error { return c.conn.Close() }
