// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
)

// cluster is a local cluster started by hack/local-cluster.sh (or given by
// PXN_E2E_CLUSTER_DIR) and the tools that drive it.
type cluster struct {
	t       *testing.T // the running step's
	root    *testing.T // the suite's
	ctx     context.Context
	repo    string
	dir     string // PXN_CLUSTER_DIR of the cluster
	reuse   bool   // given by the caller: never torn down
	kubectl string
	helm    string
	ctr     string // containerd's client, built with it by hack/tools.sh
	helmEnv []string
	node    string
	shmDir  string // the device plugin's host tmpfs folder
	// draShmDir and cdiDir: the DRA driver's host tmpfs folder and the
	// runtime's CDI spec folder.
	draShmDir, cdiDir string
	image             string      // the pxn image
	st                *suiteState // shared by the steps' copies of the cluster
}

// suiteState is what one step leaves to the next.
type suiteState struct {
	// createdNamespace: the chart's namespace did not exist before the
	// suite installed the chart.
	createdNamespace bool
}

// script runs hack/local-cluster.sh with the cluster's environment.
func (c *cluster) script(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(c.repo, "hack", "local-cluster.sh")}, args...)...)
	cmd.Dir = c.repo
	cmd.Env = append(os.Environ(), "PXN_CLUSTER_DIR="+c.dir, "PXN_CLUSTER_INSTALL=0", "PXN_CLUSTER_BUILD=0")
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// run runs a command with a bounded time and returns its combined output.
func (c *cluster) run(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.repo
	cmd.Env = append(os.Environ(), c.helmEnv...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v: after %s, or the suite's deadline)", err, ctx.Err(), timeout)
		}
		return stdout.String() + stderr.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// detached is c with a context that the suite's deadline does not end, for
// diagnostics and clean-up.
func (c *cluster) detached() *cluster {
	d := *c
	d.ctx = context.Background()
	return &d
}

func (c *cluster) kubeconfig() string { return filepath.Join(c.dir, "pki", "admin.kubeconfig") }

// kc runs kubectl against the cluster.
func (c *cluster) kc(args ...string) (string, error) {
	return c.run(time.Minute, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig()}, args...)...)
}

// mustKC runs kubectl and fails the test on an error.
func (c *cluster) mustKC(args ...string) string {
	c.t.Helper()
	out, err := c.kc(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// apply feeds a manifest to kubectl apply.
func (c *cluster) apply(manifest string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", c.kubeconfig(), "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, ctx.Err())
		}
		c.t.Fatalf("kubectl apply: %v\n%s\n--- manifest ---\n%s", err, out, manifest)
	}
}

// getJSON decodes kubectl get ... -o json into v.
func (c *cluster) getJSON(v any, args ...string) error {
	out, err := c.kc(append(append([]string{"get"}, args...), "-o", "json")...)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(out), v)
}

