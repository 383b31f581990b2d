// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/deviceplugin"
	"github.com/pxn-project/pxn/pkg/group"
)

const resource = "pxn.io/relay"

func allocate(t testing.TB, c pluginapi.DevicePluginClient, ids ...string) *pluginapi.ContainerAllocateResponse {
	t.Helper()
	resp, err := c.Allocate(contextFor(t, 5*time.Second), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
	})
	if err != nil {
		t.Fatalf("Allocate(%v): %v", ids, err)
	}
	if len(resp.ContainerResponses) != 1 {
		t.Fatalf("Allocate(%v): %d container responses", ids, len(resp.ContainerResponses))
	}
	return resp.ContainerResponses[0]
}

func preStart(t testing.TB, c pluginapi.DevicePluginClient, ids ...string) {
	t.Helper()
	if _, err := c.PreStartContainer(contextFor(t, 10*time.Second), &pluginapi.PreStartContainerRequest{DevicesIds: ids}); err != nil {
		t.Fatalf("PreStartContainer(%v): %v", ids, err)
	}
}

func readLink(t testing.TB, path string) string {
	t.Helper()
	target, err := os.Readlink(path)
	if err != nil {
		t.Fatalf("slot link: %v", err)
	}
	return target
}

// recvHealth reads ListAndWatch updates until every device has health want.
func recvHealth(t testing.TB, stream pluginapi.DevicePlugin_ListAndWatchClient, want string) []*pluginapi.Device {
	t.Helper()
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("ListAndWatch while waiting for %s: %v", want, err)
		}
		if len(resp.Devices) != 16 {
			t.Fatalf("ListAndWatch sent %d devices, want always the full list of 16", len(resp.Devices))
		}
		all := true
		for _, d := range resp.Devices {
			all = all && d.Health == want
		}
		if all {
			return resp.Devices
		}
	}
}

func TestRegisterListAllocatePreStart(t *testing.T) {
	k := startKubelet(t)
	p := startPlugin(t, k, pluginOpts{})

	reg := k.waitRegistration(30 * time.Second)
	if reg.Version != "v1beta1" || reg.ResourceName != resource || reg.Endpoint != "pxn-io-relay.sock" ||
		reg.Options == nil || !reg.Options.PreStartRequired || reg.Options.GetPreferredAllocationAvailable {
		t.Fatalf("registration = %+v", reg)
	}
	c := k.dial(reg.Endpoint)
	opts, err := c.GetDevicePluginOptions(contextFor(t, 5*time.Second), &pluginapi.Empty{})
	if err != nil || !opts.PreStartRequired || opts.GetPreferredAllocationAvailable {
		t.Fatalf("GetDevicePluginOptions = %v, %v", opts, err)
	}

	stream, err := c.ListAndWatch(contextFor(t, 30*time.Second), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	devs := recvHealth(t, stream, pluginapi.Healthy)
	for i, d := range devs {
		if want := fmt.Sprintf("pxn-relay-%02d", i); d.ID != want || d.Topology != nil {
			t.Fatalf("device %d = %v, want ID %s without topology", i, d, want)
		}
	}

	got := allocate(t, c, "pxn-relay-07", "pxn-relay-03")
	body, _ := json.Marshal(got)
	t.Logf("Allocate(pxn-relay-07, pxn-relay-03) = %s", body)
	railMap := got.Envs[contract.EnvRailMap]
	var parsed map[string]string
	if err := json.Unmarshal([]byte(railMap), &parsed); err != nil || len(parsed) == 0 {
		t.Fatalf("%s %q is not a non-empty JSON object: %v", contract.EnvRailMap, railMap, err)
	}
	if canonical, _ := json.Marshal(parsed); string(canonical) != railMap {
		t.Fatalf("%s %q is not compact JSON with sorted keys (%s)", contract.EnvRailMap, railMap, canonical)
	}
	wantEnv := map[string]string{contract.EnvEnable: "1", contract.EnvRailMap: railMap, contract.EnvGroupID: "k8s", contract.EnvRegistryRoot: "/run/pxn"}
	if fmt.Sprint(got.Envs) != fmt.Sprint(wantEnv) {
		t.Fatalf("envs = %v, want %v", got.Envs, wantEnv)
	}
	if len(got.Mounts) != 1 || got.Mounts[0].HostPath != p.slot("pxn-relay-03") || got.Mounts[0].ContainerPath != "/run/pxn" || got.Mounts[0].ReadOnly {
		t.Fatalf("mounts = %v, want %s → /run/pxn read-write", got.Mounts, p.slot("pxn-relay-03"))
	}
	if again := allocate(t, c, "pxn-relay-03", "pxn-relay-07"); fmt.Sprint(again) != fmt.Sprint(got) {
		t.Fatalf("the same devices got another answer:\n%v\n%v", again, got)
	}
	if _, err := c.Allocate(contextFor(t, 5*time.Second), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"gpu-0"}}}}); err == nil {
		t.Fatal("Allocate accepted an unknown device")
	}

	k.setPods(podRes("team-a", "rank-0", resource, map[string][]string{"main": {"pxn-relay-03", "pxn-relay-07"}}))
	preStart(t, c, "pxn-relay-03", "pxn-relay-07")
	dir := p.group(p.key(t, "team-a", group.SourcePodName, "rank-0"))
	groupDirMode(t, dir)
	for _, id := range []string{"pxn-relay-03", "pxn-relay-07"} {
		if target := readLink(t, p.slot(id)); target != dir {
			t.Fatalf("slot %s → %s, want %s", id, target, dir)
		}
	}
	if fi, err := os.Stat(got.Mounts[0].HostPath); err != nil || !fi.IsDir() {
		t.Fatalf("mount source %s does not resolve to a directory: %v", got.Mounts[0].HostPath, err)
	}
}

