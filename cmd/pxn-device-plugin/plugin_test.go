// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/group"
)

var pluginBin string

// healthyFixture is a pkg/rail sysfs fixture whose railed HCAs are all ACTIVE.
const healthyFixture = "hgx-8gpu"

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

// runTests builds the plugin once, with the race detector when the tests
// have it, and runs it as a separate process in every test.
// PXN_DEVICE_PLUGIN_BIN names a prebuilt binary to use instead.
func runTests(m *testing.M) int {
	if pluginBin = os.Getenv("PXN_DEVICE_PLUGIN_BIN"); pluginBin != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "pxn-dp-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	pluginBin = filepath.Join(dir, "pxn-device-plugin")
	args := []string{"build", "-o", pluginBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build pxn-device-plugin: %v\n", err)
		return 1
	}
	return m.Run()
}

// syncBuffer collects a process's output for the test log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type plugin struct {
	t        testing.TB
	cmd      *exec.Cmd
	out      *syncBuffer
	exited   chan struct{}
	err      error
	stateDir string
	shmDir   string
	nodeRoot string
}

type pluginOpts struct {
	nodeRoot   string
	kubeconfig string
	metrics    string // empty: "0", no metrics endpoint
	health     string // empty: "0", the probes are off
	extra      []string
}

// startPlugin runs the plugin binary against the stub kubelet with its own
// temporary state, shm and host folders.
func startPlugin(t testing.TB, k *kubelet, o pluginOpts) *plugin {
	t.Helper()
	base := t.TempDir()
	p := &plugin{t: t, out: &syncBuffer{}, exited: make(chan struct{}),
		stateDir: filepath.Join(base, "state"), shmDir: filepath.Join(base, "shm"), nodeRoot: o.nodeRoot}
	if p.nodeRoot == "" {
		p.nodeRoot = fixtureNodeRoot(t)
	}
	args := []string{
		"--device-plugin-dir=" + k.dir,
		"--pod-resources-socket=" + k.podSock,
		"--host-root=" + p.nodeRoot,
		"--state-dir=" + p.stateDir,
		"--shm-dir=" + p.shmDir,
		"--metrics-bind-address=" + cmp.Or(o.metrics, "0"),
		"--health-probe-bind-address=" + cmp.Or(o.health, "0"),
		"--rediscover-interval=100ms",
		"--gc-interval=100ms",
		"--gc-grace=400ms",
		"--gc-kubelet-settle=400ms",
		"-v=2",
	}
	if o.kubeconfig != "" {
		args = append(args, "--kubeconfig="+o.kubeconfig)
	}
	p.cmd = exec.Command(pluginBin, append(args, o.extra...)...)
	p.cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "KUBERNETES_") })
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("pxn-device-plugin exit: %v", err)
		}
		if t.Failed() {
			t.Logf("pxn-device-plugin output:\n%s", p.out.String())
		}
	})
	return p
}

// stop sends SIGTERM and waits for the process to exit.
func (p *plugin) stop() error {
	select {
	case <-p.exited:
		return p.err
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("plugin did not exit within 15 s of SIGTERM")
	}
}

func (p *plugin) slot(id string) string { return filepath.Join(p.stateDir, "slots", id) }

func (p *plugin) group(key string) string { return filepath.Join(p.shmDir, "groups", key) }

// key is the group key the plugin gives, with the secret in its state
// folder.
func (p *plugin) key(t testing.TB, ns, source, identity string) string {
	t.Helper()
	k, err := group.LoadKeyer(p.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	return k.Key(ns, source, identity)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func contextFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// fixtureNodeRoot copies one of pkg/rail's sysfs fixtures (a node whose
// railed HCAs are all ACTIVE) into a temporary folder, so a test may change
// port states.
func fixtureNodeRoot(t testing.TB) string {
	t.Helper()
	src := filepath.Join("..", "..", "pkg", "rail", "testdata", "sysfs", healthyFixture)
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatalf("copy fixture %s: %v", src, err)
	}
	return dst
}

// portStates returns the state files of every HCA port in a host root.
func portStates(t testing.TB, nodeRoot string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(nodeRoot, "sys", "class", "infiniband", "*", "ports", "*", "state"))
	if err != nil || len(files) < 2 {
		t.Fatalf("fixture %s has %d port state files (%v); want at least 2", nodeRoot, len(files), err)
	}
	return files
}

func setPortState(t testing.TB, file, state string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(state+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// groupDirMode checks mode drwxrwxrwt.
func groupDirMode(t testing.TB, dir string) {
	t.Helper()
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode()&fs.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Fatalf("%s: mode %v, want drwxrwxrwt (1777)", dir, fi.Mode())
	}
}