// poll calls check every interval until it reports done, the timeout passes
// or the test's context ends; on a timeout it fails with check's last word.
func (c *cluster) poll(what string, timeout time.Duration, check func() (bool, string)) {
	c.t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	last := ""
	for {
		done, state := check()
		if done {
			c.t.Logf("%s: after %.1f s", what, time.Since(start).Seconds())
			return
		}
		last = state
		if time.Now().After(deadline) || c.ctx.Err() != nil {
			c.t.Fatalf("%s: not reached after %s; last state: %s", what, timeout, last)
		}
		select {
		case <-c.ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// exec runs the probe in a container of a running pod.
func (c *cluster) exec(ns, pod string, args ...string) (string, error) {
	return c.kc(append([]string{"-n", ns, "exec", pod, "--", "/probe"}, args...)...)
}

// diagnostics logs what a reader needs to find out why a step failed: pods,
// their descriptions and logs, events, the plugin's folders, the kubelet's log.
func (c *cluster) diagnostics() {
	c = c.detached() // also after the suite's deadline
	t := c.t
	section := func(title, body string) {
		const max = 24 << 10
		if len(body) > max {
			body = "... (cut)\n" + body[len(body)-max:]
		}
		t.Logf("===== %s =====\n%s", title, body)
	}
	show := func(title string, args ...string) {
		out, err := c.kc(args...)
		if err != nil {
			out += "\n" + err.Error()
		}
		section(title, out)
	}
	show("nodes", "get", "nodes", "-o", "wide")
	show("pods", "get", "pods", "-A", "-o", "wide")
	show("describe pods", "describe", "pods", "-A")
	show("describe node", "describe", "node", c.node)
	show("events", "get", "events", "-A", "--sort-by=.lastTimestamp")
	show("pxnrailmaps", "get", "pxnrailmaps", "-o", "yaml")
	var pods podList
	if err := c.getJSON(&pods, "pods", "-A"); err == nil {
		for _, p := range pods.Items {
			show("logs "+p.Metadata.Namespace+"/"+p.Metadata.Name, "-n", p.Metadata.Namespace, "logs", p.Metadata.Name, "--all-containers", "--tail=200")
		}
	}
	if out, err := exec.Command("find", c.shmDir, filepath.Join(c.dir, "pxn-state"), "-ls").CombinedOutput(); err == nil || len(out) > 0 {
		section("plugin folders", string(out))
	}
	for _, name := range []string{"kubelet", "containerd"} {
		if b, err := os.ReadFile(filepath.Join(c.dir, "logs", name+".log")); err == nil {
			lines := strings.Split(string(b), "\n")
			if len(lines) > 150 {
				lines = lines[len(lines)-150:]
			}
			section(name+" log (tail)", strings.Join(lines, "\n"))
		}
	}
}

// Kubernetes objects, only the fields the tests read.
type objectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
}

type condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type pod struct {
	Metadata objectMeta `json:"metadata"`
	Status   struct {
		Phase             string      `json:"phase"`
		Conditions        []condition `json:"conditions"`
		ContainerStatuses []struct {
			Name         string `json:"name"`
			Ready        bool   `json:"ready"`
			RestartCount int    `json:"restartCount"`
			State        struct {
				Waiting *struct {
					Reason  string `json:"reason"`
					Message string `json:"message"`
				} `json:"waiting"`
				Terminated *struct {
					Reason   string `json:"reason"`
					ExitCode int    `json:"exitCode"`
				} `json:"terminated"`
			} `json:"state"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

type podList struct {
	Items []pod `json:"items"`
}

// summary is one line about a pod's state, for poll messages.
func (p pod) summary() string {
	s := fmt.Sprintf("%s/%s %s", p.Metadata.Namespace, p.Metadata.Name, p.Status.Phase)
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			s += fmt.Sprintf(" [%s waiting: %s %s]", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			s += fmt.Sprintf(" [%s terminated: %s exit %d]", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
		default:
			s += fmt.Sprintf(" [%s ready=%v restarts=%d]", cs.Name, cs.Ready, cs.RestartCount)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != "True" && c.Message != "" {
			s += fmt.Sprintf(" (%s: %s)", c.Type, c.Message)
		}
	}
	return s
}

func (p pod) ready() bool {
	if p.Status.Phase != "Running" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

type node struct {
	Metadata objectMeta `json:"metadata"`
	Status   struct {
		Capacity    map[string]string `json:"capacity"`
		Allocatable map[string]string `json:"allocatable"`
		Conditions  []condition       `json:"conditions"`
	} `json:"status"`
}

// requireHost skips the suite when it cannot run here: not root, or the
// packages of hack/host-packages.sh's cluster group are missing and this
// machine cannot install them (no apt-get). Packages that are missing but
// installable fail under PXN_REQUIRE_TOOLS=1 (make test installs them first)
// and skip otherwise.
func requireHost(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: the end-to-end suite needs root (it starts containerd, a kubelet and a CNI bridge)")
	}
	cmd := exec.Command("bash", filepath.Join(testtools.RepoRoot(), "hack", "host-packages.sh"), "check", "cluster")
	out, err := cmd.Output()
	report := strings.Join(strings.Split(strings.TrimSpace(string(out)), "\n"), "; ")
	var exit *exec.ExitError
	switch {
	case err == nil:
		return
	case errors.As(err, &exit) && exit.ExitCode() == 3:
		t.Skipf("skipping: %s", report)
	case errors.As(err, &exit) && exit.ExitCode() == 4:
		msg := report + " (make test installs them; or hack/host-packages.sh install cluster)"
		if os.Getenv("PXN_REQUIRE_TOOLS") == "1" {
			t.Fatal(msg)
		}
		t.Skip("skipping: " + msg)
	default:
		t.Fatalf("hack/host-packages.sh check cluster: %v: %s", err, out)
	}
}

// trackInputs stats every file of the module. The suite builds the images
// from them and runs the scripts and the chart, none of which is a Go import
// of the test; go test records the stats, so a cached pass is reused only
// while no source, script, chart or fixture has changed.
func trackInputs(t *testing.T, repo string) {
	t.Helper()
	skip := map[string]bool{".git": true, ".tools": true, "_output": true, "bin": true}
	err := filepath.WalkDir(repo, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil // a file that went away while walking
		}
		if d.IsDir() {
			if skip[d.Name()] && p != repo {
				return filepath.SkipDir
			}
			return nil
		}
		_, _ = os.Stat(p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// hostState is what the machine had before the cluster, to check that down
// leaves it that way.
type hostState struct {
	paths  map[string]bool
	bridge bool
}

var hostPaths = []string{"/var/lib/kubelet", "/var/lib/cni", "/var/log/pods", "/var/log/containers", "/run/containerd"}

func readHostState() hostState {
	s := hostState{paths: map[string]bool{}}
	for _, p := range hostPaths {
		_, err := os.Lstat(p)
		s.paths[p] = err == nil
	}
	s.bridge = exec.Command("ip", "link", "show", "cni0").Run() == nil
	return s
}

// checkTornDown fails when down left something behind that was not there
// before up.
func checkTornDown(t *testing.T, dir string, shmDirs []string, before hostState) {
	t.Helper()
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after down: %s still exists (%v)", dir, err)
	}
	for _, shmDir := range shmDirs {
		if _, err := os.Lstat(shmDir); shmDir != "" && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after down: %s still exists (%v)", shmDir, err)
		}
	}
	after := readHostState()
	for _, p := range hostPaths {
		if after.paths[p] && !before.paths[p] {
			t.Errorf("after down: %s exists, it did not before up", p)
		}
	}
	if after.bridge && !before.bridge {
		t.Errorf("after down: the cni0 bridge still exists")
	}
	if out, err := exec.Command("findmnt", "-rn", "-o", "TARGET").Output(); err == nil {
		for _, m := range strings.Split(string(out), "\n") {
			if m == dir || strings.HasPrefix(m, dir+"/") {
				t.Errorf("after down: %s is still mounted", m)
			}
		}
	}
}

// startCluster brings the cluster up (or takes the one in
// PXN_E2E_CLUSTER_DIR) and registers its tear-down.
func startCluster(t *testing.T, ctx context.Context) *cluster {
	t.Helper()
	c := &cluster{t: t, root: t, ctx: ctx, repo: testtools.RepoRoot(), st: &suiteState{}}
	for _, tool := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "containerd"} {
		testtools.Require(t, tool)
	}
	c.kubectl = testtools.Require(t, "kubectl")
	c.helm = testtools.Require(t, "helm")
	c.ctr = testtools.Require(t, "ctr")
	home := t.TempDir()
	for _, v := range []string{"HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"} {
		c.helmEnv = append(c.helmEnv, v+"="+filepath.Join(home, strings.ToLower(v)))
	}

	if dir := os.Getenv("PXN_E2E_CLUSTER_DIR"); dir != "" {
		c.dir, c.reuse = dir, true
		if out, err := c.script(ctx, "status"); err != nil {
			t.Fatalf("PXN_E2E_CLUSTER_DIR=%s: the cluster is not up: %v\n%s", dir, err, out)
		}
		t.Logf("using the cluster in %s (PXN_E2E_CLUSTER_DIR); it stays up", dir)
		// The images of this checkout, not whatever the cluster was started with.
		imgCtx, cancel := context.WithTimeout(ctx, upLimit)
		out, err := c.script(imgCtx, "images")
		cancel()
		if err != nil {
			t.Fatalf("hack/local-cluster.sh images: %v\n%s", err, lastLines(out, 40))
		}
	} else {
		c.dir = "/var/tmp/pxn-e2e"
		if d := os.Getenv("PXN_E2E_STATE_DIR"); d != "" {
			c.dir = d
		}
		if def := "/var/tmp/pxn-local-cluster"; c.dir != def {
			if _, err := os.Stat(filepath.Join(def, "up")); err == nil {
				t.Fatalf("a local cluster is already up in %s (it holds the ports and cni0): run the suite against it with PXN_E2E_CLUSTER_DIR=%s, or stop it with hack/local-cluster.sh down", def, def)
			}
		}
		// Two runs at once would tear each other's cluster down.
		lock, err := os.OpenFile(c.dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			lock.Close()
			t.Fatalf("another run of the suite holds %s.lock (its cluster is in %s): %v", c.dir, c.dir, err)
		}
		t.Cleanup(func() {
			os.Remove(lock.Name())
			lock.Close()
		})
		before := readHostState()
		start := time.Now()
		upCtx, cancel := context.WithTimeout(ctx, upLimit)
		out, err := c.script(upCtx, "up")
		cancel()
		// Registered before anything can fail: down is safe on a half-up cluster.
		t.Cleanup(func() {
			if os.Getenv("PXN_E2E_KEEP") == "1" {
				t.Logf("PXN_E2E_KEEP=1: the cluster stays up; stop it with PXN_CLUSTER_DIR=%s hack/local-cluster.sh down", c.dir)
				return
			}
			downCtx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			start := time.Now()
			out, err := c.script(downCtx, "down")
			if err != nil {
				t.Errorf("hack/local-cluster.sh down: %v\n%s", err, out)
				return
			}
			t.Logf("cluster down in %.1f s", time.Since(start).Seconds())
			checkTornDown(t, c.dir, []string{c.shmDir, c.draShmDir}, before)
		})
		if err != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) && exit.ExitCode() == 3 {
				reason := "containerd cannot start on this machine"
				for _, line := range strings.Split(out, "\n") {
					if r, ok := strings.CutPrefix(line, "CONTAINERD-FAILURE: "); ok {
						reason = r
					}
				}
				t.Skipf("skipping: %s\n%s", reason, lastLines(out, 30))
			}
			t.Fatalf("hack/local-cluster.sh up: %v\n%s", err, lastLines(out, 80))
		}
		t.Logf("cluster up in %.1f s\n%s", time.Since(start).Seconds(), lastLines(out, 6))
	}
	env, err := os.ReadFile(filepath.Join(c.dir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(env), "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			continue
		}
		switch k {
		case "PXN_CLUSTER_NODE":
			c.node = v
		case "PXN_CLUSTER_SHM_DIR":
			c.shmDir = v
		case "PXN_CLUSTER_DRA_SHM_DIR":
			c.draShmDir = v
		case "PXN_CLUSTER_CDI_DIR":
			c.cdiDir = v
		case "PXN_CLUSTER_IMAGE":
			c.image = v
		}
	}
	if c.node == "" || c.shmDir == "" || c.draShmDir == "" || c.cdiDir == "" {
		t.Fatalf("%s/env names no node, shm folders or CDI folder:\n%s", c.dir, env)
	}
	return c
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
