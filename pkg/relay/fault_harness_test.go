// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

const (
	faultKiB = 1 << 10
	faultMiB = 1 << 20
	// faultCallTimeout bounds every command to a rank process: a rank that
	// does not answer in time is hung, and the test fails.
	faultCallTimeout = 30 * time.Second
	// faultPiece is the size of most test writes: small, so that a Piece
	// costs little on a loaded machine, and one write is one Piece.
	faultPiece = 64 * faultKiB
)

func faultRail(k int) string    { return fmt.Sprintf("rail%d", k) }
func faultSession(k int) string { return fmt.Sprintf("fault/rail%d", k) }
func faultBase(k int) uint64    { return 0x7d0000000000 + uint64(k)<<32 }

// faultGroup is one job on one node: a registry directory in /dev/shm,
// a target server (the remote node) with one registered buffer per rail, and
// the rank processes the test starts.
type faultGroup struct {
	t     testing.TB
	root  string
	group string
	srv   *fabric.TargetServer
	tgt   []([]byte)
	dir   string
	env   []string

	mu    sync.Mutex
	procs []*faultProc
}

type faultGroupOpts struct {
	rails int
	// tgtBytes is each rail's registered target buffer; dirBytes, when
	// larger, is what the directory claims, so writes beyond tgtBytes pass
	// the sender's and the relay's checks and fail at the target.
	tgtBytes, dirBytes uint64
	// env overrides MC_PXN_* settings of every rank.
	env map[string]string
}

func newFaultGroup(t testing.TB, o faultGroupOpts) *faultGroup {
	t.Helper()
	if o.rails == 0 {
		o.rails = 2
	}
	if o.tgtBytes == 0 {
		o.tgtBytes = 8 * faultMiB
	}
	if o.dirBytes < o.tgtBytes {
		o.dirBytes = o.tgtBytes
	}
	root := "/dev/shm"
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		root = os.TempDir()
	}
	dir, err := os.MkdirTemp(root, "pxn-fault-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	g := &faultGroup{t: t, root: dir, group: "fault"}
	g.srv = fabric.NewTargetServer(fabric.TargetServerOptions{})
	t.Cleanup(func() { g.srv.Close() })
	addr, err := g.srv.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var targets []fabric.StaticTarget
	railMap := map[string]string{}
	for k := 0; k < o.rails; k++ {
		buf, err := unix.Mmap(-1, 0, int(o.tgtBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Munmap(buf) })
		if err := g.srv.Register(faultBase(k), buf); err != nil {
			t.Fatal(err)
		}
		g.tgt = append(g.tgt, buf)
		targets = append(targets, fabric.StaticTarget{Session: faultSession(k), Addr: addr.String(),
			HCAs: []string{fmt.Sprintf("rmlx5_%d", k)}, Ranges: []fabric.StaticRange{{Addr: faultBase(k), Len: o.dirBytes}}})
		railMap[fmt.Sprintf("mlx5_%d", k)] = faultRail(k)
		railMap[fmt.Sprintf("rmlx5_%d", k)] = faultRail(k)
	}
	d, err := fabric.NewStaticDirectory(targets)
	if err != nil {
		t.Fatal(err)
	}
	dj, _ := json.Marshal(d)
	rm, _ := json.Marshal(railMap)
	g.dir = string(dj)
	settings := map[string]string{
		contract.EnvEnable:           "1",
		contract.EnvGroupID:          g.group,
		contract.EnvRegistryRoot:     g.root,
		contract.EnvRailMap:          string(rm),
		contract.EnvHeartbeatTimeout: "3000",
		contract.EnvCreditTimeout:    "60000",
		// The tests count Pieces in whole slots: no ramp.
		contract.EnvFirstPiece: strconv.Itoa(contract.MaxFirstPieceKiB),
	}
	for k, v := range o.env {
		settings[k] = v
	}
	for k, v := range settings {
		g.env = append(g.env, k+"="+v)
	}
	t.Cleanup(g.killAll)
	return g
}

