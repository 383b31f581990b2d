// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/rail"
)

// One kube-apiserver and etcd for the whole package, started by the first
// test that needs them and stopped by TestMain.
var shared struct {
	once       sync.Once
	err        error
	env        *envtest.Environment
	dir        string
	cfg        *rest.Config
	kubeconfig string
}

// agentSettle bounds the waits for what the agent does at its next
// discovery, poll or resync and the API server shows next: a fraction of a
// second on a quiet machine; the rest is for a loaded 2-core machine under
// -race, with the API server and etcd on the same cores.
const agentSettle = 30 * time.Second

func TestMain(m *testing.M) {
	if os.Getenv(rankRoleEnv) != "" {
		os.Exit(runRankRole())
	}
	ctrllog.SetLogger(klog.NewKlogr())
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop envtest: %v\n", err)
		}
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// controlPlane returns an admin config for the shared API server, starting it
// the first time.
func controlPlane(t *testing.T) *rest.Config {
	t.Helper()
	assets := testtools.EnvtestAssets(t)
	shared.once.Do(func() {
		dir, err := os.MkdirTemp("", "pxn-agent-envtest-")
		if err != nil {
			shared.err = err
			return
		}
		shared.dir = dir
		certs := filepath.Join(dir, "apiserver")
		if err := os.Mkdir(certs, 0o700); err != nil {
			shared.err = err
			return
		}
		env := &envtest.Environment{
			BinaryAssetsDirectory: assets,
			CRDDirectoryPaths:     []string{filepath.Join(testtools.RepoRoot(), "config", "crd")},
			ErrorIfCRDPathMissing: true,
		}
		// A fixed certificate folder keeps the serving certificate across an
		// API server restart, so clients keep trusting it.
		env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certs}
		// Without a watch grace period a stopping API server waits for open
		// watches until its request timeout.
		env.ControlPlane.APIServer.Configure().Set("shutdown-watch-termination-grace-period", "2s")
		cfg, err := env.Start()
		if err != nil {
			shared.err = fmt.Errorf("start envtest: %w", err)
			return
		}
		shared.env, shared.cfg = env, cfg
		shared.kubeconfig = filepath.Join(dir, "kubeconfig")
		shared.err = os.WriteFile(shared.kubeconfig, env.KubeConfig, 0o600)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return rest.CopyConfig(shared.cfg)
}

func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := pxnv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createNode creates a Node and removes it and its PxnRailMap at the end of
// the test (envtest runs no garbage collector).
func createNode(t *testing.T, c client.Client, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(context.Background(), n); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, o := range []client.Object{&corev1.Node{}, &pxnv1alpha1.PxnRailMap{}} {
			o.SetName(name)
			if err := c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %T %s: %v", o, name, err)
			}
		}
	})
	return n
}

// testAgent is an agent running in-process on a goroutine.
type testAgent struct {
	registry *prometheus.Registry
	stop     func()
}

// startAgent runs agent.Run until the test ends; the test fails if Run
// returns an error.
func startAgent(t *testing.T, cfg *rest.Config, opts agent.Options) *testAgent {
	t.Helper()
	a := &testAgent{registry: prometheus.NewRegistry()}
	opts.Registerer = a.registry
	if opts.AgentVersion == "" {
		opts.AgentVersion = "test"
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg, opts) }()
	var once sync.Once
	a.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("agent for %s: %v", opts.NodeName, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("agent for %s did not stop", opts.NodeName)
			}
		})
	}
	t.Cleanup(a.stop)
	return a
}

// metric returns the value of a counter or gauge of the agent, 0 when the
// series does not exist yet.
func (a *testAgent) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return gathered(t, a.registry, name, labels...)
}

func gathered(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabels(m, labels) {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == kv[i] && l.GetValue() == kv[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// eventually polls check until it returns nil or the timeout passes, then
// fails with check's last error.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func getMap(c client.Client, name string) (*pxnv1alpha1.PxnRailMap, error) {
	m := &pxnv1alpha1.PxnRailMap{}
	err := c.Get(context.Background(), types.NamespacedName{Name: name}, m)
	return m, err
}

// mapCondition waits for the map's condition to reach status and returns it.
func mapCondition(t *testing.T, c client.Client, name, condType string, status metav1.ConditionStatus, timeout time.Duration) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	eventually(t, timeout, func() error {
		m, err := getMap(c, name)
		if err != nil {
			return err
		}
		cond := meta.FindStatusCondition(m.Status.Conditions, condType)
		if cond == nil {
			return fmt.Errorf("PxnRailMap %s has no %s condition: %+v", name, condType, m.Status.Conditions)
		}
		if cond.Status != status {
			return fmt.Errorf("PxnRailMap %s: %s is %s (%s: %s), want %s", name, condType, cond.Status, cond.Reason, cond.Message, status)
		}
		got = *cond
		return nil
	})
	return got
}

// railAgent returns agent options that discover from a fixture host root.
func railAgent(node, nodeRoot string, resync, poll time.Duration) agent.Options {
	return agent.Options{
		NodeName:     node,
		Discoverer:   agent.RailDiscoverer{Options: rail.Options{NodeRoot: nodeRoot}},
		Resync:       resync,
		PollInterval: poll,
		MinBackoff:   100 * time.Millisecond,
		MaxBackoff:   2 * time.Second,
	}
}

func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	bin := testtools.Require(t, "kubectl")
	cmd := exec.Command(bin, append([]string{"--kubeconfig", shared.kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// requestCounter counts API requests by verb and resource.
type requestCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *requestCounter) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	c.counts = map[string]int{}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			c.mu.Lock()
			c.counts[classify(req)]++
			c.mu.Unlock()
			return rt.RoundTrip(req)
		})
	}
	return cfg
}

func (c *requestCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// classify names a request "VERB resource[/subresource]" with the verbs of
// RBAC: list and watch are told from get by the URL.
func classify(req *http.Request) string {
	segs := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		segs = segs[2:]
	case len(segs) >= 3 && segs[0] == "apis":
		segs = segs[3:]
	default:
		return "discovery " + req.URL.Path
	}
	if len(segs) > 2 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	if len(segs) == 0 {
		return "discovery " + req.URL.Path
	}
	resource := segs[0]
	if len(segs) == 3 {
		resource += "/" + segs[2]
	}
	verb := strings.ToLower(req.Method)
	switch {
	case req.Method == http.MethodGet && (req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1"):
		verb = "watch"
	case req.Method == http.MethodGet && len(segs) == 1:
		verb = "list"
	case req.Method == http.MethodGet:
		verb = "get"
	case req.Method == http.MethodPatch && req.Header.Get("Content-Type") == "application/apply-patch+yaml":
		verb = "apply"
	}
	return verb + " " + resource
}

func diffCounts(before, after map[string]int) map[string]int {
	d := map[string]int{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}
