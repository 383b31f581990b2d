// SPDX-License-Identifier: Apache-2.0

// Package e2e runs PXN on a real single-node Kubernetes cluster on this
// machine: hack/local-cluster.sh starts etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, a kubelet and containerd; the test
// installs charts/pxn with helm and checks, through the cluster, what a user
// of the chart relies on. See docs/local-cluster.md.
//
// It needs root and Debian's runc, CNI plugins and prometheus (the cluster
// group of hack/host-packages.sh, which make test installs); it skips, with the
// reason, when not root, when those packages are missing and this machine
// cannot install them (no apt-get), or when containerd cannot start or run a
// container here. Tools, containerd and ctr among them, come from
// hack/tools.sh (missing ones skip, or fail under PXN_REQUIRE_TOOLS=1 like
// every other test that needs a tool).
//
//	PXN_E2E_CLUSTER_DIR=DIR  use the cluster already up in DIR; leave it up
//	PXN_E2E_STATE_DIR=DIR    state folder of the test's own cluster (default /var/tmp/pxn-e2e)
//	PXN_E2E_KEEP=1           leave the test's own cluster up at the end
//	PXN_E2E_TIMEOUT=25m      bound on the whole suite
package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/contract"
)

const (
	release   = "pxn"
	namespace = "pxn-system"
	resource  = "pxn.io/relay"
	// From hack/e2e/values.yaml.
	devices          = "8"
	groupID          = "e2e"
	registryRoot     = "/run/pxn"
	probeImage       = "pxn-e2e-probe:local"
	groupLabel       = "pxn.io/group"
	gcWait           = 90 * time.Second // gcGrace 5s + gcInterval 2s + pod termination, with room
	podStartTimeout  = 3 * time.Minute
	rankPodRun       = 3 * time.Minute // a probe rank's own bound on each wait
	defaultSuiteTime = 25 * time.Minute
	// upLimit bounds hack/local-cluster.sh up (and images): it builds the
	// images' binaries, and on a fresh two-core machine with an empty Go
	// build cache, beside the other packages' tests, that took more than
	// the 6 minutes this bound once was (killed at 6 min in a fresh-clone
	// CI run); a warm cache brings the cluster up in about a minute.
	upLimit = 14 * time.Minute
	// coldBuild bounds one go build or go run of the suite's own tools,
	// for the same reason: an empty build cache on two busy cores.
	coldBuild = 7 * time.Minute
)

func TestLocalCluster(t *testing.T) {
	trackInputs(t, testtools.RepoRoot())
	requireHost(t)
	limit := defaultSuiteTime
	if v := os.Getenv("PXN_E2E_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("PXN_E2E_TIMEOUT=%q: %v", v, err)
		}
		limit = d
	}
	if dl, ok := t.Deadline(); ok && time.Until(dl)-30*time.Second < limit {
		limit = time.Until(dl) - 30*time.Second // leave time for the tear-down
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	suiteStart := time.Now()

	c := startCluster(t, ctx)
	steps := []struct {
		name string
		fn   func(*cluster)
	}{
		{"ProbeImage", (*cluster).importProbeImage},
		{"HelmInstall", (*cluster).helmInstall},
		{"PxnRailMap", (*cluster).checkRailMap},
		{"NodeCapacity", (*cluster).checkCapacity},
		{"Workloads", (*cluster).checkWorkloads},
		{"MultiPodGroup", (*cluster).checkMultiPodGroup},
		{"KubeletRestart", (*cluster).checkKubeletRestart},
		{"Metrics", (*cluster).checkMetrics},
		{"Alerts", (*cluster).checkAlerts},
		{"NodeVerdict", (*cluster).checkNodeVerdict},
		{"DRASlice", (*cluster).checkDRASlice},
		{"DRAClaims", (*cluster).checkDRAClaims},
		{"DRARankPair", (*cluster).checkDRARankPair},
		{"DRARankMetrics", (*cluster).checkDRARankMetrics},
		{"DRARestarts", (*cluster).checkDRARestarts},
		{"DRAAdminAccess", (*cluster).checkDRAAdminAccess},
		{"DRABadClaims", (*cluster).checkDRABadClaims},
		{"DRARails", (*cluster).checkDRARails},
		{"DRACleanup", (*cluster).checkDRACleanup},
		{"GarbageCollection", (*cluster).checkGarbageCollection},
	}
	for _, s := range steps {
		start := time.Now()
		ok := t.Run(s.name, func(t *testing.T) {
			sub := *c
			sub.t = t
			s.fn(&sub)
		})
		t.Logf("step %s: %.1f s", s.name, time.Since(start).Seconds())
		if !ok {
			// Now, while the failed step's objects are still there.
			c.diagnostics()
			t.FailNow()
		}
	}
	t.Logf("suite (without tear-down): %.1f s", time.Since(suiteStart).Seconds())
}

