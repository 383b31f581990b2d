// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/nodestate"
	"github.com/pxn-project/pxn/pkg/podresources"
)

type fixedState struct{ st nodestate.NodeState }

func (f fixedState) State() (nodestate.NodeState, <-chan struct{}) { return f.st, nil }

// fakePods answers List from a table of pod → container → devices; the first
// lag calls answer an empty list.
type fakePods struct {
	mu    sync.Mutex
	lag   int
	calls int
	pods  []*podresourcesv1.PodResources
}

func (f *fakePods) List(context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.calls <= f.lag {
		return &podresourcesv1.ListPodResourcesResponse{}, nil
	}
	return &podresourcesv1.ListPodResourcesResponse{PodResources: f.pods}, nil
}

func (f *fakePods) set(pods ...*podresourcesv1.PodResources) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods = pods
}

func podRes(ns, name, resource string, ids ...string) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesv1.ContainerResources{{
		Name:    "main",
		Devices: []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: ids}},
	}}}
}

type fakeAPI map[string]*corev1.Pod // "ns/name" → pod

func (f fakeAPI) Pod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	if p, ok := f[ns+"/"+name]; ok {
		return p, nil
	}
	return nil, errors.New("not found")
}

func testConfig() Config {
	return Config{ResourceName: "pxn.io/relay", DeviceCount: 16, GroupID: "k8s", RegistryRoot: "/run/pxn",
		PodLookupTimeout: 2 * time.Second, APITimeout: time.Second}
}

func newTestResource(t testing.TB, pods podresources.Lister, api PodGetter) (*GroupResource, *Store) {
	t.Helper()
	base := t.TempDir()
	store := NewStore(filepath.Join(base, "state"), filepath.Join(base, "shm"), klog.Background())
	if err := store.Prepare(); err != nil {
		t.Fatal(err)
	}
	st := fixedState{nodestate.NodeState{Discovered: true, Healthy: true, RailMap: `{"mlx5_0":"rail0","mlx5_1":"rail1"}`}}
	r, err := NewGroupResource(testConfig(), st, store, pods, api, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r, store
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*Config)
	}{
		{"resource without domain", func(c *Config) { c.ResourceName = "relay" }},
		{"zero devices", func(c *Config) { c.DeviceCount = 0 }},
		{"group id with slash", func(c *Config) { c.GroupID = "a/b" }},
		{"group id dot-dot", func(c *Config) { c.GroupID = ".." }},
		{"relative registry root", func(c *Config) { c.RegistryRoot = "run/pxn" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig()
			tc.mut(&c)
			if err := c.Validate(); err == nil {
				t.Fatalf("accepted %+v", c)
			}
		})
	}
	if err := testConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestDeviceIDs(t *testing.T) {
	r, _ := newTestResource(t, &fakePods{}, nil)
	ids := r.DeviceIDs()
	if len(ids) != 16 || ids[0] != "pxn-relay-00" || ids[15] != "pxn-relay-15" {
		t.Fatalf("ids = %v", ids)
	}
}

func TestDevicesNotAdvertisedBeforeDiscovery(t *testing.T) {
	r, _ := newTestResource(t, &fakePods{}, nil)
	r.state = fixedState{}
	if devs, ready, _ := r.Devices(); ready || devs != nil {
		t.Fatalf("advertised %d devices before discovery", len(devs))
	}
	if _, err := r.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"pxn-relay-00"}}}}); err == nil {
		t.Fatal("Allocate answered before any rail map was discovered")
	}
}

