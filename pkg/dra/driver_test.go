// SPDX-License-Identifier: Apache-2.0

package dra_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/dra"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/nodestate"
)

const (
	node         = "gpu-node-1"
	railMap      = `{"mlx5_0":"rail0","mlx5_1":"rail1"}`
	registryRoot = "/run/pxn"
)

// railState is a node state a test sets.
type railState struct {
	mu      sync.Mutex
	st      nodestate.NodeState
	changed chan struct{}
}

func newRailState(st nodestate.NodeState) *railState {
	return &railState{st: st, changed: make(chan struct{})}
}

func readyState() nodestate.NodeState {
	return nodestate.NodeState{Discovered: true, Healthy: true, RailMap: railMap,
		Summary: nodestate.Summary{Rails: 2, HCAs: 2, GPUs: 8, Strategy: "pci-order", Detail: "2 railed HCAs active on 2 rails"}}
}

func (s *railState) State() (nodestate.NodeState, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st, s.changed
}

func (s *railState) set(st nodestate.NodeState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = st
	close(s.changed)
	s.changed = make(chan struct{})
}

// node is one node's folders: the kubelet's, the runtime's CDI folder, the
// plugin's state and the shm folder.
type nodeDirs struct {
	base, plugins, registry, cdi, state, shm string
}

func newNodeDirs(t *testing.T) nodeDirs {
	// A short base keeps the unix socket paths within their limit.
	base, err := os.MkdirTemp("", "pxn-dra-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	return nodeDirs{base: base, plugins: filepath.Join(base, "plugins"), registry: filepath.Join(base, "registry"),
		cdi: filepath.Join(base, "cdi"), state: filepath.Join(base, "state"), shm: filepath.Join(base, "shm")}
}

func (n nodeDirs) groupDir(t *testing.T, ns string, uid types.UID) string {
	return filepath.Join(contract.GroupsDir(n.shm), n.key(t, ns, group.SourceClaim, string(uid)))
}

// key is the group key a driver on these folders gives, with the secret in
// its state folder.
func (n nodeDirs) key(t *testing.T, ns, source, identity string) string {
	t.Helper()
	k, err := group.LoadKeyer(n.state)
	if err != nil {
		t.Fatal(err)
	}
	return k.Key(ns, source, identity)
}

// plugin is a running driver and the kubelet's connections to it.
type plugin struct {
	driver *dra.Driver
	dra    drapb.DRAPluginClient
	health drahealthv1.DRAResourceHealthClient
	stop   func()
}

func startPlugin(t *testing.T, dirs nodeDirs, client *fake.Clientset, state dra.StateSource) *plugin {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	d, err := dra.New(dra.Config{
		NodeName: node,
		Member:   group.Member{GroupID: "k8s", RegistryRoot: registryRoot},
		ShmDir:   dirs.shm, CDIDir: dirs.cdi, StateDir: dirs.state,
		Pods:    client.CoreV1(),
		Version: "0.1.0-devel",
	}, state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dirs.registry, 0o755); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var serveErr error
	go func() {
		defer close(done)
		serveErr = d.Serve(ctx, client, dra.ServeOptions{PluginsDir: dirs.plugins, RegistryDir: dirs.registry})
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			if serveErr != nil {
				t.Errorf("Serve: %v", serveErr)
			}
		})
	}
	t.Cleanup(stop)

	regSock := filepath.Join(dirs.registry, dra.DriverName+"-reg.sock")
	// The socket's file is there from bind (or from the driver stopped
	// before a restart) before anyone listens on it: wait for a connection.
	waitFor(t, "registration socket", func() bool {
		select {
		case <-done:
			t.Fatalf("Serve ended: %v", serveErr)
		default:
		}
		c, err := net.Dial("unix", regSock)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	reg := dial(t, regSock)
	info, err := registerapi.NewRegistrationClient(reg).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != dra.DriverName {
		t.Fatalf("registration info %v", info)
	}
	if !slices.Contains(info.SupportedVersions, drapb.DRAPluginService) || !slices.Contains(info.SupportedVersions, drahealthv1.DRAResourceHealthService) {
		t.Fatalf("supported services %v lack %s or %s", info.SupportedVersions, drapb.DRAPluginService, drahealthv1.DRAResourceHealthService)
	}
	if _, err := registerapi.NewRegistrationClient(reg).NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if !d.Registered() {
		t.Fatal("driver does not know the kubelet accepted it")
	}
	conn := dial(t, info.Endpoint)
	return &plugin{driver: d, dra: drapb.NewDRAPluginClient(conn), health: drahealthv1.NewDRAResourceHealthClient(conn), stop: stop}
}

func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 30s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type claimOpt func(*resourceapi.ResourceClaim)

func withConfig(raw string) claimOpt {
	return func(c *resourceapi.ResourceClaim) {
		c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: dra.DriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)}}},
		})
	}
}