func TestNamespacesAndPodsAreIsolated(t *testing.T) {
	k := startKubelet(t)
	p := startPlugin(t, k, pluginOpts{})
	c := k.dial(k.waitRegistration(30 * time.Second).Endpoint)
	k.setPods(
		podRes("team-a", "rank-0", resource, map[string][]string{"main": {"pxn-relay-00"}}),
		podRes("team-b", "rank-0", resource, map[string][]string{"main": {"pxn-relay-01"}}),
		podRes("team-a", "rank-1", resource, map[string][]string{"main": {"pxn-relay-02"}}),
		podRes("team-a", "ranks", resource, map[string][]string{"r0": {"pxn-relay-03"}, "r1": {"pxn-relay-04"}}),
	)
	for _, id := range []string{"pxn-relay-00", "pxn-relay-01", "pxn-relay-02", "pxn-relay-03", "pxn-relay-04"} {
		preStart(t, c, id)
	}
	a0, b0, a1 := readLink(t, p.slot("pxn-relay-00")), readLink(t, p.slot("pxn-relay-01")), readLink(t, p.slot("pxn-relay-02"))
	if a0 == b0 {
		t.Fatalf("pods of the same name in two namespaces share %s", a0)
	}
	if a0 == a1 {
		t.Fatalf("two unrelated pods of one namespace share %s", a0)
	}
	if r0, r1 := readLink(t, p.slot("pxn-relay-03")), readLink(t, p.slot("pxn-relay-04")); r0 != r1 {
		t.Fatalf("two containers of one pod got %s and %s", r0, r1)
	}
}