// importProbeImage builds the workload image (hack/e2e/probe, static) and
// imports it into the cluster's containerd.
func (c *cluster) importProbeImage() {
	dir := c.t.TempDir()
	bin := filepath.Join(dir, "probe")
	if out, err := c.runEnv(coldBuild, []string{"CGO_ENABLED=0"}, "go", "build", "-trimpath", "-o", bin, "./hack/e2e/probe"); err != nil {
		c.t.Fatalf("build probe: %v\n%s", err, out)
	}
	tar := filepath.Join(dir, "probe.tar")
	if out, err := c.run(coldBuild, "go", "run", "./hack/image", "-o", tar, "-name", probeImage,
		"-add", bin+":/probe:0755", "-entrypoint", "/probe", "-cmd", "sleep"); err != nil {
		c.t.Fatalf("pack probe image: %v\n%s", err, out)
	}
	if out, err := c.run(time.Minute, c.ctr, "--address", filepath.Join(c.dir, "containerd", "containerd.sock"),
		"-n", "k8s.io", "images", "import", tar); err != nil {
		c.t.Fatalf("import probe image: %v\n%s", err, out)
	}
}

func (c *cluster) runEnv(timeout time.Duration, env []string, name string, args ...string) (string, error) {
	saved := c.helmEnv
	c.helmEnv = append(append([]string{}, saved...), env...)
	defer func() { c.helmEnv = saved }()
	return c.run(timeout, name, args...)
}

// helmInstall installs the chart and waits for the agent, the device plugin
// and the DRA driver to be Running and Ready.
func (c *cluster) helmInstall() {
	t := c.t
	args := []string{"install", release, filepath.Join(c.repo, "charts", "pxn"),
		"--namespace", namespace, "--create-namespace",
		"--kubeconfig", c.kubeconfig(),
		"-f", filepath.Join(c.repo, "hack", "e2e", "values.yaml"),
		"-f", filepath.Join(c.dir, "helm-values.yaml")}
	if _, err := c.kc("get", "namespace", namespace); err != nil {
		c.st.createdNamespace = true
	}
	if c.reuse {
		if _, err := c.run(time.Minute, c.helm, "status", release, "-n", namespace, "--kubeconfig", c.kubeconfig()); err == nil {
			t.Fatalf("release %s is already installed in namespace %s of the cluster in %s: the suite needs the node's only device plugin; "+
				"remove it first (helm uninstall %s -n %s)", release, namespace, c.dir, release, namespace)
		}
	}
	out, err := c.run(2*time.Minute, c.helm, args...)
	if err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	// A failed run must not leave the release behind on a reused cluster
	// (the suite's cleanup runs after the diagnostics).
	c.root.Cleanup(func() {
		if c.root.Failed() && c.reuse {
			_, _ = c.detached().run(2*time.Minute, c.helm, "uninstall", release, "-n", namespace, "--kubeconfig", c.kubeconfig(), "--wait")
		}
	})
	t.Logf("helm install:\n%s", lastLines(out, 8))
	c.poll("agent, device plugin and DRA driver pods Running and Ready", podStartTimeout, func() (bool, string) {
		var pods podList
		if err := c.getJSON(&pods, "pods", "-n", namespace); err != nil {
			return false, err.Error()
		}
		var states []string
		ready := map[string]bool{}
		for _, p := range pods.Items {
			states = append(states, p.summary())
			comp := p.Metadata.Labels["app.kubernetes.io/component"]
			if p.ready() {
				ready[comp] = true
			}
		}
		return ready["agent"] && ready["device-plugin"] && ready["dra-plugin"], strings.Join(states, "; ")
	})
	t.Logf("kubectl get pods -n %s:\n%s", namespace, c.mustKC("get", "pods", "-n", namespace, "-o", "wide"))
}