func adminAccess(c *resourceapi.ResourceClaim) {
	c.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
}

// newClaim is a claim allocated this node's relay device.
func newClaim(ns, name string, uid types.UID, opts ...claimOpt) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "relay", Driver: dra.DriverName, Pool: node, Device: dra.DeviceName,
				ShareID: ptr.To(types.UID("share-" + uid))}},
		}}},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

func newClient(t *testing.T, claims ...*resourceapi.ResourceClaim) *fake.Clientset {
	t.Helper()
	objs := []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}}
	for _, c := range claims {
		objs = append(objs, c)
	}
	return fake.NewClientset(objs...)
}

func ref(c *resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

func (p *plugin) prepare(t *testing.T, claims ...*resourceapi.ResourceClaim) map[string]*drapb.NodePrepareResourceResponse {
	t.Helper()
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, ref(c))
	}
	resp, err := p.dra.NodePrepareResources(t.Context(), req)
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	if len(resp.Claims) != len(claims) {
		t.Fatalf("%d answers for %d claims", len(resp.Claims), len(claims))
	}
	return resp.Claims
}

func (p *plugin) unprepare(t *testing.T, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, ref(c))
	}
	resp, err := p.dra.NodeUnprepareResources(t.Context(), req)
	if err != nil {
		t.Fatalf("NodeUnprepareResources: %v", err)
	}
	for uid, r := range resp.Claims {
		if r.Error != "" {
			t.Fatalf("unprepare %s: %s", uid, r.Error)
		}
	}
}

// mustPrepare prepares a claim and checks the answer names this node's
// relay device, the allocation's share and the claim's CDI device.
func (p *plugin) mustPrepare(t *testing.T, c *resourceapi.ResourceClaim) {
	t.Helper()
	r := p.prepare(t, c)[string(c.UID)]
	if r.Error != "" {
		t.Fatalf("prepare %s: %s", c.Name, r.Error)
	}
	want := dra.CDIKind + "=" + string(c.UID)
	if len(r.Devices) != 1 || r.Devices[0].PoolName != node || r.Devices[0].DeviceName != dra.DeviceName ||
		!slices.Equal(r.Devices[0].RequestNames, []string{"relay"}) || !slices.Equal(r.Devices[0].CdiDeviceIds, []string{want}) ||
		r.Devices[0].GetShareId() != "share-"+string(c.UID) {
		t.Fatalf("prepare %s: devices %v, want %s/%s with CDI device %s", c.Name, r.Devices, node, dra.DeviceName, want)
	}
}