// TestGroupLabelSharesDirectory reads pod labels from a real kube-apiserver.
func TestGroupLabelSharesDirectory(t *testing.T) {
	assets := testtools.EnvtestAssets(t)
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() { env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "pxn-device-plugin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if b, err := user.KubeConfig(); err != nil || os.WriteFile(kubeconfig, b, 0o600) != nil {
		t.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	ctx := contextFor(t, time.Minute)
	uids := map[string]string{}
	for _, pod := range []struct{ ns, name, group string }{
		{"team-a", "job1-rank-0", "job-1"},
		{"team-a", "job1-rank-1", "job-1"},
		{"team-a", "job2-rank-0", "job-2"},
		{"team-a", "solo", ""},
		{"team-b", "job1-rank-0", "job-1"},
	} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pod.ns}}, metav1.CreateOptions{}); err == nil {
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: pod.ns}}
			if _, err := client.CoreV1().ServiceAccounts(pod.ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		obj := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: pod.ns, Name: pod.name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "pause"}}},
		}
		if pod.group != "" {
			obj.Labels = map[string]string{deviceplugin.GroupLabel: pod.group}
		}
		created, err := client.CoreV1().Pods(pod.ns).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod %s/%s: %v", pod.ns, pod.name, err)
		}
		uids[pod.ns+"/"+pod.name] = string(created.UID)
	}

	k := startKubelet(t)
	p := startPlugin(t, k, pluginOpts{kubeconfig: kubeconfig})
	c := k.dial(k.waitRegistration(30 * time.Second).Endpoint)
	k.setPods(
		podRes("team-a", "job1-rank-0", resource, map[string][]string{"main": {"pxn-relay-00"}}),
		podRes("team-a", "job1-rank-1", resource, map[string][]string{"main": {"pxn-relay-01"}}),
		podRes("team-a", "job2-rank-0", resource, map[string][]string{"main": {"pxn-relay-02"}}),
		podRes("team-a", "solo", resource, map[string][]string{"main": {"pxn-relay-03"}}),
		podRes("team-b", "job1-rank-0", resource, map[string][]string{"main": {"pxn-relay-04"}}),
	)
	for i := range 5 {
		preStart(t, c, fmt.Sprintf("pxn-relay-%02d", i))
	}
	links := make([]string, 5)
	for i := range links {
		links[i] = readLink(t, p.slot(fmt.Sprintf("pxn-relay-%02d", i)))
	}
	if want := p.group(p.key(t, "team-a", group.SourceLabel, "job-1")); links[0] != want || links[1] != want {
		t.Fatalf("pods labelled %s=job-1 in team-a: %s and %s, want both %s", deviceplugin.GroupLabel, links[0], links[1], want)
	}
	groupDirMode(t, links[0])
	if links[2] == links[0] {
		t.Fatal("another job shares job-1's directory")
	}
	if want := p.group(p.key(t, "team-a", group.SourceUID, uids["team-a/solo"])); links[3] != want {
		t.Fatalf("unlabelled pod: %s, want its UID's group %s", links[3], want)
	}
	if links[4] == links[0] {
		t.Fatal("the same group label in another namespace shares team-a's directory")
	}
}

func TestReregistersWhenKubeletSocketIsRecreated(t *testing.T) {
	k := startKubelet(t)
	startPlugin(t, k, pluginOpts{})
	reg := k.waitRegistration(30 * time.Second)
	for _, wipe := range []bool{false, false, true} {
		k.restart(wipe)
		// The plugin sees the new socket through fsnotify or its 1 s
		// check; the wait is the first registration's, for a loaded
		// machine.
		again := k.waitRegistration(30 * time.Second)
		if again.Endpoint != reg.Endpoint || again.ResourceName != resource || !again.Options.PreStartRequired {
			t.Fatalf("re-registration = %+v", again)
		}
		if _, err := k.dial(again.Endpoint).GetDevicePluginOptions(contextFor(t, 5*time.Second), &pluginapi.Empty{}); err != nil {
			t.Fatalf("plugin does not answer after re-registration (wipe=%v): %v", wipe, err)
		}
	}
}