// pxnRailMap is the part of a PxnRailMap the test reads.
type pxnRailMap struct {
	Metadata objectMeta `json:"metadata"`
	Status   struct {
		Rails      int               `json:"rails"`
		GPUCount   int               `json:"gpuCount"`
		HCACount   int               `json:"hcaCount"`
		RailMap    map[string]string `json:"railMap"`
		Conditions []condition       `json:"conditions"`
		GPUs       []struct {
			Index int    `json:"index"`
			HCA   string `json:"hca"`
			Rail  string `json:"rail"`
		} `json:"gpus"`
	} `json:"status"`
}

func (m pxnRailMap) condition(typ string) condition {
	for _, c := range m.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return condition{}
}

// checkRailMap waits for the agent's PxnRailMap of the node: the bundled
// 8-GPU fixture's GPUs, HCAs and rails, Ready.
func (c *cluster) checkRailMap() {
	t := c.t
	var m pxnRailMap
	c.poll("PxnRailMap "+c.node+" Ready with the fixture's rails", 2*time.Minute, func() (bool, string) {
		m = pxnRailMap{}
		if err := c.getJSON(&m, "pxnrailmaps", c.node); err != nil {
			return false, err.Error()
		}
		ready := m.condition("Ready")
		return ready.Status == "True" && m.Status.Rails > 0 && len(m.Status.RailMap) > 0,
			fmt.Sprintf("rails=%d gpus=%d hcas=%d railMap=%v Ready=%s (%s: %s)", m.Status.Rails, m.Status.GPUCount,
				m.Status.HCACount, m.Status.RailMap, ready.Status, ready.Reason, ready.Message)
	})
	table := c.mustKC("get", "pxnrailmaps")
	t.Logf("kubectl get pxnrailmaps:\n%s", table)
	if cols := tableColumns(table, c.node); cols == nil {
		t.Errorf("kubectl get pxnrailmaps does not list node %s", c.node)
	} else if cols["READY"] != "True" || cols["CONSISTENT"] != "True" {
		t.Errorf("kubectl get pxnrailmaps: READY %q CONSISTENT %q for %s, want True and True", cols["READY"], cols["CONSISTENT"], c.node)
	}
	c.checkEvents()
	if m.Status.GPUCount != 8 || len(m.Status.GPUs) != 8 {
		t.Errorf("PxnRailMap: %d GPUs (gpuCount %d), want the fixture's 8", len(m.Status.GPUs), m.Status.GPUCount)
	}
	if m.Status.HCACount < 8 {
		t.Errorf("PxnRailMap: hcaCount %d, want at least the fixture's 8 rail HCAs", m.Status.HCACount)
	}
	if m.Status.Rails != 8 {
		t.Errorf("PxnRailMap: %d rails, want 8 (one per GPU's HCA in hgx-8gpu)", m.Status.Rails)
	}
	if cons := m.condition("Consistent"); cons.Status != "True" {
		t.Errorf("PxnRailMap Consistent=%q (%s: %s), want True", cons.Status, cons.Reason, cons.Message)
	}
	nodeLabels := c.mustKC("get", "node", c.node, "-o", "jsonpath={.metadata.labels}")
	if !strings.Contains(nodeLabels, `"pxn.io/capable"`) {
		t.Errorf("node %s is not labelled pxn.io/capable: %s", c.node, nodeLabels)
	}
}

// tableColumns returns the row of a kubectl table whose first column is
// name, by column header; nil when there is none.
func tableColumns(table, name string) map[string]string {
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) < 2 {
		return nil
	}
	header := strings.Fields(lines[0])
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != len(header) || f[0] != name {
			continue
		}
		row := map[string]string{}
		for i, h := range header {
			row[h] = f[i]
		}
		return row
	}
	return nil
}