// inject applies a claim's CDI device to an empty container spec the way
// a runtime does, through the CDI library.
func inject(t *testing.T, cdiDir string, uid types.UID) (*oci.Spec, error) {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, err
	}
	for path, errs := range cache.GetErrors() {
		t.Fatalf("CDI spec %s: %v", path, errs)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	_, err = cache.InjectDevices(spec, dra.CDIKind+"="+string(uid))
	return spec, err
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// checkMember checks that a container of the claim gets exactly the device
// plugin's environment and its group folder at the registry root.
func checkMember(t *testing.T, dirs nodeDirs, c *resourceapi.ResourceClaim) {
	t.Helper()
	spec, err := inject(t, dirs.cdi, c.UID)
	if err != nil {
		t.Fatalf("inject %s: %v", c.Name, err)
	}
	want := map[string]string{
		contract.EnvEnable:       contract.EnableOn,
		contract.EnvRailMap:      railMap,
		contract.EnvGroupID:      "k8s",
		contract.EnvRegistryRoot: registryRoot,
	}
	if got := envMap(spec.Process.Env); len(got) != len(want) || !mapsEqual(got, want) {
		t.Fatalf("%s: env %v, want %v", c.Name, got, want)
	}
	dir := dirs.groupDir(t, c.Namespace, c.UID)
	if len(spec.Mounts) != 1 || spec.Mounts[0].Source != dir || spec.Mounts[0].Destination != registryRoot ||
		!slices.Contains(spec.Mounts[0].Options, "rw") || slices.Contains(spec.Mounts[0].Options, "ro") {
		t.Fatalf("%s: mounts %+v, want %s read-write at %s", c.Name, spec.Mounts, dir, registryRoot)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatalf("%s: group folder: %v", c.Name, err)
	}
	if fi.Mode()&(os.ModeType|os.ModePerm|os.ModeSticky) != os.ModeDir|group.DirMode {
		t.Fatalf("%s: group folder mode %v", c.Name, fi.Mode())
	}
}

func mapsEqual(a, b map[string]string) bool {
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func checkGone(t *testing.T, dirs nodeDirs, c *resourceapi.ResourceClaim) {
	t.Helper()
	if _, err := os.Lstat(dirs.groupDir(t, c.Namespace, c.UID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s: group folder still there (%v)", c.Name, err)
	}
	if _, err := inject(t, dirs.cdi, c.UID); err == nil {
		t.Fatalf("%s: CDI device still resolves", c.Name)
	}
}

func TestPrepareUnprepareTwoClaims(t *testing.T) {
	dirs := newNodeDirs(t)
	a, b := newClaim("team-a", "job-a", "uid-a"), newClaim("team-b", "job-b", "uid-b")
	p := startPlugin(t, dirs, newClient(t, a, b), newRailState(readyState()))

	p.mustPrepare(t, a)
	p.mustPrepare(t, b)
	checkMember(t, dirs, a)
	checkMember(t, dirs, b)
	if dirs.groupDir(t, a.Namespace, a.UID) == dirs.groupDir(t, b.Namespace, b.UID) {
		t.Fatal("two claims share a group folder")
	}
	// A rank's registry inside the group folder goes with it.
	if err := os.Mkdir(filepath.Join(dirs.groupDir(t, a.Namespace, a.UID), "rank-0"), 0o700); err != nil {
		t.Fatal(err)
	}

	p.unprepare(t, a)
	checkGone(t, dirs, a)
	checkMember(t, dirs, b)
	// The kubelet may ask again; nothing is left to do.
	p.unprepare(t, a)
}

// forPod makes the claim one the scheduler made for the pod's extended
// resource request.
func forPod(p *corev1.Pod) claimOpt {
	return func(c *resourceapi.ResourceClaim) {
		c.Annotations = map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"}
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: p.Name, UID: p.UID}}
	}
}

func newPod(ns, name string, uid types.UID, job string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid}}
	if job != "" {
		p.Labels = map[string]string{group.Label: job}
	}
	return p
}

