// SPDX-License-Identifier: Apache-2.0

package chart_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/deviceplugin"
	"github.com/pxn-project/pxn/pkg/dra"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/nodestate"
	"github.com/pxn-project/pxn/pkg/rail"
)

// auditPolicy records every request of a service account, without bodies.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
`

// accessEnv is a kube-apiserver holding everything the chart renders by
// default and with the DRA driver on, with two nodes and a pod of each
// component on node-a.
type accessEnv struct {
	admin    *rest.Config
	clients  kubernetes.Interface
	auditLog string
	objs     []*unstructured.Unstructured
	nodes    map[string]*corev1.Node
	pods     map[string]*corev1.Pod // by component
}

func startAccessEnv(t *testing.T) *accessEnv {
	t.Helper()
	h := newHelm(t)
	assets := testtools.EnvtestAssets(t)
	dir := t.TempDir()
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	e := &accessEnv{auditLog: filepath.Join(dir, "audit.log"), nodes: map[string]*corev1.Node{}, pods: map[string]*corev1.Pod{}}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(chartDir, "crds")},
		ErrorIfCRDPathMissing: true,
	}
	env.ControlPlane.GetAPIServer().Configure().
		Set("audit-policy-file", policy).
		Set("audit-log-path", e.auditLog).
		Set("shutdown-watch-termination-grace-period", "2s")
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop kube-apiserver: %v", err)
		}
	})
	e.admin = cfg
	e.clients = kubernetes.NewForConfigOrDie(cfg)

	ctx := context.Background()
	if _, err := e.clients.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	e.objs = h.template(t, "--set", "dra.enabled=true")
	if find(e.objs, "ValidatingAdmissionPolicy", "pxn-agent-node-restriction") == nil {
		t.Fatalf("no node-restriction policy rendered for Kubernetes %s; have %v", kubeVersion, names(e.objs))
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))
	for _, o := range e.objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, o.GetName(), err)
		}
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			r = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := r.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s %s: %v", gvk.Kind, o.GetName(), err)
		}
	}
	for _, name := range []string{"node-a", "node-b"} {
		n, err := e.clients.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: map[string]string{"kubernetes.io/hostname": name},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
		e.nodes[name] = n
	}
	for _, comp := range []string{"agent", "device-plugin", "dra-plugin"} {
		p, err := e.clients.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "pxn-" + comp + "-a", Labels: map[string]string{"pxn.io/group": "g"}},
			Spec: corev1.PodSpec{
				NodeName:           "node-a",
				ServiceAccountName: "pxn-" + comp,
				Containers:         []corev1.Container{{Name: comp, Image: "pxn:test"}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s pod: %v", comp, err)
		}
		e.pods[comp] = p
	}
	return e
}

// tokenConfig returns a client config authenticating with a token of the
// component's service account, bound to its pod on node-a when bound is set
// (the API server then puts the node's name in the request's user info).
func (e *accessEnv) tokenConfig(t *testing.T, component string, bound bool) *rest.Config {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo[int64](3600)}}
	if bound {
		p := e.pods[component]
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}
	}
	tok, err := e.clients.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), "pxn-"+component, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", component, err)
	}
	cfg := &rest.Config{Host: e.admin.Host, BearerToken: tok.Status.Token}
	cfg.CAData = e.admin.CAData
	return cfg
}

func ptrTo[T any](v T) *T { return &v }

// scriptedDiscoverer reports a one-rail node whose port state the test sets.
type scriptedDiscoverer struct {
	mu    sync.Mutex
	ready bool
}

func (d *scriptedDiscoverer) set(ready bool) {
	d.mu.Lock()
	d.ready = ready
	d.mu.Unlock()
}

func (d *scriptedDiscoverer) Fingerprint() (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return fmt.Sprint(d.ready), nil
}

func (d *scriptedDiscoverer) Discover(context.Context) (*rail.Layout, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	state := "ACTIVE"
	if !d.ready {
		state = "DOWN"
	}
	return &rail.Layout{
		Rails: 1, Strategy: "pci-order", GPUSource: "sysfs",
		GPUs:    []rail.GPU{{Index: 0, PCIBusID: "0000:18:00.0", NUMANode: 0, HCA: "mlx5_0", Distance: "PIX", Rail: "rail0"}},
		HCAs:    []rail.HCA{{Name: "mlx5_0", PCIBusID: "0000:19:00.0", LinkLayer: "InfiniBand", State: state, PhysState: "LinkUp", Rate: "400 Gb/sec (4X NDR)", Rail: "rail0", Port: 1}},
		RailMap: map[string]string{"mlx5_0": "rail0"},
	}, nil
}

// TestChartGrantsWhatTheCodeUses runs the real agent and the device plugin's
// API client with the chart's service accounts, RBAC and node-restriction
// policy on a real kube-apiserver, records every request they make in the
// server's audit log, and compares the verbs the server saw with the rules
// the chart grants: the components must work under the chart, and the chart
// must grant nothing they did not use.
func TestChartGrantsWhatTheCodeUses(t *testing.T) {
	e := startAccessEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The agent: publish, label, record Events; then a port goes down and
	// comes back, twice.
	disc := &scriptedDiscoverer{ready: true}
	agentCtx, cancelAgent := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(agentCtx, e.tokenConfig(t, "agent", true), agent.Options{
			NodeName: "node-a", Discoverer: disc, Resync: time.Hour, PollInterval: 20 * time.Millisecond,
			AgentVersion: "test", Registerer: prometheus.NewRegistry(), MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second,
		})
	}()
	stopAgent := sync.OnceFunc(func() {
		cancelAgent()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	defer stopAgent()
	dyn := dynamic.NewForConfigOrDie(e.admin)
	maps := dyn.Resource(pxnv1alpha1.GroupVersion.WithResource("pxnrailmaps"))
	waitReady := func(want string) {
		t.Helper()
		poll(t, ctx, func() error {
			m, err := maps.Get(ctx, "node-a", metav1.GetOptions{})
			if err != nil {
				return err
			}
			var prm pxnv1alpha1.PxnRailMap
			if err := fromUnstructured(m, &prm); err != nil {
				return err
			}
			c := meta.FindStatusCondition(prm.Status.Conditions, pxnv1alpha1.ConditionReady)
			if c == nil || string(c.Status) != want {
				return fmt.Errorf("Ready condition %+v, want %s", c, want)
			}
			return nil
		})
	}
	waitReady("True")
	for _, ready := range []bool{false, true, false, true} {
		disc.set(ready)
		want := metav1.ConditionFalse
		if ready {
			want = metav1.ConditionTrue
		}
		waitReady(string(want))
	}
	// Ready and Consistent at the first publish, then four changes of Ready,
	// each on the map and the node.
	const wantEvents = 2 * (2 + 4)
	poll(t, ctx, func() error {
		evs, err := e.clients.EventsV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if n := len(evs.Items); n < wantEvents {
			return fmt.Errorf("%d Events, waiting for %d", n, wantEvents)
		}
		return nil
	})
	n, err := e.clients.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil || n.Labels[pxnv1alpha1.LabelCapable] != "true" {
		t.Fatalf("node-a labels %v (%v), want %s=true", n.Labels, err, pxnv1alpha1.LabelCapable)
	}
	stopAgent()

	// The device plugin's API client reads the pod that holds its device.
	pods := deviceplugin.NewClientPodGetter(kubernetes.NewForConfigOrDie(e.tokenConfig(t, "device-plugin", true)))
	if p, err := pods.Pod(ctx, namespace, e.pods["agent"].Name); err != nil || p.Labels["pxn.io/group"] != "g" {
		t.Fatalf("device plugin reads pod: %v, labels %v", err, p)
	}

	runDRADriver(t, ctx, e)

	used := auditedAccess(t, e.auditLog)
	for _, c := range []struct{ component, user string }{
		{"agent", "system:serviceaccount:" + namespace + ":pxn-agent"},
		{"device-plugin", "system:serviceaccount:" + namespace + ":pxn-device-plugin"},
		{"dra-plugin", "system:serviceaccount:" + namespace + ":pxn-dra-plugin"},
	} {
		granted := grantedAccess(t, e.objs, "pxn-"+c.component)
		got := used[c.user]
		// A cluster-wide grant ("VERB GROUP/RESOURCE") covers the same
		// request in every namespace.
		clusterWide := func(k string) string { return strings.SplitN(k, " in ", 2)[0] }
		usedAnywhere := map[string]bool{}
		for k := range got {
			usedAnywhere[clusterWide(k)] = true
			if !granted[k] && !granted[clusterWide(k)] {
				t.Errorf("%s made %s, which the chart does not grant", c.component, k)
			}
		}
		for k := range granted {
			if !got[k] && (strings.Contains(k, " in ") || !usedAnywhere[k]) {
				t.Errorf("the chart grants %s %s, which it never made", c.component, k)
			}
		}
		t.Logf("%s: %v", c.component, slices.Sorted(func(yield func(string) bool) {
			for k := range got {
				if !yield(k) {
					return
				}
			}
		}))
	}
}

// runDRADriver runs the DRA driver with its pod's token on node-a, as the
// kubelet would: it replaces a leftover slice of its pool with its own,
// publishes again when the rails go down, and prepares a claim the
// scheduler made for a labelled pod's extended resource request.
func runDRADriver(t *testing.T, ctx context.Context, e *accessEnv) {
	t.Helper()
	slices := e.clients.ResourceV1().ResourceSlices()
	leftover := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "leftover"},
		Spec: resourcev1.ResourceSliceSpec{Driver: dra.DriverName, NodeName: ptrTo("node-a"),
			Pool: resourcev1.ResourcePool{Name: "node-a", ResourceSliceCount: 1}, Devices: []resourcev1.Device{{Name: "old"}}},
	}
	if _, err := slices.Create(ctx, leftover, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Unix socket paths are short: not under t.TempDir's long name.
	base, err := os.MkdirTemp("", "pxn-dra-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	disc := &scriptedDiscoverer{ready: true}
	state := nodestate.NewMonitor(disc, nodestate.Options{Interval: 20 * time.Millisecond, Logger: klog.Background()})
	token := kubernetes.NewForConfigOrDie(e.tokenConfig(t, "dra-plugin", true))
	d, err := dra.New(dra.Config{
		NodeName: "node-a", Member: group.Member{GroupID: "k8s", RegistryRoot: "/run/pxn"},
		ShmDir: filepath.Join(base, "shm"), CDIDir: filepath.Join(base, "cdi"), StateDir: filepath.Join(base, "state"),
		Pods: token.CoreV1(),
	}, state)
	if err != nil {
		t.Fatal(err)
	}
	dctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	wg.Go(func() { state.Run(dctx) })
	plugins, registry := filepath.Join(base, "plugins"), filepath.Join(base, "registry")
	if err := os.Mkdir(registry, 0o755); err != nil { // the kubelet's, made before any plugin
		t.Fatal(err)
	}
	wg.Go(func() {
		if err := d.Serve(dctx, token, dra.ServeOptions{PluginsDir: plugins, RegistryDir: registry}); err != nil {
			t.Errorf("DRA driver: %v", err)
		}
	})
	railsReady := func(want bool) {
		t.Helper()
		poll(t, ctx, func() error {
			list, err := slices.List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			var got []string
			for _, s := range list.Items {
				got = append(got, s.Name)
				if s.Name == "leftover" || s.Spec.Driver != dra.DriverName || len(list.Items) != 1 {
					continue
				}
				for _, dev := range s.Spec.Devices {
					if dev.Name != dra.DeviceName {
						continue
					}
					if r := dev.Attributes[dra.AttrRailsReady].BoolValue; r != nil && *r == want {
						return nil
					}
				}
			}
			return fmt.Errorf("slices %v, want the driver's only, its relay device with railsReady %v", got, want)
		})
	}
	railsReady(true)
	disc.set(false)
	railsReady(false)
	disc.set(true)
	railsReady(true)

	pod := e.pods["dra-plugin"]
	claim, err := e.clients.ResourceV1().ResourceClaims(namespace).Create(ctx, &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "extended", Annotations: map[string]string{resourcev1.ExtendedResourceClaimAnnotation: "true"}},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "relay", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "relay.pxn.io"}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status = resourcev1.ResourceClaimStatus{
		Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
			Request: "relay", Driver: dra.DriverName, Pool: "node-a", Device: dra.DeviceName}}}},
		ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}},
	}
	if claim, err = e.clients.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(plugins, dra.DriverName, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: namespace, Name: claim.Name, Uid: string(claim.UID)}}})
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	if r := resp.Claims[string(claim.UID)]; r == nil || r.Error != "" || len(r.Devices) != 1 {
		t.Fatalf("prepare: %+v", r)
	}
	keys, err := group.LoadKeyer(filepath.Join(base, "state"))
	if err != nil {
		t.Fatal(err)
	}
	want := keys.Key(namespace, group.SourceLabel, pod.Labels[group.Label])
	if _, err := os.Stat(filepath.Join(base, "shm", "groups", want)); err != nil {
		t.Errorf("the extended resource claim's group is not its pod's label's: %v", err)
	}
}

// access is "VERB GROUP/RESOURCE[/SUBRESOURCE] [in NAMESPACE]", the form
// both the audit log and the rendered rules are reduced to.
func access(verb, group, resource, namespace string) string {
	s := verb + " " + group + "/" + resource
	if namespace != "" {
		s += " in " + namespace
	}
	return s
}

// auditedAccess reads the audit log: for each user, the accesses the API
// server authorized. A patch that created its object (201) needed create as
// well, and a watch of a collection stands for the list it replaces. A
// request the server refused fails the test.
func auditedAccess(t *testing.T, path string) map[string]map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev struct {
			Verb string `json:"verb"`
			User struct {
				Username string `json:"username"`
			} `json:"user"`
			ObjectRef *struct {
				Resource    string `json:"resource"`
				Subresource string `json:"subresource"`
				APIGroup    string `json:"apiGroup"`
				Namespace   string `json:"namespace"`
				Name        string `json:"name"`
			} `json:"objectRef"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			RequestURI string `json:"requestURI"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("audit log line %q: %v", sc.Text(), err)
		}
		if ev.ObjectRef == nil {
			continue // discovery and other non-resource URLs, open to every user
		}
		if ev.ResponseStatus != nil && (ev.ResponseStatus.Code == 401 || ev.ResponseStatus.Code == 403 || ev.ResponseStatus.Code == 422) {
			t.Errorf("%s: %s %s refused with %d", ev.User.Username, ev.Verb, ev.RequestURI, ev.ResponseStatus.Code)
		}
		res := ev.ObjectRef.Resource
		if ev.ObjectRef.Subresource != "" {
			res += "/" + ev.ObjectRef.Subresource
		}
		if out[ev.User.Username] == nil {
			out[ev.User.Username] = map[string]bool{}
		}
		add := func(verb string) {
			out[ev.User.Username][access(verb, ev.ObjectRef.APIGroup, res, ev.ObjectRef.Namespace)] = true
		}
		add(ev.Verb)
		switch {
		case ev.Verb == "patch" && ev.ResponseStatus != nil && ev.ResponseStatus.Code == 201:
			add("create")
		case ev.Verb == "watch":
			// An informer's streaming watch replaces its initial list; it
			// lists instead on an API server without streaming watches.
			add("list")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// grantedAccess is every access the rendered roles bound to the service
// account grant: cluster roles everywhere, roles in their namespace.
func grantedAccess(t *testing.T, objs []*unstructured.Unstructured, sa string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	add := func(rules []rbacv1.PolicyRule, ns string) {
		for _, r := range rules {
			if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
				t.Errorf("%s: rule %+v: the comparison handles resource rules without names only", sa, r)
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						out[access(v, g, res, ns)] = true
					}
				}
			}
		}
	}
	boundTo := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == namespace
		})
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRoleBinding":
			b := typed[rbacv1.ClusterRoleBinding](t, objs, o.GetKind(), o.GetName())
			if boundTo(b.Subjects) {
				add(typed[rbacv1.ClusterRole](t, objs, "ClusterRole", b.RoleRef.Name).Rules, "")
			}
		case "RoleBinding":
			b := typed[rbacv1.RoleBinding](t, objs, o.GetKind(), o.GetName())
			if boundTo(b.Subjects) {
				if b.RoleRef.Kind != "Role" {
					t.Fatalf("RoleBinding %s refers to a %s", b.Name, b.RoleRef.Kind)
				}
				add(typed[rbacv1.Role](t, objs, "Role", b.RoleRef.Name).Rules, o.GetNamespace())
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("the chart grants %s nothing", sa)
	}
	return out
}

// TestNodeRestrictionPolicy checks the chart's ValidatingAdmissionPolicy on a
// real kube-apiserver: the agent of node-a, authenticated by a token bound to
// its pod on node-a, may change node-a's pxn.io/ labels, its PxnRailMap and
// Events about it, and nothing of node-b; a token that names no node may
// write nothing.
func TestNodeRestrictionPolicy(t *testing.T) {
	e := startAccessEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bound := e.tokenConfig(t, "agent", true)
	agentDyn := dynamic.NewForConfigOrDie(bound)
	agentClients := kubernetes.NewForConfigOrDie(bound)
	unbound := kubernetes.NewForConfigOrDie(e.tokenConfig(t, "agent", false))

	labelPatch := func(c kubernetes.Interface, node string, labels map[string]any) error {
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
		_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: agent.FieldManager})
		return err
	}
	applyMap := func(name, nodeName string) error {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": pxnv1alpha1.GroupVersion.String(), "kind": "PxnRailMap",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"nodeName": nodeName},
		}}
		_, err := agentDyn.Resource(pxnv1alpha1.GroupVersion.WithResource("pxnrailmaps")).Apply(ctx, name, u, metav1.ApplyOptions{FieldManager: agent.FieldManager, Force: true})
		return err
	}
	event := func(c kubernetes.Interface, node string) error {
		n := e.nodes[node]
		_, err := c.EventsV1().Events(metav1.NamespaceDefault).Create(ctx, &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-"}, EventTime: metav1.NowMicro(),
			ReportingController: agent.ReportingController, ReportingInstance: "pxn.io/agent-test", Action: agent.ActionDiscover,
			Reason: agent.ReasonPortsActive, Type: corev1.EventTypeNormal, Note: "test",
			Regarding: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: n.Name, UID: n.UID},
		}, metav1.CreateOptions{})
		return err
	}

	// The policy takes effect once the API server has loaded it.
	poll(t, ctx, func() error {
		if err := labelPatch(agentClients, "node-b", map[string]any{pxnv1alpha1.LabelRails: "1"}); err == nil {
			return fmt.Errorf("the agent of node-a labelled node-b: the policy is not in force yet")
		}
		return nil
	})

	tests := []policyCase{
		{"own node's pxn.io labels", func() error {
			return labelPatch(agentClients, "node-a", map[string]any{pxnv1alpha1.LabelCapable: "true", pxnv1alpha1.LabelRails: "8"})
		}, ""},
		{"own node's pxn.io label removed", func() error {
			return labelPatch(agentClients, "node-a", map[string]any{pxnv1alpha1.LabelRails: nil})
		}, ""},
		{"another node's pxn.io label", func() error {
			return labelPatch(agentClients, "node-b", map[string]any{pxnv1alpha1.LabelCapable: "true"})
		}, "may not change node node-b"},
		{"own node's other label", func() error {
			return labelPatch(agentClients, "node-a", map[string]any{"team": "x"})
		}, "only pxn.io/ labels"},
		{"own node's other label removed", func() error {
			return labelPatch(agentClients, "node-a", map[string]any{"kubernetes.io/hostname": nil})
		}, "only pxn.io/ labels"},
		{"own node's spec", func() error {
			_, err := agentClients.CoreV1().Nodes().Patch(ctx, "node-a", types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{})
			return err
		}, "only labels of its node"},
		{"own node's annotation", func() error {
			_, err := agentClients.CoreV1().Nodes().Patch(ctx, "node-a", types.MergePatchType, []byte(`{"metadata":{"annotations":{"a":"b"}}}`), metav1.PatchOptions{})
			return err
		}, "only labels of its node"},
		{"own PxnRailMap", func() error { return applyMap("node-a", "node-a") }, ""},
		{"own PxnRailMap's status", func() error {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": pxnv1alpha1.GroupVersion.String(), "kind": "PxnRailMap",
				"metadata": map[string]any{"name": "node-a"}, "status": map[string]any{"rails": int64(1)},
			}}
			_, err := agentDyn.Resource(pxnv1alpha1.GroupVersion.WithResource("pxnrailmaps")).ApplyStatus(ctx, "node-a", u, metav1.ApplyOptions{FieldManager: agent.FieldManager, Force: true})
			return err
		}, ""},
		{"another node's PxnRailMap", func() error { return applyMap("node-b", "node-b") }, "may write only the PxnRailMap node-a, not node-b"},
		{"own PxnRailMap naming another node", func() error { return applyMap("node-a", "node-b") }, "may write only the PxnRailMap node-a"},
		{"Event about the own node", func() error { return event(agentClients, "node-a") }, ""},
		{"Event about another node", func() error { return event(agentClients, "node-b") }, "may write Events only about it, not about node-b"},
		{"token without a node: own labels", func() error {
			return labelPatch(unbound, "node-a", map[string]any{pxnv1alpha1.LabelCapable: "false"})
		}, "name no node"},
		{"token without a node: Event", func() error { return event(unbound, "node-a") }, "name no node"},
		{"an administrator is not restricted", func() error {
			return labelPatch(e.clients, "node-b", map[string]any{"team": "x"})
		}, ""},
	}
	runPolicyCases(t, "pxn-agent-node-restriction", tests)
	if _, err := agentClients.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent got a Node by name: %v; the chart grants it list and watch only", err)
	}
}

// TestDRANodeRestrictionPolicy checks the chart's policy for the DRA driver
// on a real kube-apiserver: the driver of node-a, authenticated by a token
// bound to its pod there, may create, update and delete ResourceSlices of
// driver pxn.io for node-a and nothing else.
func TestDRANodeRestrictionPolicy(t *testing.T) {
	e := startAccessEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	driver := kubernetes.NewForConfigOrDie(e.tokenConfig(t, "dra-plugin", true)).ResourceV1().ResourceSlices()
	unbound := kubernetes.NewForConfigOrDie(e.tokenConfig(t, "dra-plugin", false)).ResourceV1().ResourceSlices()
	admin := e.clients.ResourceV1().ResourceSlices()
	slice := func(name, driverName, node string) *resourcev1.ResourceSlice {
		return &resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourcev1.ResourceSliceSpec{
				Driver: driverName, NodeName: ptrTo(node),
				Pool:    resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: []resourcev1.Device{{Name: "relay"}},
			},
		}
	}
	create := func(c resourceSlices, s *resourcev1.ResourceSlice) error {
		_, err := c.Create(ctx, s, metav1.CreateOptions{})
		return err
	}
	poll(t, ctx, func() error {
		if err := create(driver, slice("probe-b", "pxn.io", "node-b")); err == nil {
			_ = admin.Delete(ctx, "probe-b", metav1.DeleteOptions{})
			return fmt.Errorf("the driver of node-a wrote node-b's slice: the policy is not in force yet")
		}
		return nil
	})
	if err := create(admin, slice("b-slice", "pxn.io", "node-b")); err != nil {
		t.Fatalf("administrator creates node-b's slice: %v", err)
	}
	relabel := func(c resourceSlices, name string) error {
		s, err := admin.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Labels = map[string]string{"x": "y"}
		_, err = c.Update(ctx, s, metav1.UpdateOptions{})
		return err
	}
	tests := []policyCase{
		{"own node's slice", func() error { return create(driver, slice("a-slice", "pxn.io", "node-a")) }, ""},
		{"own node's slice updated", func() error { return relabel(driver, "a-slice") }, ""},
		{"another node's slice", func() error { return create(driver, slice("b-other", "pxn.io", "node-b")) }, "may write only its own node's ResourceSlices"},
		{"another driver's slice", func() error { return create(driver, slice("a-gpu", "gpu.example.com", "node-a")) }, "only ResourceSlices of driver pxn.io"},
		{"another node's slice updated", func() error { return relabel(driver, "b-slice") }, "may write only its own node's ResourceSlices"},
		{"another node's slice deleted", func() error { return driver.Delete(ctx, "b-slice", metav1.DeleteOptions{}) }, "may write only its own node's ResourceSlices"},
		{"token without a node", func() error { return create(unbound, slice("a-unbound", "pxn.io", "node-a")) }, "name no node"},
		{"own node's slice deleted", func() error { return driver.Delete(ctx, "a-slice", metav1.DeleteOptions{}) }, ""},
	}
	runPolicyCases(t, "pxn-dra-node-restriction", tests)
}

// policyCase is one request under an admission policy: do makes it;
// wantErr is empty when the policy allows it, else part of its refusal.
type policyCase struct {
	name    string
	do      func() error
	wantErr string
}

// runPolicyCases runs each case as a subtest: an allowed request must
// succeed, a refused one must fail with the named policy's message.
func runPolicyCases(t *testing.T, policy string, cases []policyCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("allowed, want refused with %q", tc.wantErr)
			case tc.wantErr != "" && (!strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), policy)):
				t.Fatalf("error %v, want the policy's refusal with %q", err, tc.wantErr)
			}
		})
	}
}

// resourceSlices is the client of ResourceSlices both tokens use.
type resourceSlices interface {
	Create(context.Context, *resourcev1.ResourceSlice, metav1.CreateOptions) (*resourcev1.ResourceSlice, error)
	Update(context.Context, *resourcev1.ResourceSlice, metav1.UpdateOptions) (*resourcev1.ResourceSlice, error)
}

func fromUnstructured(u *unstructured.Unstructured, out any) error {
	b, err := u.MarshalJSON()
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// poll retries check until it succeeds or ctx ends.
func poll(t *testing.T, ctx context.Context, check func() error) {
	t.Helper()
	var err error
	for {
		if err = check(); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("gave up: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