func TestAllocate(t *testing.T) {
	r, store := newTestResource(t, &fakePods{}, nil)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"pxn-relay-07", "pxn-relay-03"}},
		{DevicesIds: []string{"pxn-relay-09"}},
	}}
	resp, err := r.Allocate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ContainerResponses) != 2 {
		t.Fatalf("%d container responses", len(resp.ContainerResponses))
	}
	wantEnv := map[string]string{
		contract.EnvEnable: "1", contract.EnvRailMap: `{"mlx5_0":"rail0","mlx5_1":"rail1"}`, contract.EnvGroupID: "k8s", contract.EnvRegistryRoot: "/run/pxn",
	}
	for i, first := range []string{"pxn-relay-03", "pxn-relay-09"} {
		c := resp.ContainerResponses[i]
		if !reflect.DeepEqual(c.Envs, wantEnv) {
			t.Errorf("container %d envs = %v", i, c.Envs)
		}
		if len(c.Mounts) != 1 || c.Mounts[0].HostPath != store.SlotPath(first) || c.Mounts[0].ContainerPath != "/run/pxn" || c.Mounts[0].ReadOnly {
			t.Errorf("container %d mounts = %v, want %s → /run/pxn rw", i, c.Mounts, store.SlotPath(first))
		}
		if len(c.Devices) != 0 || len(c.CdiDevices) != 0 {
			t.Errorf("container %d gets device nodes: %v %v", i, c.Devices, c.CdiDevices)
		}
	}

	again, err := r.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"pxn-relay-03", "pxn-relay-07"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again.ContainerResponses[0].Envs, resp.ContainerResponses[0].Envs) ||
		again.ContainerResponses[0].Mounts[0].HostPath != resp.ContainerResponses[0].Mounts[0].HostPath {
		t.Fatal("the same devices in another order got another answer")
	}

	for _, ids := range [][]string{nil, {"pxn-relay-16"}, {"gpu-0"}} {
		if _, err := r.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}); err == nil {
			t.Errorf("Allocate(%v) succeeded", ids)
		}
	}
}

func TestPreStartContainer(t *testing.T) {
	labeled := func(ns, name, uid, group string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
		if group != "" {
			p.Labels = map[string]string{GroupLabel: group}
		}
		return p
	}
	api := fakeAPI{
		"a/p0": labeled("a", "p0", "uid-0", "job"),
		"a/p1": labeled("a", "p1", "uid-1", "job"),
		"b/p0": labeled("b", "p0", "uid-2", "job"),
		"a/p2": labeled("a", "p2", "uid-3", ""),
	}
	pods := &fakePods{lag: 2}
	pods.set(
		podRes("a", "p0", "pxn.io/relay", "pxn-relay-00"),
		podRes("a", "p1", "pxn.io/relay", "pxn-relay-01"),
		podRes("b", "p0", "pxn.io/relay", "pxn-relay-02"),
		podRes("a", "p2", "pxn.io/relay", "pxn-relay-03", "pxn-relay-04"),
		podRes("c", "other", "example.com/gpu", "pxn-relay-05"),
	)

	t.Run("with API", func(t *testing.T) {
		r, store := newTestResource(t, pods, api)
		for _, ids := range [][]string{{"pxn-relay-00"}, {"pxn-relay-01"}, {"pxn-relay-02"}, {"pxn-relay-03", "pxn-relay-04"}} {
			if err := r.PreStartContainer(context.Background(), ids); err != nil {
				t.Fatalf("PreStartContainer(%v): %v", ids, err)
			}
		}
		if pods.calls <= pods.lag {
			t.Fatal("the lagging PodResources view was not retried")
		}
		assertLink(t, store, "pxn-relay-00", store.keys.Key("a", group.SourceLabel, "job"))
		assertLink(t, store, "pxn-relay-01", store.keys.Key("a", group.SourceLabel, "job"))
		assertLink(t, store, "pxn-relay-02", store.keys.Key("b", group.SourceLabel, "job"))
		assertLink(t, store, "pxn-relay-03", store.keys.Key("a", group.SourceUID, "uid-3"))
		assertLink(t, store, "pxn-relay-04", store.keys.Key("a", group.SourceUID, "uid-3"))
		key := store.keys.Key("a", group.SourceLabel, "job")
		for dev, pod := range map[string]string{"pxn-relay-00": "p0", "pxn-relay-01": "p1"} {
			o, err := group.ReadOwner(filepath.Join(store.ownersDir, group.OwnerRecordName(key, group.OwnerSlotPrefix+dev)))
			if err != nil || o.Namespace != "a" || !reflect.DeepEqual(o.Pods, []string{pod}) {
				t.Errorf("owner record of %s: %+v, %v; want pod a/%s", dev, o, err, pod)
			}
		}
	})

	t.Run("without API", func(t *testing.T) {
		r, store := newTestResource(t, pods, nil)
		for _, ids := range [][]string{{"pxn-relay-00"}, {"pxn-relay-02"}} {
			if err := r.PreStartContainer(context.Background(), ids); err != nil {
				t.Fatal(err)
			}
		}
		assertLink(t, store, "pxn-relay-00", store.keys.Key("a", group.SourcePodName, "p0"))
		assertLink(t, store, "pxn-relay-02", store.keys.Key("b", group.SourcePodName, "p0"))
	})

	t.Run("unknown pod", func(t *testing.T) {
		r, store := newTestResource(t, pods, api)
		r.cfg.PodLookupTimeout = 50 * time.Millisecond
		if err := r.PreStartContainer(context.Background(), []string{"pxn-relay-05"}); err == nil {
			t.Fatal("linked a device that PodResources holds under another resource")
		}
		if _, err := os.Lstat(store.SlotPath("pxn-relay-05")); err == nil {
			t.Fatal("slot link created on failure")
		}
	})

	t.Run("API error", func(t *testing.T) {
		r, _ := newTestResource(t, pods, fakeAPI{})
		if err := r.PreStartContainer(context.Background(), []string{"pxn-relay-00"}); err == nil {
			t.Fatal("a failing API server was silently replaced by pod-name grouping")
		}
	})
}