// registryDir is the group's registry directory.
func (g *faultGroup) registryDir() string {
	return filepath.Join(g.root, registry.GroupDirPrefix+strconv.Itoa(os.Geteuid())+"-"+g.group)
}

// faultProc is one rank process.
type faultProc struct {
	t      testing.TB
	name   string
	index  int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan []byte
	stderr *lockedBuffer
	pid    int
	rank   string
	exited chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 1<<20 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *lockedBuffer) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(l.b.String()), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// start runs a rank on rail index with a source buffer of srcBytes; env
// adds settings for this rank only.
func (g *faultGroup) start(name string, index int, srcBytes uint64, env ...string) *faultProc {
	g.t.Helper()
	return g.startProc(false, name, index, srcBytes, env...)
}

// startInPidNS is start in a PID namespace of the rank's own (unshare
// --pid --fork --mount-proc --kill-child), as a rank of another pod:
// p.pid is its pid in there, and killing p kills it.
func (g *faultGroup) startInPidNS(name string, index int, srcBytes uint64, env ...string) *faultProc {
	g.t.Helper()
	return g.startProc(true, name, index, srcBytes, env...)
}

func (g *faultGroup) startProc(pidns bool, name string, index int, srcBytes uint64, env ...string) *faultProc {
	t := g.t
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	if pidns {
		cmd = exec.Command("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", exe, "-test.run=^$")
	}
	cmd.Env = append(os.Environ(), faultRoleEnv+"=rank", faultIndexEnv+"="+strconv.Itoa(index),
		faultDirEnv+"="+g.dir, faultSrcEnv+"="+strconv.FormatUint(srcBytes, 10))
	cmd.Env = append(cmd.Env, g.env...)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &faultProc{t: t, name: name, index: index, cmd: cmd, lines: make(chan []byte, 64), stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.mu.Unlock()
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			p.lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	r := p.read(faultCallTimeout)
	p.pid, p.rank = r.Pid, r.Rank
	if p.rank == "" {
		t.Fatalf("%s: not registered (PXN active %v)\n%s", name, r.PXN, p.stderr.tail(20))
	}
	return p
}

func (p *faultProc) read(timeout time.Duration) faultResp {
	p.t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case line, ok := <-p.lines:
		if !ok {
			<-p.exited
			p.t.Fatalf("%s exited (%v):\n%s", p.name, p.cmd.ProcessState, p.stderr.tail(30))
		}
		var r faultResp
		if err := json.Unmarshal(line, &r); err != nil {
			p.t.Fatalf("%s: unparsable answer %q: %v", p.name, line, err)
		}
		return r
	case <-timer.C:
		p.t.Fatalf("%s: no answer within %v (hung):\n%s", p.name, timeout, p.stderr.tail(30))
	}
	panic("unreachable")
}

// call sends one command and returns the answer; an error answer fails
// the test.
func (p *faultProc) call(req faultReq) faultResp {
	p.t.Helper()
	b, _ := json.Marshal(req)
	if _, err := p.stdin.Write(append(b, '\n')); err != nil {
		p.t.Fatalf("%s: send %s: %v\n%s", p.name, req.Op, err, p.stderr.tail(30))
	}
	timeout := faultCallTimeout + time.Duration(req.TimeoutMS)*time.Millisecond
	r := p.read(timeout)
	if !r.OK {
		p.t.Fatalf("%s: %s: %s", p.name, req.Op, r.Err)
	}
	return r
}

func (p *faultProc) submit(separate bool, ws ...faultWrite) []int {
	p.t.Helper()
	return p.call(faultReq{Op: "submit", Reqs: ws, Separate: separate}).Batches
}

// wait waits until every task of the rank is final and returns them all.
func (p *faultProc) wait(timeout time.Duration) []faultTask {
	p.t.Helper()
	r := p.call(faultReq{Op: "wait", TimeoutMS: int(timeout / time.Millisecond)})
	if !r.Done {
		p.t.Fatalf("%s: tasks still pending after %v: %s", p.name, timeout, pendingSummary(r.Tasks))
	}
	return r.Tasks
}