// checkEvents waits for the agent's Events of the first publish, on the
// node's PxnRailMap and on the Node, and checks that the node-restriction
// policy it published under is installed.
func (c *cluster) checkEvents() {
	t := c.t
	type eventList struct {
		Items []struct {
			Reason              string `json:"reason"`
			Type                string `json:"type"`
			Note                string `json:"note"`
			ReportingController string `json:"reportingController"`
			Regarding           struct {
				Kind string `json:"kind"`
				Name string `json:"name"`
			} `json:"regarding"`
		} `json:"items"`
	}
	c.poll("the agent's PortsActive Events on the PxnRailMap and the Node", time.Minute, func() (bool, string) {
		var l eventList
		if err := c.getJSON(&l, "events.v1.events.k8s.io", "-n", "default"); err != nil {
			return false, err.Error()
		}
		seen := map[string]bool{}
		var all []string
		for _, e := range l.Items {
			all = append(all, e.Regarding.Kind+"/"+e.Regarding.Name+" "+e.Type+" "+e.Reason)
			if e.ReportingController == "pxn.io/agent" && e.Regarding.Name == c.node && e.Reason == "PortsActive" && e.Type == "Normal" &&
				strings.HasPrefix(e.Note, "Ready is True") {
				seen[e.Regarding.Kind] = true
			}
		}
		return seen["PxnRailMap"] && seen["Node"], fmt.Sprintf("Events in default: %v", all)
	})
	t.Logf("kubectl get events -n default:\n%s", c.mustKC("get", "events", "-n", "default"))
	if _, err := c.kc("get", "validatingadmissionpolicy", "pxn-agent-node-restriction"); err != nil {
		t.Errorf("the chart's node-restriction ValidatingAdmissionPolicy is not installed: %v", err)
	}
}

// relayCount returns the node's capacity and allocatable of pxn.io/relay.
func (c *cluster) relayCount() (capacity, allocatable string, err error) {
	var n node
	if err := c.getJSON(&n, "node", c.node); err != nil {
		return "", "", err
	}
	return n.Status.Capacity[resource], n.Status.Allocatable[resource], nil
}

func (c *cluster) waitRelayCapacity(what string) {
	c.poll(what, 2*time.Minute, func() (bool, string) {
		capacity, alloc, err := c.relayCount()
		if err != nil {
			return false, err.Error()
		}
		return capacity == devices && alloc == devices, fmt.Sprintf("capacity %s=%q allocatable %q, want %s", resource, capacity, alloc, devices)
	})
}

func (c *cluster) checkCapacity() {
	c.waitRelayCapacity("node capacity and allocatable " + resource + "=" + devices)
	c.t.Logf("node %s allocatable: %s", c.node, c.mustKC("get", "node", c.node, "-o", "jsonpath={.status.allocatable}"))
}

// probePod is a pod of the probe image that sleeps, a member of the group
// holder names.
func probePod(ns, name string, holder relayHolder) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s%s
spec:
  terminationGracePeriodSeconds: 2%s
  containers:
    - name: probe
      image: %s
      imagePullPolicy: Never
      command: ["/probe", "sleep"]
      resources:%s