func TestCollectGarbageKeepsEverythingWhenKubeletIsDown(t *testing.T) {
	pods := &fakePods{}
	pods.set(podRes("a", "p0", "pxn.io/relay", "pxn-relay-00"))
	r, store := newTestResource(t, pods, nil)
	if err := r.PreStartContainer(context.Background(), []string{"pxn-relay-00"}); err != nil {
		t.Fatal(err)
	}
	r.pods = failingPods{}
	r.KubeletWatching(time.Now().Add(-time.Hour))
	if err := r.CollectGarbage(context.Background(), 0, time.Minute); err == nil {
		t.Fatal("collection succeeded without PodResources")
	}
	assertLink(t, store, "pxn-relay-00", store.keys.Key("a", group.SourcePodName, "p0"))
}

// TestCollectGarbageWaitsForARestartedKubelet: a kubelet that has just
// started watching the plugin lists no running pod yet; collection leaves
// their slot links and group folders alone until the settle time has passed.
func TestCollectGarbageWaitsForARestartedKubelet(t *testing.T) {
	pods := &fakePods{}
	pods.set(podRes("a", "p0", "pxn.io/relay", "pxn-relay-00"))
	r, store := newTestResource(t, pods, nil)
	if err := r.PreStartContainer(context.Background(), []string{"pxn-relay-00"}); err != nil {
		t.Fatal(err)
	}
	key := store.keys.Key("a", group.SourcePodName, "p0")
	pods.set() // the restarted kubelet has not admitted p0 again
	for _, tc := range []struct {
		name    string
		watched time.Time
	}{
		{"no kubelet watching yet", time.Time{}},
		{"kubelet watching for a second", time.Now().Add(-time.Second)},
	} {
		if !tc.watched.IsZero() {
			r.KubeletWatching(tc.watched)
		}
		for range 3 {
			if err := r.CollectGarbage(context.Background(), 0, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		assertLink(t, store, "pxn-relay-00", key)
		if _, err := os.Stat(store.GroupPath(key)); err != nil {
			t.Fatalf("%s: group folder of a running pod: %v", tc.name, err)
		}
	}
	r.KubeletWatching(time.Now().Add(-2 * time.Minute))
	for range 3 {
		if err := r.CollectGarbage(context.Background(), 0, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Lstat(store.SlotPath("pxn-relay-00")); err == nil {
		t.Error("slot link of an unassigned device kept after the kubelet settled")
	}
	if _, err := os.Stat(store.GroupPath(key)); err == nil {
		t.Error("unreferenced group folder kept after the kubelet settled")
	}
}

type failingPods struct{}

func (failingPods) List(context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	return nil, errors.New("connection refused")
}

func BenchmarkAllocate(b *testing.B) {
	r, _ := newTestResource(b, &fakePods{}, nil)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"pxn-relay-05"}}}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Allocate(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