// TestExtendedResourceClaimsGroupByLabel: the claims the scheduler makes for
// pods that request the extended resource group by the pods' group label,
// as the device plugin groups them; the folder goes with the last of them.
func TestExtendedResourceClaimsGroupByLabel(t *testing.T) {
	dirs := newNodeDirs(t)
	p1, p2 := newPod("team-a", "rank-0", "pod-1", "job"), newPod("team-a", "rank-1", "pod-2", "job")
	p3 := newPod("team-a", "other", "pod-3", "")
	e1, e2 := newClaim("team-a", "rank-0-relay", "uid-1", forPod(p1)), newClaim("team-a", "rank-1-relay", "uid-2", forPod(p2))
	e3 := newClaim("team-a", "other-relay", "uid-3", forPod(p3))
	stale := newClaim("team-a", "stale-relay", "uid-4", forPod(newPod("team-a", "rank-0", "pod-old", "job")))
	client := newClient(t, e1, e2, e3, stale)
	for _, pod := range []*corev1.Pod{p1, p2, p3} {
		if _, err := client.CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p := startPlugin(t, dirs, client, newRailState(readyState()))
	for _, c := range []*resourceapi.ResourceClaim{e1, e2, e3} {
		p.mustPrepare(t, c)
	}
	job := filepath.Join(contract.GroupsDir(dirs.shm), dirs.key(t, "team-a", group.SourceLabel, "job"))
	for _, c := range []*resourceapi.ResourceClaim{e1, e2} {
		spec, err := inject(t, dirs.cdi, c.UID)
		if err != nil {
			t.Fatal(err)
		}
		if len(spec.Mounts) != 1 || spec.Mounts[0].Source != job {
			t.Fatalf("%s mounts %+v, want the job's folder %s", c.Name, spec.Mounts, job)
		}
	}
	checkMember(t, dirs, e3) // no label: a group of its own
	jobKey := dirs.key(t, "team-a", group.SourceLabel, "job")
	want := map[string]group.Owner{
		group.OwnerRecordName(jobKey, "claim-uid-1"): {Namespace: "team-a", Pods: []string{"rank-0"}, Claim: "rank-0-relay"},
		group.OwnerRecordName(jobKey, "claim-uid-2"): {Namespace: "team-a", Pods: []string{"rank-1"}, Claim: "rank-1-relay"},
	}
	ownKey := dirs.key(t, "team-a", group.SourceClaim, "uid-3")
	checkOwners(t, dirs, map[string]map[string]group.Owner{jobKey: want, ownKey: {
		group.OwnerRecordName(ownKey, "claim-uid-3"): {Namespace: "team-a", Pods: []string{"other"}, Claim: "other-relay"},
	}})
	if r := p.prepare(t, stale)[string(stale.UID)]; !strings.Contains(r.Error, "has UID pod-1; the claim is reserved for UID pod-old") {
		t.Fatalf("a claim reserved for a pod that is gone: %q", r.Error)
	}

	p.unprepare(t, e1)
	if _, err := os.Stat(job); err != nil {
		t.Fatalf("the job's folder went with one of its two claims: %v", err)
	}
	delete(want, group.OwnerRecordName(jobKey, "claim-uid-1"))
	checkOwners(t, dirs, map[string]map[string]group.Owner{jobKey: want})
	p.unprepare(t, e2)
	if _, err := os.Lstat(job); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the job's folder outlived its claims (%v)", err)
	}
	checkOwners(t, dirs, map[string]map[string]group.Owner{jobKey: nil})
}

// checkOwners checks that the owner records of each group key of want are
// exactly want's for it (file name → owner; nil: none).
func checkOwners(t *testing.T, dirs nodeDirs, want map[string]map[string]group.Owner) {
	t.Helper()
	ownersDir := contract.OwnersDir(dirs.shm)
	names, err := group.ListOwners(ownersDir)
	if err != nil {
		t.Fatal(err)
	}
	for key, records := range want {
		got := map[string]group.Owner{}
		for _, f := range names[key] {
			o, err := group.ReadOwner(filepath.Join(ownersDir, f))
			if err != nil {
				t.Fatal(err)
			}
			got[f] = o
		}
		if len(got) != len(records) {
			t.Errorf("group %s: owner records %v, want %v", key, got, records)
			continue
		}
		for f, o := range records {
			if g, ok := got[f]; !ok || g.Namespace != o.Namespace || g.Claim != o.Claim || !slices.Equal(g.Pods, o.Pods) {
				t.Errorf("group %s: owner record %s is %+v (%v), want %+v", key, f, g, ok, o)
			}
		}
	}
}

