// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/relay"
)

// The test binary doubles as a PXN rank: with rankRoleEnv set, TestMain runs
// a real engine (the real registry in a group folder under /dev/shm, host
// arenas, a loopback hop standing in for the NIC) that obeys one command per
// line of stdin and answers one line on stdout.
const (
	rankRoleEnv  = "PXN_AGENT_TEST_RANK"
	rankIndexEnv = "PXN_AGENT_TEST_RANK_INDEX"
	// rankTargetBytes is each target session's buffer in a rank process.
	rankTargetBytes = 32 << 20
	// rankWait bounds every answer of a rank process: generous, for a
	// loaded two-core machine running the race detector.
	rankWait = time.Minute
)

func rankHCA(k int) string     { return fmt.Sprintf("mlx5_%d", k) }
func remoteHCA(k int) string   { return fmt.Sprintf("rmlx5_%d", k) }
func rankRail(k int) string    { return fmt.Sprintf("rail%d", k) }
func rankSession(k int) string { return fmt.Sprintf("metrics/rail%d", k) }

const rankTargetBase = 0x7e0000000000

func rankTarget(k int) uint64 { return rankTargetBase + uint64(k)<<32 }

func mapBytes(n int) ([]byte, error) {
	return unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
}

// runRankRole is a rank process. Commands: "route RAIL" (wait for a relay
// on RAIL), "write RAIL BYTES" (one write to the target session on RAIL,
// waited for), "exit".
func runRankRole() int {
	k, err := strconv.Atoi(os.Getenv(rankIndexEnv))
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	hop := fabric.NewLoopback(fabric.LoopbackOptions{})
	for j := range 3 {
		buf, err := mapBytes(rankTargetBytes)
		if err == nil {
			err = hop.AddTarget(rankSession(j), remoteHCA(j), buf, rankTarget(j))
		}
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
	}
	src, err := mapBytes(rankTargetBytes)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	copier := cpucopy.NewHostCopier()
	base := uintptr(unsafe.Pointer(&src[0]))
	if err := copier.RegisterDevice(base, uint64(len(src))); err != nil {
		fmt.Println("error", err)
		return 1
	}
	ctx := context.Background()
	eng, err := engineopen.OpenFromEnv(ctx, nil, engineopen.HostDeps{Hop: hop, Directory: hop, Copier: copier, LocalHCA: rankHCA(k)})
	if err != nil || !eng.PXNActive() {
		fmt.Println("error engine without PXN:", err)
		return 1
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 2 && f[0] == "route":
			deadline := time.Now().Add(rankWait)
			for !eng.HasRelay(f[1]) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			fmt.Println("routed", eng.HasRelay(f[1]))
		case len(f) == 3 && f[0] == "write":
			j, _ := strconv.Atoi(strings.TrimPrefix(f[1], "rail"))
			n, _ := strconv.ParseUint(f[2], 10, 64)
			b, err := eng.Submit([]relay.Request{{Op: relay.Write, Src: base, Len: n, Target: rankSession(j), Dst: rankTarget(j)}})
			if err != nil {
				fmt.Println("error", err)
				continue
			}
			deadline := time.Now().Add(rankWait)
			for !b.Done() && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			st, _ := b.Status(0)
			fmt.Println("done", st.State == relay.Completed)
			b.Release()
		case len(f) == 1 && f[0] == "exit":
			if err := eng.Close(ctx); err != nil {
				fmt.Println("error", err)
				return 1
			}
			fmt.Println("closed")
			return 0
		default:
			fmt.Println("error unknown command", f)
		}
	}
	return 0
}