`, name, ns, holder.labels(), holder.podClaims(), probeImage, holder.resources())
}

type workload struct {
	ns, name string
	relayHolder
}

var (
	nsA = "pxn-e2e-a"
	nsB = "pxn-e2e-b"
	// a1 and a2 are one job; c1 is another job of the same namespace; b1
	// has a1's group label in another namespace.
	a1 = workload{nsA, "a1", relayHolder{group: "job1"}}
	a2 = workload{nsA, "a2", relayHolder{group: "job1"}}
	c1 = workload{nsA, "c1", relayHolder{group: "job2"}}
	b1 = workload{nsB, "b1", relayHolder{group: "job1"}}
	// a3 joins job1 after the kubelet restart.
	a3 = workload{nsA, "a3", relayHolder{group: "job1"}}
)

func (c *cluster) startWorkloads(ws ...workload) {
	var manifest []string
	for _, w := range ws {
		manifest = append(manifest, probePod(w.ns, w.name, w.relayHolder))
	}
	c.apply(strings.Join(manifest, "---\n"))
	c.poll(fmt.Sprintf("%d workload pods Running", len(ws)), podStartTimeout, func() (bool, string) {
		var states []string
		done := true
		for _, w := range ws {
			var p pod
			if err := c.getJSON(&p, "pod", "-n", w.ns, w.name); err != nil {
				return false, err.Error()
			}
			states = append(states, p.summary())
			done = done && p.Status.Phase == "Running"
		}
		return done, strings.Join(states, "; ")
	})
}

// groupKey is a node plugin's group folder name (docs/device-plugin.md):
// the first 16 hex digits of the HMAC-SHA-256, under the plugin's node
// secret (the file group-key-secret in its state folder, stateDir under
// the cluster's folder), of namespace, source and identity, each preceded
// by its length as 8 big-endian bytes.
func (c *cluster) groupKey(stateDir, namespace, source, identity string) string {
	c.t.Helper()
	secret, err := os.ReadFile(filepath.Join(c.dir, stateDir, "group-key-secret"))
	if err != nil {
		c.t.Fatalf("the plugin's node secret: %v", err)
	}
	h := hmac.New(sha256.New, secret)
	for _, f := range []string{namespace, source, identity} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// pluginKey is the device plugin's group folder name; draKey the DRA
// driver's.
func (c *cluster) pluginKey(namespace, source, identity string) string {
	return c.groupKey("pxn-state", namespace, source, identity)
}

func (c *cluster) draKey(namespace, source, identity string) string {
	return c.groupKey("pxn-dra-state", namespace, source, identity)
}

func (c *cluster) groupsDir() string { return filepath.Join(c.shmDir, "groups") }

func (c *cluster) listDir(ns, pod string) []string {
	c.t.Helper()
	out, err := c.exec(ns, pod, "ls", registryRoot)
	if err != nil {
		c.t.Fatalf("%s/%s: ls %s: %v", ns, pod, registryRoot, err)
	}
	return strings.Fields(out)
}

// checkWorkloads starts pods that request the relay and checks what each
// container gets: the engine's environment from the device plugin, a
// writable registry root shared with its job and with nobody else.
func (c *cluster) checkWorkloads() {
	t := c.t
	var m pxnRailMap
	if err := c.getJSON(&m, "pxnrailmaps", c.node); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{nsA, nsB} {
		c.mustKC("create", "namespace", ns)
	}
	c.root.Cleanup(func() {
		if c.root.Failed() && c.reuse {
			_, _ = c.detached().kc("delete", "namespace", nsA, nsB, "--ignore-not-found", "--wait=false")
		}
	})
	start := time.Now()
	c.startWorkloads(a1, a2, c1, b1)
	t.Logf("4 pods with %s started in %.1f s", resource, time.Since(start).Seconds())

	for _, w := range []workload{a1, a2, c1, b1} {
		env := c.checkMember(w, m.Status.RailMap)
		if w == a1 {
			t.Logf("%s/%s environment:\n%s", w.ns, w.name, env)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	want := map[workload][]string{
		a1: {"a1.txt", "a2.txt"},
		a2: {"a1.txt", "a2.txt"},
		c1: {"c1.txt"},
		b1: {"b1.txt"},
	}
	for w, files := range want {
		if got := c.listDir(w.ns, w.name); !reflect.DeepEqual(got, files) {
			t.Errorf("%s/%s (group %s) sees %v in %s, want %v", w.ns, w.name, w.group, got, registryRoot, files)
		}
	}
	if out, err := c.exec(a2.ns, a2.name, "cat", filepath.Join(registryRoot, "a1.txt")); err != nil || out != "from pxn-e2e-a/a1" {
		t.Errorf("a2 reads a1's file: %q, %v", out, err)
	}

	// The host side: one folder per (namespace, group label).
	wantDirs := map[string][]string{
		c.pluginKey(nsA, "label", "job1"): {"a1.txt", "a2.txt"},
		c.pluginKey(nsA, "label", "job2"): {"c1.txt"},
		c.pluginKey(nsB, "label", "job1"): {"b1.txt"},
	}
	entries, err := os.ReadDir(c.groupsDir())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	var wantKeys []string
	for k, files := range wantDirs {
		wantKeys = append(wantKeys, k)
		names, err := os.ReadDir(filepath.Join(c.groupsDir(), k))
		if err != nil {
			t.Errorf("group folder %s: %v", k, err)
			continue
		}
		var have []string
		for _, n := range names {
			have = append(have, n.Name())
		}
		if !reflect.DeepEqual(have, files) {
			t.Errorf("host group folder %s holds %v, want %v", k, have, files)
		}
	}
	sort.Strings(wantKeys)
	if !reflect.DeepEqual(got, wantKeys) {
		t.Errorf("host %s holds %v, want the folders %v", c.groupsDir(), got, wantKeys)
	}
	t.Logf("group folders on the host (%s): %v", c.groupsDir(), got)
}

// checkMember checks what a member container of a group gets: the engine's
// environment (the node's rail map railMap), a writable registry root, into
// which it writes <name>.txt for the others to see. It returns the
// container's environment as env prints it.
func (c *cluster) checkMember(w workload, railMap map[string]string) string {
	t := c.t
	out, err := c.exec(w.ns, w.name, "env")
	if err != nil {
		t.Fatalf("%s/%s: %v", w.ns, w.name, err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	for k, want := range map[string]string{contract.EnvEnable: "1", contract.EnvGroupID: groupID, contract.EnvRegistryRoot: registryRoot} {
		if env[k] != want {
			t.Errorf("%s/%s: %s=%q, want %q", w.ns, w.name, k, env[k], want)
		}
	}
	var rm map[string]string
	if err := json.Unmarshal([]byte(env[contract.EnvRailMap]), &rm); err != nil {
		t.Errorf("%s/%s: %s=%q: %v", w.ns, w.name, contract.EnvRailMap, env[contract.EnvRailMap], err)
	} else if !reflect.DeepEqual(rm, railMap) {
		t.Errorf("%s/%s: %s=%v, the node's PxnRailMap says %v", w.ns, w.name, contract.EnvRailMap, rm, railMap)
	}
	if out, err := c.exec(w.ns, w.name, "writable", registryRoot); err != nil || strings.TrimSpace(out) != "writable" {
		t.Errorf("%s/%s: registry root %s not writable: %v %s", w.ns, w.name, registryRoot, err, out)
	}
	if _, err := c.exec(w.ns, w.name, "write", filepath.Join(registryRoot, w.name+".txt"), "from "+w.ns+"/"+w.name); err != nil {
		t.Errorf("%s/%s: write: %v", w.ns, w.name, err)
	}
	return out
}

// rankPod is a pod of one rank of a group that spans two pods
// (hack/e2e/probe rank): neither shares the host's PID namespace, nor each
// other's. holder is what makes the pod a member of its group: the
// pxn.io/relay resource with a group label, or a ResourceClaim.
func rankPod(ns, name string, index int, hca, peerHCA string, holder relayHolder) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s%s
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  hostPID: false
  shareProcessNamespace: false%s
  containers:
    - name: rank
      image: %s
      imagePullPolicy: Never
      command: ["/probe", "rank", "%d", "%s", "%s"]
      env:
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
      resources:%s
`, name, ns, holder.labels(), holder.podClaims(), probeImage, index, hca, peerHCA, holder.resources())
}