func TestPrepareIsIdempotent(t *testing.T) {
	dirs := newNodeDirs(t)
	a := newClaim("team-a", "job-a", "uid-a")
	state := newRailState(readyState())
	p := startPlugin(t, dirs, newClient(t, a), state)

	p.mustPrepare(t, a)
	registry := filepath.Join(dirs.groupDir(t, a.Namespace, a.UID), "rank-0")
	if err := os.Mkdir(registry, 0o700); err != nil {
		t.Fatal(err)
	}
	// A repeated Prepare (a kubelet restart) answers from the checkpoint,
	// even after the rails went down: running members keep their group.
	down := readyState()
	down.Healthy = false
	state.set(down)
	p.mustPrepare(t, a)
	checkMember(t, dirs, a)
	if _, err := os.Stat(registry); err != nil {
		t.Fatalf("repeated Prepare lost the group folder's content: %v", err)
	}
}

func TestUnprepareAfterRestart(t *testing.T) {
	dirs := newNodeDirs(t)
	a, b := newClaim("team-a", "job-a", "uid-a"), newClaim("team-a", "job-b", "uid-b")
	client := newClient(t, a, b)
	p := startPlugin(t, dirs, client, newRailState(readyState()))
	p.mustPrepare(t, a)
	p.mustPrepare(t, b)
	p.stop()

	p = startPlugin(t, dirs, client, newRailState(readyState()))
	if got := p.driver.Prepared(); len(got) != 2 {
		t.Fatalf("restarted driver holds %v, want both claims", got)
	}
	p.unprepare(t, a)
	checkGone(t, dirs, a)
	checkMember(t, dirs, b)
	p.mustPrepare(t, b)
	checkMember(t, dirs, b)
}

func TestBadClaimsNameWhy(t *testing.T) {
	notReady := readyState()
	notReady.Healthy = false
	notReady.Summary.Detail = "not active: mlx5_0 port 1 DOWN (Disabled)"
	failed := readyState()
	failed.Err = errors.New("read /sys/class/infiniband: permission denied")
	failed.Healthy = false
	good := `{"apiVersion":"pxn.io/v1alpha1","kind":"RelayConfig"}`
	for _, tc := range []struct {
		name  string
		state nodestate.NodeState
		opts  []claimOpt
		want  []string
	}{
		{"unknown kind", readyState(), []claimOpt{withConfig(`{"apiVersion":"pxn.io/v1alpha1","kind":"GpuConfig"}`)}, []string{"GpuConfig", "opaque config 0"}},
		{"unknown apiVersion", readyState(), []claimOpt{withConfig(`{"apiVersion":"pxn.io/v2","kind":"RelayConfig"}`)}, []string{"pxn.io/v2"}},
		{"unknown field", readyState(), []claimOpt{withConfig(good), withConfig(`{"apiVersion":"pxn.io/v1alpha1","kind":"RelayConfig","rings":4}`)}, []string{"rings", "opaque config 1"}},
		{"field twice", readyState(), []claimOpt{withConfig(`{"apiVersion":"pxn.io/v1alpha1","kind":"RelayConfig","kind":"RelayConfig"}`)}, []string{`duplicate field "kind"`}},
		{"field name in another case", readyState(), []claimOpt{withConfig(`{"APIVersion":"pxn.io/v1alpha1","apiVersion":"pxn.io/v1alpha1","kind":"RelayConfig"}`)}, []string{"APIVersion"}},
		{"not JSON", readyState(), []claimOpt{withConfig(`apiVersion: pxn.io/v1alpha1`)}, []string{"opaque config 0"}},
		{"rails not ready", notReady, nil, []string{node, "mlx5_0 port 1 DOWN"}},
		{"discovery failed", failed, nil, []string{node, "permission denied"}},
		{"not discovered", nodestate.NodeState{}, nil, []string{node, "not discovered"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dirs := newNodeDirs(t)
			c := newClaim("team-a", "job-a", "uid-a", tc.opts...)
			p := startPlugin(t, dirs, newClient(t, c), newRailState(tc.state))
			r := p.prepare(t, c)[string(c.UID)]
			for _, w := range tc.want {
				if !strings.Contains(r.Error, w) {
					t.Fatalf("error %q does not name %q", r.Error, w)
				}
			}
			if !strings.Contains(r.Error, "team-a/job-a") {
				t.Fatalf("error %q does not name the claim", r.Error)
			}
			checkGone(t, dirs, c)
			if len(p.driver.Prepared()) != 0 {
				t.Fatal("a failed claim is in the checkpoint")
			}
		})
	}
	t.Run("good config", func(t *testing.T) {
		dirs := newNodeDirs(t)
		c := newClaim("team-a", "job-a", "uid-a", withConfig(good))
		p := startPlugin(t, dirs, newClient(t, c), newRailState(readyState()))
		p.mustPrepare(t, c)
		checkMember(t, dirs, c)
	})
}

