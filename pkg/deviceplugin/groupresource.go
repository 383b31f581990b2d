// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/nodestate"
	"github.com/pxn-project/pxn/pkg/podresources"
)

// GroupLabel is the pod label that puts pods of one job into one group.
const GroupLabel = group.Label

// errNotDiscovered is returned by Allocate before any discovery succeeded.
var errNotDiscovered = errors.New("no successful rail discovery yet")

// StateSource reports the node's discovered state; nodestate.Monitor is one.
type StateSource interface {
	State() (nodestate.NodeState, <-chan struct{})
}

// PodGetter reads a pod from the API server.
type PodGetter interface {
	Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
}

// Config describes the relay resource.
type Config struct {
	// ResourceName is the extended resource, e.g. pxn.io/relay.
	ResourceName string
	// DeviceCount is the number of virtual devices advertised.
	DeviceCount int
	// GroupID is contract.EnvGroupID for every container.
	GroupID string
	// RegistryRoot is the container path of the group directory mount and
	// contract.EnvRegistryRoot.
	RegistryRoot string
	// PodLookupTimeout bounds how long PreStartContainer waits for the
	// kubelet's PodResources to show the devices.
	PodLookupTimeout time.Duration
	// APITimeout bounds one pod read from the API server.
	APITimeout time.Duration
	// Logger receives one line per linked container and per garbage
	// collection problem; the zero Logger discards them.
	Logger klog.Logger
}

// MaxDevices is the most virtual devices a resource advertises.
const MaxDevices = 1000

// ValidateResourceName checks that name is an extended resource name,
// <domain>/<name>.
func ValidateResourceName(name string) error {
	if i := strings.IndexByte(name, '/'); i <= 0 || i == len(name)-1 {
		return fmt.Errorf("resource name %q is not <domain>/<name>", name)
	}
	return nil
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if err := ValidateResourceName(c.ResourceName); err != nil {
		return err
	}
	if c.DeviceCount < 1 || c.DeviceCount > MaxDevices {
		return fmt.Errorf("device count %d is outside 1..%d", c.DeviceCount, MaxDevices)
	}
	if err := c.member().Validate(); err != nil {
		return err
	}
	if c.PodLookupTimeout <= 0 || c.APITimeout <= 0 {
		return fmt.Errorf("timeouts must be positive (pod lookup %v, API %v)", c.PodLookupTimeout, c.APITimeout)
	}
	return nil
}

func (c Config) member() group.Member {
	return group.Member{GroupID: c.GroupID, RegistryRoot: c.RegistryRoot}
}

// GroupResource is the pxn.io/relay resource: shared, counted virtual
// devices whose containers get the PXN environment and their group's
// registry directory.
type GroupResource struct {
	cfg     Config
	ids     []string
	known   map[string]bool
	state   StateSource
	store   *Store
	pods    podresources.Lister
	api     PodGetter
	metrics *Metrics

	// watched is when a kubelet last started ListAndWatch (UnixNano; 0:
	// never). Garbage collection waits the settle time after it.
	watched atomic.Int64
}

// DefaultKubeletSettle is how long garbage collection waits, by default,
// after a kubelet starts watching the plugin (at start and after every
// kubelet restart) before it trusts the kubelet's list of running pods: a
// restarted kubelet lists pods, with their devices, only once it has
// admitted them again, and a slot link or group directory removed in that
// window would be pulled from under a running job.
const DefaultKubeletSettle = 30 * time.Second

// KubeletWatching records that a kubelet started watching the devices.
func (r *GroupResource) KubeletWatching(at time.Time) { r.watched.Store(at.UnixNano()) }

// NewGroupResource returns the resource. api may be nil when the API
// server is not reachable; groups are then keyed by pod name.
func NewGroupResource(cfg Config, state StateSource, store *Store, pods podresources.Lister, api PodGetter, m *Metrics) (*GroupResource, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &GroupResource{cfg: cfg, state: state, store: store, pods: pods, api: api, metrics: m, known: make(map[string]bool, cfg.DeviceCount)}
	width := len(fmt.Sprint(cfg.DeviceCount - 1))
	if width < 2 {
		width = 2
	}
	name := cfg.ResourceName[strings.IndexByte(cfg.ResourceName, '/')+1:]
	for i := range cfg.DeviceCount {
		id := fmt.Sprintf("pxn-%s-%0*d", name, width, i)
		r.ids = append(r.ids, id)
		r.known[id] = true
	}
	return r, nil
}

// DeviceIDs returns the advertised device IDs in order.
func (r *GroupResource) DeviceIDs() []string { return append([]string(nil), r.ids...) }

// Devices returns the full device list, whether discovery has finished (until
// then nothing may be advertised), and a channel closed when it changes.
func (r *GroupResource) Devices() ([]*pluginapi.Device, bool, <-chan struct{}) {
	st, changed := r.state.State()
	if !st.Discovered {
		return nil, false, changed
	}
	health := pluginapi.Unhealthy
	if st.Healthy {
		health = pluginapi.Healthy
	}
	devs := make([]*pluginapi.Device, len(r.ids))
	for i, id := range r.ids {
		devs[i] = &pluginapi.Device{ID: id, Health: health}
	}
	return devs, true, changed
}

func (r *GroupResource) checkIDs(ids []string) (first string, err error) {
	if len(ids) == 0 {
		return "", status.Error(codes.InvalidArgument, "no device IDs in request")
	}
	first = ids[0]
	for _, id := range ids {
		if !r.known[id] {
			return "", status.Errorf(codes.InvalidArgument, "unknown device ID %q for %s", id, r.cfg.ResourceName)
		}
		if id < first {
			first = id
		}
	}
	return first, nil
}