// relayHolder makes a pod a member of a group: through the device plugin
// (group: the pxn.io/group label, with pxn.io/relay requested) or through
// the DRA driver (claim: a ResourceClaim's name; template: a
// ResourceClaimTemplate's, a claim of the pod's own).
type relayHolder struct{ group, claim, template string }

func (h relayHolder) labels() string {
	if h.group == "" {
		return ""
	}
	return fmt.Sprintf("\n  labels:\n    %s: %s", groupLabel, h.group)
}

func (h relayHolder) podClaims() string {
	switch {
	case h.claim != "":
		return "\n  resourceClaims:\n    - name: relay\n      resourceClaimName: " + h.claim
	case h.template != "":
		return "\n  resourceClaims:\n    - name: relay\n      resourceClaimTemplateName: " + h.template
	}
	return ""
}

func (h relayHolder) resources() string {
	if h.claim != "" || h.template != "" {
		return "\n        claims:\n          - name: relay"
	}
	return fmt.Sprintf("\n        limits:\n          %s: 1", resource)
}

// rankResult is what a probe rank reports (hack/e2e/probe/rank.go).
type rankResult struct {
	PidNS          string            `json:"pid_ns"`
	PXN            bool              `json:"pxn"`
	RelayedPieces  uint64            `json:"relayed_pieces"`
	FallbackPieces uint64            `json:"fallback_pieces"`
	FailedPieces   uint64            `json:"failed_pieces"`
	ArenasByFD     uint64            `json:"arenas_by_fd"`
	ArenasByHandle uint64            `json:"arenas_by_handle"`
	Verified       uint64            `json:"verified"`
	Ranks          map[string]string `json:"ranks"`
	Err            string            `json:"err"`
}

// checkMultiPodGroup runs the two ranks of job3 in two pods through the
// device plugin (see runRankPair).
func (c *cluster) checkMultiPodGroup() {
	c.runRankPair(nsA, []string{"rank0", "rank1"}, relayHolder{group: "job3"})
}