func TestAdminAccessReadsEveryGroup(t *testing.T) {
	dirs := newNodeDirs(t)
	a := newClaim("team-a", "job-a", "uid-a")
	admin := newClaim("ops", "debug", "uid-admin", adminAccess)
	notReady := readyState()
	notReady.Healthy = false
	state := newRailState(readyState())
	p := startPlugin(t, dirs, newClient(t, a, admin), state)
	p.mustPrepare(t, a)
	// Diagnosis is wanted most when the rails are down.
	state.set(notReady)
	p.mustPrepare(t, admin)

	spec, err := inject(t, dirs.cdi, admin.UID)
	if err != nil {
		t.Fatal(err)
	}
	groups := contract.GroupsDir(dirs.shm)
	if len(spec.Mounts) != 1 || spec.Mounts[0].Source != groups || spec.Mounts[0].Destination != registryRoot ||
		!slices.Contains(spec.Mounts[0].Options, "ro") || slices.Contains(spec.Mounts[0].Options, "rw") {
		t.Fatalf("admin mounts %+v, want %s read-only at %s", spec.Mounts, groups, registryRoot)
	}
	if env := envMap(spec.Process.Env); env[contract.EnvEnable] != "" {
		t.Fatalf("admin container gets the engine enabled: %v", env)
	}
	if _, err := os.Lstat(dirs.groupDir(t, admin.Namespace, admin.UID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("admin claim got a group folder (%v)", err)
	}
	p.unprepare(t, admin)
	if _, err := os.Stat(groups); err != nil {
		t.Fatalf("unpreparing the admin claim removed the groups folder: %v", err)
	}
	checkMember(t, dirs, a)
}

func TestPublishesRelayDevice(t *testing.T) {
	dirs := newNodeDirs(t)
	client := newClient(t)
	state := newRailState(nodestate.NodeState{})
	startPlugin(t, dirs, client, state)

	slice := func() *resourceapi.ResourceSlice { return nodeSlice(t, client) }
	if s := slice(); s != nil {
		t.Fatalf("published before the rails were discovered: %+v", s.Spec)
	}
	state.set(readyState())
	waitFor(t, "ResourceSlice", func() bool { return slice() != nil })
	s := slice()
	if s.Spec.Driver != dra.DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != node || s.Spec.Pool.Name != node {
		t.Fatalf("slice spec %+v", s.Spec)
	}
	if len(s.Spec.Devices) != 1 {
		t.Fatalf("devices %+v, want one", s.Spec.Devices)
	}
	dev := s.Spec.Devices[0]
	if dev.Name != dra.DeviceName || dev.AllowMultipleAllocations == nil || !*dev.AllowMultipleAllocations {
		t.Fatalf("device %+v, want %s with allowMultipleAllocations", dev, dra.DeviceName)
	}
	attr := func(name string) resourceapi.DeviceAttribute { return dev.Attributes[resourceapi.QualifiedName(name)] }
	if a := attr(dra.AttrRails); a.IntValue == nil || *a.IntValue != 2 {
		t.Fatalf("rails %+v", a)
	}
	if a := attr(dra.AttrGPUs); a.IntValue == nil || *a.IntValue != 8 {
		t.Fatalf("gpus %+v", a)
	}
	if a := attr(dra.AttrHCAs); a.IntValue == nil || *a.IntValue != 2 {
		t.Fatalf("hcas %+v", a)
	}
	if a := attr(dra.AttrRailsReady); a.BoolValue == nil || !*a.BoolValue {
		t.Fatalf("railsReady %+v", a)
	}
	if a := attr(dra.AttrRailStrategy); a.StringValue == nil || *a.StringValue != "pci-order" {
		t.Fatalf("railStrategy %+v", a)
	}
	if a := attr(dra.AttrVersion); a.VersionValue == nil || *a.VersionValue != "0.1.0-devel" {
		t.Fatalf("version %+v", a)
	}

	down := readyState()
	down.Healthy = false
	down.Summary.Rails = 1
	state.set(down)
	waitFor(t, "republished slice", func() bool {
		a := slice().Spec.Devices[0].Attributes
		return *a[dra.AttrRailsReady].BoolValue == false && *a[dra.AttrRails].IntValue == 1
	})
}

func TestHealthFollowsRails(t *testing.T) {
	dirs := newNodeDirs(t)
	state := newRailState(readyState())
	p := startPlugin(t, dirs, newClient(t), state)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := p.health.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	next := func() *drahealthv1.DeviceHealth {
		t.Helper()
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("health stream: %v", err)
		}
		if len(r.Devices) != 1 || r.Devices[0].Device.PoolName != node || r.Devices[0].Device.DeviceName != dra.DeviceName {
			t.Fatalf("health report %v", r.Devices)
		}
		return r.Devices[0]
	}
	if h := next(); h.Health != drahealthv1.HealthStatus_HEALTHY {
		t.Fatalf("health %v, want healthy", h.Health)
	}
	down := readyState()
	down.Healthy = false
	state.set(down)
	// A periodic re-send of the old state may come first.
	for {
		h := next()
		if h.Health == drahealthv1.HealthStatus_UNHEALTHY {
			break
		}
		if h.Health != drahealthv1.HealthStatus_HEALTHY {
			t.Fatalf("health %v", h.Health)
		}
	}
}

