// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubelet is the kubelet as a device plugin sees it: a Registration server on
// kubelet.sock in the device-plugin folder and a PodResources v1 server.
type kubelet struct {
	t       testing.TB
	dir     string // device-plugin folder
	podSock string
	regs    chan *pluginapi.RegisterRequest

	mu     sync.Mutex
	regSrv *grpc.Server
	pods   []*podresourcesv1.PodResources
}

type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	regs chan<- *pluginapi.RegisterRequest
	dir  string
}

func (r registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	select {
	case r.regs <- req:
	default:
		return nil, errors.New("stub kubelet: too many unread registrations")
	}
	go r.watch(req.Endpoint)
	return &pluginapi.Empty{}, nil
}

// watch does what a kubelet does after a registration: it watches the
// plugin's devices until the plugin goes away.
func (r registrar) watch(endpoint string) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(r.dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	defer conn.Close()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		return
	}
	for {
		if _, err := stream.Recv(); err != nil {
			return
		}
	}
}

type podLister struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	k *kubelet
}

func (p podLister) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	return &podresourcesv1.ListPodResourcesResponse{PodResources: p.k.pods}, nil
}

// startKubelet serves both sockets under a short temporary folder (unix
// socket paths must stay under 108 bytes).
func startKubelet(t testing.TB) *kubelet {
	t.Helper()
	base, err := os.MkdirTemp("", "pxn")
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{t: t, dir: filepath.Join(base, "dp"), podSock: filepath.Join(base, "pr.sock"), regs: make(chan *pluginapi.RegisterRequest, 64)}
	if err := os.Mkdir(k.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	prSrv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(prSrv, podLister{k: k})
	l, err := net.Listen("unix", k.podSock)
	if err != nil {
		t.Fatal(err)
	}
	go prSrv.Serve(l)
	k.serveRegistration()
	t.Cleanup(func() {
		k.mu.Lock()
		k.regSrv.Stop()
		k.mu.Unlock()
		prSrv.Stop()
		os.RemoveAll(base)
	})
	return k
}

func (k *kubelet) serveRegistration() {
	k.t.Helper()
	l, err := net.Listen("unix", filepath.Join(k.dir, "kubelet.sock"))
	if err != nil {
		k.t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, registrar{regs: k.regs, dir: k.dir})
	go srv.Serve(l)
	k.mu.Lock()
	k.regSrv = srv
	k.mu.Unlock()
}

// restart stops and re-creates kubelet.sock, as a restarted kubelet does.
// wipe also removes every other socket in the folder.
func (k *kubelet) restart(wipe bool) {
	k.t.Helper()
	k.mu.Lock()
	k.regSrv.Stop()
	k.mu.Unlock()
	if wipe {
		entries, _ := os.ReadDir(k.dir)
		for _, e := range entries {
			os.Remove(filepath.Join(k.dir, e.Name()))
		}
	}
	k.serveRegistration()
}

func (k *kubelet) setPods(pods ...*podresourcesv1.PodResources) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods = pods
}

func (k *kubelet) waitRegistration(within time.Duration) *pluginapi.RegisterRequest {
	k.t.Helper()
	select {
	case r := <-k.regs:
		return r
	case <-time.After(within):
		k.t.Fatalf("no registration within %v", within)
		return nil
	}
}

// dial connects to the plugin endpoint named in a registration.
func (k *kubelet) dial(endpoint string) pluginapi.DevicePluginClient {
	k.t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func podRes(ns, name, resource string, containers map[string][]string) *podresourcesv1.PodResources {
	p := &podresourcesv1.PodResources{Namespace: ns, Name: name}
	for c, ids := range containers {
		p.Containers = append(p.Containers, &podresourcesv1.ContainerResources{
			Name:    c,
			Devices: []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: ids}},
		})
	}
	return p
}