// runRankPair runs the two ranks of one group in two pods of namespace ns,
// neither with hostPID, the second started once the first runs: each relays
// its writes through the other (the host path), both arenas mapped by
// descriptor, every byte checked at its target, nothing sent direct, and
// each sees the other's registration live, judged by heartbeat. The pods are
// deleted at the end.
func (c *cluster) runRankPair(ns string, names []string, holder relayHolder) {
	t := c.t
	var m pxnRailMap
	if err := c.getJSON(&m, "pxnrailmaps", c.node); err != nil {
		t.Fatal(err)
	}
	var hcas []string
	for h := range m.Status.RailMap {
		hcas = append(hcas, h)
	}
	sort.Strings(hcas)
	var pair []string
	for _, h := range hcas {
		if len(pair) == 0 || m.Status.RailMap[h] != m.Status.RailMap[pair[0]] {
			pair = append(pair, h)
		}
		if len(pair) == 2 {
			break
		}
	}
	if len(pair) != 2 {
		t.Fatalf("the node's rail map %v has no two HCAs on two rails", m.Status.RailMap)
	}
	c.root.Cleanup(func() {
		if c.root.Failed() && c.reuse {
			_, _ = c.detached().kc("delete", "pod", "-n", ns, names[0], names[1], "--ignore-not-found", "--wait=false")
		}
	})
	for i, name := range names {
		c.apply(rankPod(ns, name, i, pair[i], pair[1-i], holder))
		if i == 0 {
			c.poll(name+" Running", podStartTimeout, func() (bool, string) {
				var p pod
				if err := c.getJSON(&p, "pod", "-n", ns, name); err != nil {
					return false, err.Error()
				}
				return p.Status.Phase == "Running" || p.Status.Phase == "Succeeded", p.summary()
			})
		}
	}
	results := map[string]rankResult{}
	c.poll("both rank pods done", podStartTimeout+rankPodRun, func() (bool, string) {
		var states []string
		done := true
		for _, name := range names {
			var p pod
			if err := c.getJSON(&p, "pod", "-n", ns, name); err != nil {
				return false, err.Error()
			}
			states = append(states, p.summary())
			switch p.Status.Phase {
			case "Succeeded", "Failed":
			default:
				done = false
			}
		}
		return done, strings.Join(states, "; ")
	})
	for _, name := range names {
		out, err := c.kc("logs", "-n", ns, name)
		if err != nil {
			t.Fatalf("logs of %s: %v", name, err)
		}
		t.Logf("%s (HCA %s):\n%s", name, pair[len(results)], lastLines(out, 12))
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var r rankResult
		found := false
		for i := len(lines) - 1; i >= 0 && !found; i-- {
			found = strings.HasPrefix(lines[i], "{") && json.Unmarshal([]byte(lines[i]), &r) == nil
		}
		if !found {
			t.Fatalf("%s: no report in its log", name)
		}
		results[name] = r
	}
	r0, r1 := results[names[0]], results[names[1]]
	if r0.PidNS == "" || r0.PidNS == r1.PidNS {
		t.Errorf("the rank pods run in PID namespaces %q and %q; want two", r0.PidNS, r1.PidNS)
	}
	for _, name := range names {
		r := results[name]
		if r.Err != "" {
			t.Errorf("%s: %s", name, r.Err)
			continue
		}
		if !r.PXN || r.RelayedPieces == 0 || r.FallbackPieces != 0 || r.FailedPieces != 0 || r.Verified == 0 {
			t.Errorf("%s: PXN %v, relayed %d, fallback %d, failed %d pieces, %d bytes verified at its target; want relayed > 0, nothing direct or failed, bytes verified",
				name, r.PXN, r.RelayedPieces, r.FallbackPieces, r.FailedPieces, r.Verified)
		}
		if r.ArenasByFD != 1 || r.ArenasByHandle != 0 {
			t.Errorf("%s: mapped %d arenas by descriptor, %d by handle; want the other pod's by descriptor", name, r.ArenasByFD, r.ArenasByHandle)
		}
		byHeartbeat, byPid := 0, 0
		for _, how := range r.Ranks {
			switch how {
			case "heartbeat live":
				byHeartbeat++
			case "pid live":
				byPid++
			}
		}
		if len(r.Ranks) != 2 || byHeartbeat != 1 || byPid != 1 {
			t.Errorf("%s sees ranks %v; want itself live by pid and the other pod's rank live by heartbeat", name, r.Ranks)
		}
	}
	c.mustKC("delete", "pod", "-n", ns, names[0], names[1], "--wait=true", "--timeout=1m")
}