func (p *faultProc) tasks() []faultTask {
	p.t.Helper()
	return p.call(faultReq{Op: "tasks"}).Tasks
}

func (p *faultProc) counters() faultResp {
	p.t.Helper()
	return p.call(faultReq{Op: "counters"})
}

// asleep reports whether the rank's pump is in its sleep on the wake word
// (pumpAsleep).
func (p *faultProc) asleep() bool {
	p.t.Helper()
	return p.call(faultReq{Op: "asleep"}).Asleep
}

// route waits until the rank has (want) or has not (!want) a relay on rail.
func (p *faultProc) route(rail string, want bool, timeout time.Duration) {
	p.t.Helper()
	if !p.call(faultReq{Op: "route", Rail: rail, Want: want, TimeoutMS: int(timeout / time.Millisecond)}).Reached {
		p.t.Fatalf("%s: relay on %s = %v not reached within %v\n%s", p.name, rail, want, timeout, p.stderr.tail(20))
	}
}

func (p *faultProc) close(timeout time.Duration) faultResp {
	p.t.Helper()
	return p.call(faultReq{Op: "close", TimeoutMS: int(timeout / time.Millisecond)})
}

// exit ends the process after its engine was closed.
func (p *faultProc) exit() {
	p.t.Helper()
	p.call(faultReq{Op: "exit"})
	select {
	case <-p.exited:
	case <-time.After(faultCallTimeout):
		p.t.Fatalf("%s did not exit", p.name)
	}
	if !p.cmd.ProcessState.Success() {
		p.t.Fatalf("%s exited with %v:\n%s", p.name, p.cmd.ProcessState, p.stderr.tail(30))
	}
}