// breakCheckpoint puts a folder with a file in it where the checkpoint goes,
// so that no write of the checkpoint can replace it; the returned func
// removes the folder again.
func breakCheckpoint(t *testing.T, dirs nodeDirs) func() {
	t.Helper()
	path := filepath.Join(dirs.state, dra.CheckpointFile)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "blocked"), 0o700); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPrepareWritesTheCheckpointFirst: a claim whose checkpoint write fails
// is not prepared, in memory or on the node, so the kubelet's retry is a
// real Prepare, and what a later Prepare makes a restarted driver finds.
func TestPrepareWritesTheCheckpointFirst(t *testing.T) {
	dirs := newNodeDirs(t)
	a := newClaim("team-a", "job-a", "uid-a")
	client := newClient(t, a)
	p := startPlugin(t, dirs, client, newRailState(readyState()))

	repair := breakCheckpoint(t, dirs)
	if r := p.prepare(t, a)[string(a.UID)]; !strings.Contains(r.Error, dra.CheckpointFile) || len(r.Devices) != 0 {
		t.Fatalf("prepare with the checkpoint unwritable: %+v, want an error naming %s", r, dra.CheckpointFile)
	}
	if got := p.driver.Prepared(); len(got) != 0 {
		t.Fatalf("driver holds %v after a failed checkpoint write", got)
	}
	checkGone(t, dirs, a)
	// The retry, as the kubelet makes it.
	if r := p.prepare(t, a)[string(a.UID)]; r.Error == "" {
		t.Fatalf("retry answered %+v from memory while the checkpoint is still unwritable", r)
	}
	repair()
	p.mustPrepare(t, a)
	checkMember(t, dirs, a)
	p.stop()

	p = startPlugin(t, dirs, client, newRailState(readyState()))
	if got := p.driver.Prepared(); !slices.Equal(got, []types.UID{a.UID}) {
		t.Fatalf("restarted driver holds %v, want %s", got, a.UID)
	}
	p.unprepare(t, a)
	checkGone(t, dirs, a)
}

