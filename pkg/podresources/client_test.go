// SPDX-License-Identifier: Apache-2.0

package podresources_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/pxn-project/pxn/pkg/podresources"
)

type kubelet struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
}

func (kubelet) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{{
		Namespace: "team-a", Name: "a-0",
		Containers: []*podresourcesv1.ContainerResources{{Name: "main", Devices: []*podresourcesv1.ContainerDevices{
			{ResourceName: "pxn.io/relay", DeviceIds: []string{"pxn-relay-03"}},
		}}},
	}}}, nil
}

// TestClientLists asks a PodResources server on a real unix socket, as the
// kubelet serves it, made after the client: the client connects lazily.
func TestClientLists(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	c, err := podresources.New(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, kubelet{})
	go srv.Serve(l)
	defer srv.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pods := resp.GetPodResources()
	if len(pods) != 1 || pods[0].GetName() != "a-0" || pods[0].GetContainers()[0].GetDevices()[0].GetDeviceIds()[0] != "pxn-relay-03" {
		t.Errorf("List = %v, want pod team-a/a-0 holding pxn-relay-03", resp)
	}
}

// TestClientReportsNoKubelet: with nothing on the socket, List fails
// rather than answer an empty node.
func TestClientReportsNoKubelet(t *testing.T) {
	c, err := podresources.New(filepath.Join(t.TempDir(), "absent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if resp, err := c.List(ctx); err == nil {
		t.Errorf("List without a kubelet = %v, want an error", resp)
	}
}
