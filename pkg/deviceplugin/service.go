// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Resource is what the device plugin service serves.
type Resource interface {
	// Devices returns the full device list, whether it may be advertised
	// yet, and a channel closed when it changes.
	Devices() (devices []*pluginapi.Device, ready bool, changed <-chan struct{})
	Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error)
}

// ContainerPreStarter is implemented by a Resource that must prepare the host
// before each container starts; the plugin then registers with
// PreStartRequired.
type ContainerPreStarter interface {
	PreStartContainer(ctx context.Context, deviceIDs []string) error
}

// KubeletWatcher is implemented by a Resource that wants to know when a
// kubelet starts watching it: after a kubelet restart the kubelet's view of
// running pods (the PodResources API) is incomplete for a while.
type KubeletWatcher interface {
	KubeletWatching(at time.Time)
}

// service adapts a Resource to the kubelet's DevicePlugin gRPC service.
type service struct {
	pluginapi.UnimplementedDevicePluginServer
	resource Resource
	metrics  *Metrics
	// stop ends ListAndWatch streams when the server is torn down.
	stop <-chan struct{}
	log  klog.Logger
}

func pluginOptions(r Resource) *pluginapi.DevicePluginOptions {
	_, preStart := r.(ContainerPreStarter)
	return &pluginapi.DevicePluginOptions{PreStartRequired: preStart, GetPreferredAllocationAvailable: false}
}

func (s *service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return pluginOptions(s.resource), nil
}

func (s *service) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if w, ok := s.resource.(KubeletWatcher); ok {
		w.KubeletWatching(time.Now())
	}
	var last []*pluginapi.Device
	sent := false
	for {
		devs, ready, changed := s.resource.Devices()
		if ready && (!sent || !sameDevices(last, devs)) {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
			s.log.V(2).Info("Sent device list", "devices", len(devs), "health", devs[0].GetHealth())
			last, sent = devs, true
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		case <-s.stop:
			return nil
		}
	}
}

func sameDevices(a, b []*pluginapi.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].GetID() != b[i].GetID() || a[i].GetHealth() != b[i].GetHealth() {
			return false
		}
	}
	return true
}

func (s *service) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return nil, status.Error(codes.Unimplemented, "preferred allocation is not offered: devices are interchangeable")
}

func (s *service) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp, err := s.resource.Allocate(ctx, req)
	s.metrics.allocated(err)
	if err != nil {
		s.log.Error(err, "Allocate failed", "containers", len(req.GetContainerRequests()))
		return nil, err
	}
	return resp, nil
}

func (s *service) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	p, ok := s.resource.(ContainerPreStarter)
	if !ok {
		return &pluginapi.PreStartContainerResponse{}, nil
	}
	start := time.Now()
	err := p.PreStartContainer(ctx, req.GetDevicesIds())
	s.metrics.preStarted(err, time.Since(start).Seconds())
	if err != nil {
		s.log.Error(err, "PreStartContainer failed", "devices", req.GetDevicesIds())
		return nil, err
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}