// TestUnprepareWritesTheCheckpointFirst: a claim whose removal from the
// checkpoint fails stays prepared in memory and fails its Unprepare, so
// that the kubelet tries again, and a driver restarted after the retry
// holds nothing.
func TestUnprepareWritesTheCheckpointFirst(t *testing.T) {
	dirs := newNodeDirs(t)
	a, b := newClaim("team-a", "job-a", "uid-a"), newClaim("team-b", "job-b", "uid-b")
	client := newClient(t, a, b)
	p := startPlugin(t, dirs, client, newRailState(readyState()))
	p.mustPrepare(t, a)
	p.mustPrepare(t, b)

	repair := breakCheckpoint(t, dirs)
	resp, err := p.dra.NodeUnprepareResources(t.Context(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref(a)}})
	if err != nil {
		t.Fatalf("NodeUnprepareResources: %v", err)
	}
	if r := resp.Claims[string(a.UID)]; r == nil || !strings.Contains(r.Error, dra.CheckpointFile) {
		t.Fatalf("unprepare with the checkpoint unwritable: %+v, want an error naming %s", r, dra.CheckpointFile)
	}
	if got := p.driver.Prepared(); len(got) != 2 {
		t.Fatalf("driver holds %v after a failed checkpoint write, want both claims", got)
	}
	repair()
	p.unprepare(t, a)
	checkGone(t, dirs, a)
	checkMember(t, dirs, b)
	p.stop()

	p = startPlugin(t, dirs, client, newRailState(readyState()))
	if got := p.driver.Prepared(); !slices.Equal(got, []types.UID{b.UID}) {
		t.Fatalf("restarted driver holds %v, want only %s", got, b.UID)
	}
}

// TestUnprepareTwoClaimsOfOneGroupAtOnce: two claims of one job (one group
// by label) unprepared in one call leave no group folder behind.
func TestUnprepareTwoClaimsOfOneGroupAtOnce(t *testing.T) {
	dirs := newNodeDirs(t)
	pa, pb := newPod("team-a", "rank-0", "pod-a", "job"), newPod("team-a", "rank-1", "pod-b", "job")
	a, b := newClaim("team-a", "claim-a", "uid-a", forPod(pa)), newClaim("team-a", "claim-b", "uid-b", forPod(pb))
	client := newClient(t, a, b)
	if _, err := client.CoreV1().Pods("team-a").Create(t.Context(), pa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("team-a").Create(t.Context(), pb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := startPlugin(t, dirs, client, newRailState(readyState()))
	p.mustPrepare(t, a)
	p.mustPrepare(t, b)
	folder := filepath.Join(contract.GroupsDir(dirs.shm), dirs.key(t, "team-a", group.SourceLabel, "job"))
	if _, err := os.Stat(folder); err != nil {
		t.Fatalf("the job's group folder: %v", err)
	}
	p.unprepare(t, a, b)
	if _, err := os.Lstat(folder); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("group folder of the job still there after both claims left (%v)", err)
	}
}