// Allocate answers from configuration and the last discovered rail map only:
// the same devices always get the same answer. The mount source is the slot
// link of the container's lowest device ID; PreStartContainer creates it.
func (r *GroupResource) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	st, _ := r.state.State()
	if st.RailMap == "" {
		return nil, status.Error(codes.Unavailable, errNotDiscovered.Error())
	}
	member := r.cfg.member()
	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, 0, len(req.GetContainerRequests()))}
	for _, creq := range req.GetContainerRequests() {
		first, err := r.checkIDs(creq.GetDevicesIds())
		if err != nil {
			return nil, err
		}
		m := member.Mount(r.store.SlotPath(first))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs:   member.Env(st.RailMap),
			Mounts: []*pluginapi.Mount{{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly}},
		})
	}
	return resp, nil
}

// PreStartContainer finds the pod holding deviceIDs, computes its group key,
// points the devices' slot links at the group directory and records the pod
// as an owner of it.
func (r *GroupResource) PreStartContainer(ctx context.Context, deviceIDs []string) error {
	if _, err := r.checkIDs(deviceIDs); err != nil {
		return err
	}
	ref, err := r.locate(ctx, deviceIDs)
	if err != nil {
		return err
	}
	key, source, err := r.groupKey(ctx, ref)
	if err != nil {
		return err
	}
	dir, err := r.store.Link(deviceIDs, key, group.Owner{Namespace: ref.Namespace, Pods: []string{ref.Pod}}, time.Now())
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	r.cfg.Logger.Info("Linked container to group", "pod", klog.KRef(ref.Namespace, ref.Pod), "container", ref.Container,
		"devices", deviceIDs, "group", key, "groupSource", source, "dir", dir)
	return nil
}

// locate polls PodResources until it shows deviceIDs: the kubelet may call
// PreStartContainer before its own view is updated.
func (r *GroupResource) locate(ctx context.Context, deviceIDs []string) (containerRef, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PodLookupTimeout)
	defer cancel()
	wait := 5 * time.Millisecond
	var lastErr error
	for {
		resp, err := r.pods.List(ctx)
		if err == nil {
			if ref, ok := findContainer(resp, r.cfg.ResourceName, deviceIDs); ok {
				return ref, nil
			}
			lastErr = fmt.Errorf("no pod holds %s device %s", r.cfg.ResourceName, deviceIDs[0])
		} else {
			lastErr = fmt.Errorf("list pod resources: %w", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return containerRef{}, status.Errorf(codes.Unavailable, "find pod of devices %v within %v: %v", deviceIDs, r.cfg.PodLookupTimeout, lastErr)
		case <-t.C:
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// groupKey keys the group by the pod's GroupLabel, else its UID, both read
// from the API server; without API access, by the pod's name. A configured but
// failing API server fails the call rather than splitting a job.
func (r *GroupResource) groupKey(ctx context.Context, ref containerRef) (key, source string, err error) {
	source, identity, err := r.groupIdentity(ctx, ref)
	if err != nil {
		return "", "", err
	}
	key, err = r.store.GroupKey(ref.Namespace, source, identity, time.Now())
	if err != nil {
		return "", "", status.Errorf(codes.Internal, "group of pod %s/%s: %v", ref.Namespace, ref.Pod, err)
	}
	return key, source, nil
}

func (r *GroupResource) groupIdentity(ctx context.Context, ref containerRef) (source, identity string, err error) {
	if r.api == nil {
		return group.SourcePodName, ref.Pod, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.APITimeout)
	defer cancel()
	pod, err := r.api.Pod(ctx, ref.Namespace, ref.Pod)
	if err != nil {
		return "", "", status.Errorf(codes.Unavailable, "read pod %s/%s: %v", ref.Namespace, ref.Pod, err)
	}
	if g := pod.Labels[GroupLabel]; g != "" {
		return group.SourceLabel, g, nil
	}
	if pod.UID == "" {
		return "", "", status.Errorf(codes.Internal, "pod %s/%s has no UID", ref.Namespace, ref.Pod)
	}
	return group.SourceUID, string(pod.UID), nil
}

// CollectGarbage removes slot links of unassigned devices and group
// directories unused for longer than grace. Nothing is removed when the
// kubelet cannot be asked, before any kubelet watches the plugin, or within
// settle of a kubelet starting to watch it.
func (r *GroupResource) CollectGarbage(ctx context.Context, grace, settle time.Duration) error {
	if w := r.watched.Load(); w == 0 || time.Since(time.Unix(0, w)) < settle {
		r.cfg.Logger.V(2).Info("Garbage collection waits for the kubelet's view of running pods to settle", "kubeletWatchingSince", time.Unix(0, w))
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := r.pods.List(ctx)
	if err != nil {
		return fmt.Errorf("list pod resources: %w", err)
	}
	slots, groups, err := r.store.Collect(assignedDevices(resp, r.cfg.ResourceName), time.Now(), grace)
	r.metrics.collected(slots, groups)
	return err
}

// RunGarbageCollector calls CollectGarbage every interval until ctx ends.
func (r *GroupResource) RunGarbageCollector(ctx context.Context, interval, grace, settle time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.CollectGarbage(ctx, grace, settle); err != nil && !errors.Is(ctx.Err(), context.Canceled) {
			r.cfg.Logger.Error(err, "Garbage collection incomplete")
		}
	}
}