// kill ends the process with SIGKILL and waits for it.
func (p *faultProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

func (p *faultProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func (g *faultGroup) killAll() {
	g.mu.Lock()
	procs := g.procs
	g.procs = nil
	g.mu.Unlock()
	for _, p := range procs {
		if p.alive() {
			p.kill()
		}
	}
}

func pendingSummary(ts []faultTask) string {
	n := 0
	for _, t := range ts {
		if t.State == "pending" {
			n++
		}
	}
	return fmt.Sprintf("%d of %d pending", n, len(ts))
}

// writes returns n writes of size bytes each from rank src offsets 0, size,
// ... to rail k's target at offsets dstOff, dstOff+size, ...
func faultWrites(k, n int, size, srcOff, dstOff uint64) []faultWrite {
	ws := make([]faultWrite, n)
	for i := range ws {
		ws[i] = faultWrite{Session: faultSession(k), Src: srcOff + uint64(i)*size, Dst: faultBase(k) + dstOff + uint64(i)*size, Len: size}
	}
	return ws
}

// verify checks that every completed task of rank index wrote the right
// bytes and moved all of them, and returns the count per state.
func (g *faultGroup) verify(index int, ts []faultTask) map[string]int {
	g.t.Helper()
	n := map[string]int{}
	for _, task := range ts {
		n[task.State]++
		if task.State != "completed" {
			continue
		}
		w := task.Write
		if task.Transferred != w.Len {
			g.t.Errorf("rank %d task %+v: transferred %d of %d bytes", index, w, task.Transferred, w.Len)
		}
		got := g.dest(w)
		want := make([]byte, w.Len)
		faultPattern(want, faultSeed(index), w.Src)
		if i := firstDiff(got, want); i >= 0 {
			g.t.Errorf("rank %d task %+v completed (route %s) but destination byte %d is %#x, want %#x", index, w, task.Route, i, got[i], want[i])
		}
	}
	return n
}

// dest is the destination of w in its rail's target buffer.
func (g *faultGroup) dest(w faultWrite) []byte {
	g.t.Helper()
	for k := range g.tgt {
		if faultSession(k) == w.Session {
			return g.tgt[k][w.Dst-faultBase(k) : w.Dst-faultBase(k)+w.Len]
		}
	}
	g.t.Fatalf("unknown session %q", w.Session)
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// inspect returns the registry's view of the rank whose pid is pid, or
// nil when it has no control file.
func (g *faultGroup) inspect(pid int) *inspect.RankReport {
	g.t.Helper()
	reports, err := inspect.Root(g.root, 3*time.Second)
	if err != nil {
		g.t.Fatal(err)
	}
	for _, gr := range reports {
		for i := range gr.Ranks {
			if gr.Ranks[i].Pid == pid {
				return &gr.Ranks[i]
			}
		}
	}
	return nil
}

// laneOf returns the lane of relay that sender owns, or nil.
func (g *faultGroup) laneOf(relayPid, senderPid int) *inspect.LaneReport {
	g.t.Helper()
	r := g.inspect(relayPid)
	if r == nil {
		return nil
	}
	for i := range r.Lanes {
		if r.Lanes[i].OwnerPid == senderPid {
			return &r.Lanes[i]
		}
	}
	return nil
}

// control maps the control file of a rank of the group (writable: to
// corrupt it) until the end of the test.
func (g *faultGroup) control(p *faultProc, writable bool) *staging.ControlBlock {
	g.t.Helper()
	flags, prot := os.O_RDONLY, unix.PROT_READ
	if writable {
		flags, prot = os.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	}
	f, err := os.OpenFile(filepath.Join(g.registryDir(), p.rank), flags, 0)
	if err != nil {
		g.t.Fatal(err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, int(staging.ControlSize), prot, unix.MAP_SHARED)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { unix.Munmap(mem) })
	return (*staging.ControlBlock)(unsafe.Pointer(&mem[0]))
}

// files lists the registry directory.
func (g *faultGroup) files() []string {
	g.t.Helper()
	es, err := os.ReadDir(g.registryDir())
	if err != nil {
		g.t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// eventually polls cond until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// blockMapping finds, in the maps of process pid, the mapping of lane's
// block of a claim on the relay whose control file is rank ("sender" or
// "relay"), and returns its start; with perms not empty, only a mapping
// with those permissions counts. A relay maps each claim's blocks once,
// and frees a claim's blocks when it follows the next.
func blockMapping(pid int, rank string, lane int, block, perms string) (uintptr, bool) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, false
	}
	name := fmt.Sprintf("memfd:%s.lane%d.%s ", rank, lane, block)
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.Contains(line, name) || perms != "" && f[1] != perms {
			continue
		}
		lo, _, _ := strings.Cut(f[0], "-")
		start, err := strconv.ParseUint(lo, 16, 64)
		if err != nil {
			return 0, false
		}
		return uintptr(start), true
	}
	return 0, false
}

// relayWord reads the 8 bytes at off in the block of lane's claim that
// the relay process p maps (block "sender" or "relay"), from p's memory.
func relayWord(p *faultProc, lane int, block string, off uintptr) (uint64, bool) {
	start, ok := blockMapping(p.pid, p.rank, lane, block, "rw-s")
	if !ok {
		return 0, false
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", p.pid))
	if err != nil {
		return 0, false
	}
	defer mem.Close()
	var b [8]byte
	if _, err := mem.ReadAt(b[:], int64(start+off)); err != nil {
		return 0, false
	}
	return *(*uint64)(unsafe.Pointer(&b[0])), true
}

// relayReadyWords reads the ready words of lane of the relay process p
// from its memory, as a debugger would: the test process is p's parent.
// ok is false while p maps no claim of the lane.
func relayReadyWords(p *faultProc, lane int) (words [staging.SlotsPerLane]uint64, ok bool) {
	start, ok := blockMapping(p.pid, p.rank, lane, "sender", "rw-s")
	if !ok {
		return words, false
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", p.pid))
	if err != nil {
		return words, false
	}
	defer mem.Close()
	var b [8]byte
	for s := range words {
		off := int64(start) + int64(unsafe.Offsetof(staging.LaneSenderBlock{}.Ready)) + int64(s)*int64(unsafe.Sizeof(staging.ReadyWord{}))
		if _, err := mem.ReadAt(b[:], off); err != nil {
			return words, false
		}
		words[s] = *(*uint64)(unsafe.Pointer(&b[0]))
	}
	return words, true
}