// rankProc is a rank process the test started.
type rankProc struct {
	t     *testing.T
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

func startRank(t *testing.T, k int, registryRoot string) *rankProc {
	t.Helper()
	rm, err := contract.EncodeRailMap(map[string]string{
		rankHCA(0): rankRail(0), rankHCA(1): rankRail(1), rankHCA(2): rankRail(2),
		remoteHCA(0): rankRail(0), remoteHCA(1): rankRail(1), remoteHCA(2): rankRail(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), rankRoleEnv+"=1", rankIndexEnv+"="+strconv.Itoa(k),
		contract.EnvEnable+"=1", contract.EnvGroupID+"=metrics", contract.EnvRegistryRoot+"="+registryRoot, contract.EnvRailMap+"="+rm)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &rankProc{t: t, name: fmt.Sprintf("rank %d", k), cmd: cmd, in: in, lines: make(chan string, 16)}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			p.lines <- s.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	p.expect("ready")
	return p
}

// expect waits for the next line and checks that it starts with word.
func (p *rankProc) expect(word string) string {
	p.t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("%s exited, want %q", p.name, word)
		}
		if !strings.HasPrefix(line, word) {
			p.t.Fatalf("%s answered %q, want %q", p.name, line, word)
		}
		return line
	case <-time.After(rankWait):
		p.t.Fatalf("%s did not answer %q within %v", p.name, word, rankWait)
	}
	return ""
}

func (p *rankProc) call(cmd, want string) {
	p.t.Helper()
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	if line := p.expect(want); line != want {
		p.t.Fatalf("%s: %s answered %q, want %q", p.name, cmd, line, want)
	}
}

// fakePods is the kubelet's PodResources answer: device ID → pod (the
// agent reads only which pods run).
type fakePods map[string][2]string

func (f fakePods) List(context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for id, pod := range f {
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{
			Namespace: pod[0], Name: pod[1],
			Containers: []*podresourcesv1.ContainerResources{{Name: "main", Devices: []*podresourcesv1.ContainerDevices{
				{ResourceName: "pxn.io/relay", DeviceIds: []string{id}},
				{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-" + id}},
			}}},
		})
	}
	return resp, nil
}

// rankNode is one node's device plugin folders with ranks in them: group
// folder jobA holds ranks 0 and 1 (held by two pods of one job), jobB rank 2,
// registered one folder below the group folder, as pxn-bench does.
type rankNode struct {
	shm        string
	jobA, jobB string
	ranks      []*rankProc
}

// writeOwner writes an owner record of the group folder key in shm as a
// node plugin does.
func writeOwner(t *testing.T, shm, key, id string, o group.Owner) {
	t.Helper()
	dir := contract.OwnersDir(shm)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := group.WriteOwner(dir, key, id, o); err != nil {
		t.Fatal(err)
	}
}

func newRankNode(t *testing.T) *rankNode {
	t.Helper()
	shm, err := os.MkdirTemp("/dev/shm", "pxn-agent-ranks-")
	if err != nil {
		t.Skipf("no /dev/shm for the ranks' arenas: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	n := &rankNode{shm: shm,
		jobA: group.UnkeyedKey("team-a", group.SourceLabel, "job-a"),
		jobB: group.UnkeyedKey("team-b", group.SourceUID, "0b9e0bd2-pod")}
	for dev, key := range map[string]string{"dev-0": n.jobA, "dev-1": n.jobA, "dev-2": n.jobB} {
		dir := filepath.Join(contract.GroupsDir(shm), key)
		if err := os.MkdirAll(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		pod := n.pods()[dev]
		writeOwner(t, shm, key, group.OwnerSlotPrefix+dev, group.Owner{Namespace: pod[0], Pods: []string{pod[1]}})
	}
	jobA := filepath.Join(contract.GroupsDir(shm), n.jobA)
	jobB := filepath.Join(contract.GroupsDir(shm), n.jobB, "bench-registry")
	if err := os.Mkdir(jobB, 0o700); err != nil {
		t.Fatal(err)
	}
	n.ranks = []*rankProc{startRank(t, 0, jobA), startRank(t, 1, jobA), startRank(t, 2, jobB)}
	return n
}

// pods is the kubelet's view: two pods of team-a share jobA, one pod of
// team-b holds jobB.
func (n *rankNode) pods() fakePods {
	return fakePods{"dev-0": {"team-a", "a-0"}, "dev-1": {"team-a", "a-1"}, "dev-2": {"team-b", "b-0"}}
}

// scrape serves c's metrics through the Prometheus handler, as the agent's
// endpoint does, and parses the text it answers.
func scrape(t *testing.T, c prometheus.Collector) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s %v\n%s", resp.Status, err, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return string(body), fams
}

// value is the sample of family name whose labels include want; ok is
// false when there is none.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if got[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}
