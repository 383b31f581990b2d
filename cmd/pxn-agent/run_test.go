// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/internal/version"
	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/rail"
)

// parseRun runs `pxn-agent run ARGS` up to the point where the agent would
// start and returns its configuration, or stderr as the error.
func parseRun(args ...string) (*runConfig, error) {
	var got *runConfig
	var stderr bytes.Buffer
	root := newRootCommand(context.Background(), io.Discard, &stderr, func(c *runConfig) error { got = c; return nil })
	if code := cli.Execute(root, append([]string{"run"}, args...), &stderr); code != 0 {
		return nil, fmt.Errorf("exit %d: %s", code, stderr.String())
	}
	return got, nil
}

func TestRunFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "from-env")
	c, err := parseRun()
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	o := c.opts
	if o.NodeName != "from-env" || o.Resync != time.Minute || o.PollInterval != 2*time.Second ||
		o.MetricsBindAddress != ":9640" || o.HealthProbeBindAddress != ":9642" || o.AgentVersion != version.String() || c.kubeconfig != "" {
		t.Errorf("defaults: %+v kubeconfig %q", o, c.kubeconfig)
	}
	want := rail.Options{NodeRoot: "/", Strategy: rail.StrategyPCIOrder, SubnetPrefixLen: rail.DefaultSubnetPrefixLen}
	if d, ok := o.Discoverer.(agent.RailDiscoverer); !ok || d.Options.NodeRoot != want.NodeRoot ||
		d.Options.Strategy != want.Strategy || d.Options.SubnetPrefixLen != want.SubnetPrefixLen {
		t.Errorf("discoverer %#v, want rail options %+v", o.Discoverer, want)
	}

	c, err = parseRun("--node-name=n1", "--host-root=/host", "--rail-strategy=static", "--static-file=/etc/rails.json",
		"--subnet-prefix-len=16", "--resync=5s", "--kubeconfig=/kc", "--metrics-bind-address=0",
		"--health-probe-bind-address=127.0.0.1:1", "--agent-version=v9", "-v=0")
	if err != nil {
		t.Fatalf("flags: %v", err)
	}
	d := c.opts.Discoverer.(agent.RailDiscoverer)
	if c.opts.NodeName != "n1" || d.Options.NodeRoot != "/host" || d.Options.Strategy != "static" ||
		d.Options.StaticFile != "/etc/rails.json" || d.Options.SubnetPrefixLen != 16 || c.opts.Resync != 5*time.Second ||
		c.kubeconfig != "/kc" || c.opts.MetricsBindAddress != "0" || c.opts.HealthProbeBindAddress != "127.0.0.1:1" ||
		c.opts.AgentVersion != "v9" {
		t.Errorf("parsed %+v %+v kubeconfig %q", c.opts, d.Options, c.kubeconfig)
	}

	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{nil, "", "--node-name is empty"},
		{[]string{"--node-name=a", "extra"}, "", `unknown command "extra"`},
		{[]string{"--node-name=a", "--resync=0s"}, "", "must be positive"},
		{[]string{"frobnicate"}, "", `unknown command "frobnicate" for "pxn-agent"`},
		{[]string{"--no-such-flag"}, "x", "unknown flag: --no-such-flag"},
	} {
		t.Setenv("NODE_NAME", tc.env)
		var stderr bytes.Buffer
		if code := execute(context.Background(), tc.args, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("run %q: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// TestRunEnvironment: every run flag reads PXN_AGENT_<FLAG> when the command
// line does not give it; the command line wins; a bad value names the
// variable.
func TestRunEnvironment(t *testing.T) {
	t.Setenv("NODE_NAME", "env-node")
	t.Setenv("PXN_AGENT_HOST_ROOT", "/env-host")
	t.Setenv("PXN_AGENT_RAIL_STRATEGY", "subnet")
	t.Setenv("PXN_AGENT_SUBNET_PREFIX_LEN", "20")
	t.Setenv("PXN_AGENT_RESYNC", "7s")
	t.Setenv("PXN_AGENT_METRICS_BIND_ADDRESS", ":1234")
	c, err := parseRun("--resync=9s")
	if err != nil {
		t.Fatal(err)
	}
	d := c.opts.Discoverer.(agent.RailDiscoverer)
	if c.opts.NodeName != "env-node" || d.Options.NodeRoot != "/env-host" || d.Options.Strategy != "subnet" ||
		d.Options.SubnetPrefixLen != 20 || c.opts.Resync != 9*time.Second || c.opts.MetricsBindAddress != ":1234" {
		t.Errorf("parsed %+v %+v", c.opts, d.Options)
	}

	t.Setenv("PXN_AGENT_POLL_INTERVAL", "soon")
	_, err = parseRun()
	if err == nil || !strings.Contains(err.Error(), `PXN_AGENT_POLL_INTERVAL="soon" (for --poll-interval)`) {
		t.Errorf("bad variable: %v", err)
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    []string
		notWant []string
	}{
		{[]string{"--help"}, []string{"Available Commands:", "discover", "inspect", "remove-labels", "run", "version"}, nil},
		{[]string{"run", "--help"}, []string{"Flags:\n", "--rail-strategy string", "[$PXN_AGENT_RAIL_STRATEGY]", "[$NODE_NAME]",
			"Logging flags:\n", "-v, --v Level"}, []string{"PXN_AGENT_V]", "PXN_AGENT_NODE_NAME"}},
		{[]string{"discover", "-h"}, []string{"--output string", "[$PXN_AGENT_OUTPUT]", "--host-root"}, nil},
		{[]string{"--version"}, []string{"pxn-agent " + version.String() + " (revision "}, nil},
		{[]string{"version"}, []string{"pxn-agent " + version.String() + " (revision "}, nil},
	} {
		var stdout, stderr bytes.Buffer
		code := execute(context.Background(), tc.args, &stdout, &stderr)
		if code != 0 {
			t.Errorf("%q: exit %d, stderr %q", tc.args, code, stderr.String())
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("%q: stdout lacks %q:\n%s", tc.args, w, stdout.String())
			}
		}
		for _, w := range tc.notWant {
			if strings.Contains(stdout.String(), w) {
				t.Errorf("%q: stdout has %q:\n%s", tc.args, w, stdout.String())
			}
		}
		if i, j := strings.Index(stdout.String(), "Logging flags:"), strings.Index(stdout.String(), "--host-root"); i >= 0 && j > i {
			t.Errorf("%q: a tool flag is listed among the logging flags:\n%s", tc.args, stdout.String())
		}
	}
}

// TestRunPublishesAndServesEndpoints runs `pxn-agent run` in-process against
// a real API server, with the flags a DaemonSet would pass.
func TestRunPublishesAndServesEndpoints(t *testing.T) {
	env := &envtest.Environment{
		BinaryAssetsDirectory: testtools.EnvtestAssets(t),
		CRDDirectoryPaths:     []string{filepath.Join(testtools.RepoRoot(), "config", "crd")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	_ = pxnv1alpha1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "run-node"}}
	if err := c.Create(ctx, node); err != nil {
		t.Fatal(err)
	}

	metricsAddr, healthAddr := freeAddr(t), freeAddr(t)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	exit := make(chan int, 1)
	go func() {
		exit <- execute(runCtx, []string{
			"run",
			"--node-name=" + node.Name,
			"--kubeconfig=" + kubeconfig,
			"--host-root=" + filepath.Join(testtools.RepoRoot(), "pkg", "rail", "testdata", "sysfs", "hgx-8gpu"),
			"--resync=1s",
			"--metrics-bind-address=" + metricsAddr,
			"--health-probe-bind-address=" + healthAddr,
			"--agent-version=v0.0.0-test",
		}, io.Discard, io.Discard)
	}()

	waitHTTP(t, "http://"+healthAddr+"/readyz", "ok")
	waitHTTP(t, "http://"+healthAddr+"/healthz", "ok")
	m := &pxnv1alpha1.PxnRailMap{}
	if err := c.Get(ctx, types.NamespacedName{Name: node.Name}, m); err != nil {
		t.Fatalf("ready, but no PxnRailMap: %v", err)
	}
	if m.Status.Rails != 8 || m.Status.AgentVersion != "v0.0.0-test" || len(m.OwnerReferences) != 1 || m.OwnerReferences[0].UID != node.UID {
		t.Errorf("map: rails %d agentVersion %q owners %+v", m.Status.Rails, m.Status.AgentVersion, m.OwnerReferences)
	}
	for _, series := range []string{
		"pxn_agent_discoveries_total ",
		`pxn_agent_publishes_total{target="status"} `,
		`pxn_agent_errors_total{op="publish"} 0`,
		"pxn_agent_rails 8",
		`pxn_build_info{goversion="` + goruntime.Version() + `",revision=`,
		`controller_runtime_reconcile_total{controller="pxn-agent",result="success"}`,
		`pxn_agent_rail_map_condition{condition="Ready",node="run-node"} 1`,
		`pxn_agent_rail_map_condition{condition="Consistent",node="run-node"} 1`,
	} {
		waitHTTP(t, "http://"+metricsAddr+"/metrics", series)
	}

	// verify-node reads the map the agent published through the API
	// server; a process standing in for pxn-bench writes the rows.
	bench := filepath.Join(t.TempDir(), "bench")
	rows := `for a; do case $a in --json=*) out=${a#--json=};; esac; done
echo '[{"bytes":33554432,"relayed_bytes":33554432,"failed_tasks":0,"verified":true}]' >"$out"
`
	if err := os.WriteFile(bench, []byte("#!/bin/sh\n"+rows), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		node string
		code int
		line string
	}{
		{node.Name, 0, "pxn node run-node: PASS: rail map Ready and Consistent (8 rails); cross-rail write of 32 MiB relayed 32 MiB and arrived verified\n"},
		{"other-node", 1, "pxn node other-node: FAIL: PxnRailMap other-node: pxnrailmaps.pxn.io \"other-node\" not found\n"},
	} {
		var out bytes.Buffer
		code := execute(ctx, []string{"verify-node", "--node=" + tc.node, "--kubeconfig=" + kubeconfig, "--bench=" + bench}, &out, io.Discard)
		if code != tc.code || out.String() != tc.line {
			t.Errorf("verify-node --node=%s: exit %d, %q; want %d, %q", tc.node, code, out.String(), tc.code, tc.line)
		}
	}

	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("run exited %d after cancel, want 0", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitHTTP polls url until it answers 200 with a body containing want.
func waitHTTP(t *testing.T, url, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), want) {
				return
			}
			last = fmt.Sprintf("%d: %.300s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s never answered 200 with %q; last: %s", url, want, last)
}