// checkKubeletRestart restarts the kubelet: the device plugin must register
// again (kubelet.sock is re-created), the resource must come back, running
// pods keep their folders, and a new pod of job1 joins a1 and a2.
func (c *cluster) checkKubeletRestart() {
	t := c.t
	logPath := filepath.Join(c.dir, "logs", "kubelet.log")
	st, err := os.Stat(logPath)
	if err != nil {
		t.Fatal(err)
	}
	offset := st.Size()
	start := time.Now()
	rctx, cancel := context.WithTimeout(c.ctx, 3*time.Minute)
	out, err := c.script(rctx, "restart-kubelet")
	cancel()
	if err != nil {
		t.Fatalf("restart-kubelet: %v\n%s", err, out)
	}
	t.Logf("kubelet restarted, node Ready in %.1f s", time.Since(start).Seconds())
	c.poll("the kubelet's log shows the device plugin registering again", 2*time.Minute, func() (bool, string) {
		b, err := os.ReadFile(logPath)
		if err != nil || int64(len(b)) < offset {
			return false, fmt.Sprint(err)
		}
		for _, line := range strings.Split(string(b[offset:]), "\n") {
			// The kubelet's device manager (pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go).
			if strings.Contains(line, "Got registration request from device plugin") && strings.Contains(line, `"`+resource+`"`) {
				t.Logf("kubelet: %s", strings.TrimSpace(line))
				return true, ""
			}
		}
		return false, "no registration of " + resource + " since the restart"
	})
	c.waitRelayCapacity(resource + " back in capacity and allocatable after the kubelet restart")
	c.checkKeptFiles("the kubelet restart", []string{"a1.txt", "a2.txt"}, a1, a2)
	c.startWorkloads(a3)
	if got := c.listDir(a3.ns, a3.name); !reflect.DeepEqual(got, []string{"a1.txt", "a2.txt"}) {
		t.Errorf("a3 (job1, started after the restart) sees %v, want a1's and a2's files", got)
	}
}

// checkKeptFiles checks, after a restart, that each of ws still sees want in
// its registry root. A restarted kubelet reports the node Ready before it
// has re-admitted the pods that were running; until then an exec answers
// "pod does not exist".
func (c *cluster) checkKeptFiles(after string, want []string, ws ...workload) {
	for _, w := range ws {
		var got []string
		c.poll(fmt.Sprintf("%s/%s answers exec after %s", w.ns, w.name, after), time.Minute, func() (bool, string) {
			out, err := c.exec(w.ns, w.name, "ls", registryRoot)
			if err != nil {
				return false, err.Error()
			}
			got = strings.Fields(out)
			return true, ""
		})
		if !reflect.DeepEqual(got, want) {
			c.t.Errorf("%s/%s after %s: %v, want %v", w.ns, w.name, after, got, want)
		}
	}
}

// checkGarbageCollection deletes the workloads, waits for the plugin to
// collect their group folders (gcGrace is 5 s in hack/e2e/values.yaml) and
// uninstalls the chart: nothing of the groups is left on the host.
func (c *cluster) checkGarbageCollection() {
	t := c.t
	c.mustKC("delete", "namespace", nsA, nsB, "--wait=true", "--timeout=2m")
	c.poll("group folders and slot links collected", gcWait, func() (bool, string) {
		groups, err := os.ReadDir(c.groupsDir())
		if err != nil {
			return false, err.Error()
		}
		slots, err := os.ReadDir(filepath.Join(c.dir, "pxn-state", "slots"))
		if err != nil {
			return false, err.Error()
		}
		return len(groups) == 0 && len(slots) == 0, fmt.Sprintf("%d group folders, %d slot links", len(groups), len(slots))
	})
	out, err := c.run(2*time.Minute, c.helm, "uninstall", release, "-n", namespace, "--kubeconfig", c.kubeconfig(), "--wait", "--timeout", "2m")
	if err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	c.poll("chart pods gone", 2*time.Minute, func() (bool, string) {
		var pods podList
		if err := c.getJSON(&pods, "pods", "-n", namespace); err != nil {
			return false, err.Error()
		}
		var left []string
		for _, p := range pods.Items {
			left = append(left, p.summary())
		}
		return len(left) == 0, strings.Join(left, "; ")
	})
	if groups, err := os.ReadDir(c.groupsDir()); err != nil && !os.IsNotExist(err) {
		t.Error(err)
	} else if len(groups) != 0 {
		t.Errorf("after helm uninstall: %d group folders left in %s", len(groups), c.groupsDir())
	}
	if c.st.createdNamespace {
		c.mustKC("delete", "namespace", namespace, "--wait=true", "--timeout=2m")
	}
}