func TestReservesWhenOwnSocketIsDeleted(t *testing.T) {
	k := startKubelet(t)
	startPlugin(t, k, pluginOpts{})
	reg := k.waitRegistration(30 * time.Second)
	for range 2 {
		if err := os.Remove(filepath.Join(k.dir, reg.Endpoint)); err != nil {
			t.Fatal(err)
		}
		again := k.waitRegistration(30 * time.Second) // fsnotify or the 1 s check, on a loaded machine
		if again.Endpoint != reg.Endpoint {
			t.Fatalf("re-registered at %s, want %s", again.Endpoint, reg.Endpoint)
		}
		stream, err := k.dial(again.Endpoint).ListAndWatch(contextFor(t, 10*time.Second), &pluginapi.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		recvHealth(t, stream, pluginapi.Healthy)
	}
}

func TestHealthFollowsNodeRoot(t *testing.T) {
	k := startKubelet(t)
	p := startPlugin(t, k, pluginOpts{})
	ports := portStates(t, p.nodeRoot)
	c := k.dial(k.waitRegistration(30 * time.Second).Endpoint)
	stream, err := c.ListAndWatch(contextFor(t, time.Minute), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	recvHealth(t, stream, pluginapi.Healthy)

	for _, f := range ports {
		setPortState(t, f, "1: DOWN")
	}
	recvHealth(t, stream, pluginapi.Unhealthy)

	// One ACTIVE railed port is enough, the others may stay down.
	setPortState(t, ports[0], "4: ACTIVE")
	recvHealth(t, stream, pluginapi.Healthy)

	sys := filepath.Join(p.nodeRoot, "sys")
	if err := os.Rename(sys, sys+".gone"); err != nil {
		t.Fatal(err)
	}
	recvHealth(t, stream, pluginapi.Unhealthy)
	if err := os.Rename(sys+".gone", sys); err != nil {
		t.Fatal(err)
	}
	recvHealth(t, stream, pluginapi.Healthy)
}

func TestGarbageCollectsDeadGroup(t *testing.T) {
	k := startKubelet(t)
	p := startPlugin(t, k, pluginOpts{})
	c := k.dial(k.waitRegistration(30 * time.Second).Endpoint)
	live := podRes("team-a", "live", resource, map[string][]string{"main": {"pxn-relay-00"}})
	k.setPods(live, podRes("team-a", "dead", resource, map[string][]string{"main": {"pxn-relay-01"}}))
	preStart(t, c, "pxn-relay-00")
	preStart(t, c, "pxn-relay-01")
	liveDir, deadDir := readLink(t, p.slot("pxn-relay-00")), readLink(t, p.slot("pxn-relay-01"))

	// What ranks leave behind: a private registry folder with a file, and a
	// link out of shm-dir that removal must not follow.
	outside := t.TempDir()
	keep := filepath.Join(outside, "keep")
	if err := os.WriteFile(keep, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	reg := filepath.Join(deadDir, "mooncake-pxn-1000-k8s")
	if err := os.Mkdir(reg, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(reg, "ctl.0"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(reg, "escape")); err != nil {
		t.Fatal(err)
	}

	k.setPods(live)
	eventually(t, 10*time.Second, "dead slot link removed", func() bool {
		_, err := os.Lstat(p.slot("pxn-relay-01"))
		return os.IsNotExist(err)
	})
	eventually(t, 10*time.Second, "dead group removed", func() bool {
		_, err := os.Lstat(deadDir)
		return os.IsNotExist(err)
	})
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("collection followed a link out of shm-dir: %v", err)
	}
	if readLink(t, p.slot("pxn-relay-00")) != liveDir {
		t.Fatal("live slot link changed")
	}
	groupDirMode(t, liveDir)
}

func TestShutdownRemovesOnlyOwnSocket(t *testing.T) {
	k := startKubelet(t)
	p := startPlugin(t, k, pluginOpts{})
	reg := k.waitRegistration(30 * time.Second)
	c := k.dial(reg.Endpoint)
	k.setPods(podRes("team-a", "rank-0", resource, map[string][]string{"main": {"pxn-relay-00"}}))
	preStart(t, c, "pxn-relay-00")
	other := filepath.Join(k.dir, "other-vendor.sock")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	k.setPods()

	if err := p.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(k.dir, reg.Endpoint)); !os.IsNotExist(err) {
		t.Fatalf("own socket left behind: %v", err)
	}
	for _, f := range []string{filepath.Join(k.dir, "kubelet.sock"), other, p.slot("pxn-relay-00"), readLink(t, p.slot("pxn-relay-00"))} {
		if _, err := os.Lstat(f); err != nil {
			t.Fatalf("shutdown removed %s: %v", f, err)
		}
	}
}

func TestMetrics(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	l, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	health := l.Addr().String()
	l.Close()
	k := startKubelet(t)
	startPlugin(t, k, pluginOpts{metrics: addr, health: health})
	c := k.dial(k.waitRegistration(30 * time.Second).Endpoint)
	stream, err := c.ListAndWatch(contextFor(t, 30*time.Second), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	recvHealth(t, stream, pluginapi.Healthy)
	allocate(t, c, "pxn-relay-00")
	k.setPods(podRes("ns", "pod", resource, map[string][]string{"main": {"pxn-relay-00"}}))
	preStart(t, c, "pxn-relay-00")

	want := []string{
		`pxn_device_plugin_registrations_total{result="ok"} 1`,
		`pxn_device_plugin_allocations_total{result="ok"} 1`,
		`pxn_device_plugin_prestarts_total{result="ok"} 1`,
		`pxn_device_plugin_devices{health="Healthy"} 16`,
		`pxn_device_plugin_devices{health="Unhealthy"} 0`,
		`pxn_build_info{goversion="` + runtime.Version() + `",revision=`,
	}
	for _, probe := range []string{"/healthz", "/readyz"} {
		eventually(t, 10*time.Second, probe, func() bool {
			resp, err := http.Get("http://" + health + probe)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	var body string
	eventually(t, 10*time.Second, "metrics", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	})
}
