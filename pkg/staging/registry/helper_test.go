// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// The test binary doubles as a rank process: with registryHelperEnv set,
// TestMain runs a helper role instead of the tests.
const (
	registryHelperEnv = "PXN_REGISTRY_TEST_HELPER"
	// Settings of the "rank" role.
	helperRootEnv    = "PXN_REGISTRY_TEST_ROOT"
	helperGroupEnv   = "PXN_REGISTRY_TEST_GROUP"
	helperRailEnv    = "PXN_REGISTRY_TEST_RAIL"
	helperFailEnv    = "PXN_REGISTRY_TEST_FAIL_STEP" // InitStep number to fail
	helperHangEnv    = "PXN_REGISTRY_TEST_HANG_STEP" // InitStep number to block at
	helperMemFailEnv = "PXN_REGISTRY_TEST_MEM_FAIL"  // "1": the NIC registration fails

	// childWait bounds every wait for a helper process.
	childWait = 60 * time.Second
	// fillBytes is how much the fill command writes.
	fillBytes = 1 << 20
)

func TestMain(m *testing.M) {
	if role := os.Getenv(registryHelperEnv); role != "" {
		os.Exit(runRegistryHelper(role))
	}
	os.Exit(m.Run())
}

func runRegistryHelper(role string) int {
	switch role {
	case "rank":
		return helperRank()
	case "reshape":
		return helperReshape()
	case "exit":
		return 0
	case "hog":
		return helperHog()
	case "openlane":
		return helperOpenLane()
	}
	fmt.Fprintf(os.Stderr, "unknown helper role %q\n", role)
	return 2
}

type failingRegistrar struct{}

func (failingRegistrar) Register(base uintptr, size uint64) error {
	return errors.New("NIC registration failed after part of the arena")
}
func (failingRegistrar) Deregister(base uintptr, size uint64) error { return nil }

// helperRank registers, says "ready <name>", then obeys one command per
// line of stdin and answers with one line each:
//
//	peers            -> "peers <usable> <name>..." or "peers-error <err>"
//	attach <name>    -> "attached <name> <lane> <lane epoch> <share>" or "attach-error <err>"
//	detach <name>    -> "detached <name>"
//	fill <name> <b>  -> "filled <name>": fillBytes bytes of value b written
//	                    at the start of the lane it holds on <name>
//	sum <lane>       -> "sum <lane> <hex>": FNV-1a of the first fillBytes
//	                    bytes of its own inbound lane's staging memory
//	close            -> "closed" or "close-error <err>"
//	pause            -> "paused": no heartbeat is written after the answer
//	resume           -> "resumed": heartbeats go on
//	reregister       -> "ready <name>": closed and registered again, a new
//	                    epoch of the same process
//
// End of stdin closes the rank and exits.
func helperRank() int {
	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	opts := regOptions(os.Getenv(helperRootEnv), os.Getenv(helperGroupEnv), os.Getenv(helperRailEnv))
	failStep, _ := strconv.Atoi(os.Getenv(helperFailEnv))
	hangStep, _ := strconv.Atoi(os.Getenv(helperHangEnv))
	inject := func(s InitStep) error {
		switch int(s) {
		case failStep:
			return errors.New("injected")
		case hangStep:
			fmt.Println("hanging")
			for in.Scan() {
			}
			return errors.New("released")
		}
		return nil
	}
	if os.Getenv(helperMemFailEnv) == "1" {
		opts.Memory = failingRegistrar{}
	}
	r, err := register(ctx, opts, &hooks{beforeStep: inject})
	if err != nil {
		fmt.Println("register-error", oneLine(err))
		return 3
	}
	fmt.Println("ready", r.Name())

	// beating holds the rank that beats, nil while paused; beatMu makes
	// "paused" mean that no beat follows the answer.
	var beatMu sync.Mutex
	beating := r
	setBeating := func(b *Rank) {
		beatMu.Lock()
		beating = b
		beatMu.Unlock()
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				beatMu.Lock()
				if beating != nil {
					beating.Heartbeat(staging.MonoNanos())
				}
				beatMu.Unlock()
			}
		}
	}()
	stopBeats := sync.OnceFunc(func() { close(stop); <-stopped })
	defer stopBeats()

	links := make(map[string]*PeerLink)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "peers":
			ps, err := r.Peers(ctx)
			if err != nil {
				fmt.Println("peers-error", oneLine(err))
				continue
			}
			var names []string
			for _, p := range ps {
				if p.Refused == nil {
					names = append(names, p.Name)
				}
			}
			sort.Strings(names)
			fmt.Println("peers", len(names), strings.Join(names, " "))
		case "attach":
			l, err := helperAttach(ctx, r, f[1])
			if err != nil {
				fmt.Println("attach-error", oneLine(err))
				continue
			}
			links[f[1]] = l
			fmt.Println("attached", f[1], l.LaneIndex(), l.LaneEpoch(), folder.ShareName(l.ArenaShare()))
		case "fill":
			b, _ := strconv.Atoi(f[2])
			mem := foreignBytes(links[f[1]].StagingBase(), fillBytes)
			for i := range mem {
				mem[i] = byte(b) + byte(i)
			}
			fmt.Println("filled", f[1])
		case "sum":
			lane, _ := strconv.Atoi(f[1])
			mem := foreignBytes(r.Arena().Base()+uintptr(staging.LaneOffset(lane)), fillBytes)
			h := fnv.New64a()
			h.Write(mem)
			fmt.Printf("sum %d %016x\n", lane, h.Sum64())
		case "steal":
			lane, _ := strconv.Atoi(f[2])
			fmt.Println("steal", helperSteal(r, links[f[1]], lane))
		case "holds":
			fmt.Println("holds", helperHolds(f[1]))
		case "mapmodes":
			fmt.Println("mapmodes", helperMapModes(f[1]))
		case "droplease":
			// The lease's connection ends without a release, the lane
			// still mapped: what a holder that closes a stray descriptor
			// does.
			l := links[f[1]]
			unix.Close(l.leaseFd)
			l.leaseFd = -1
			fmt.Println("dropped", f[1])
		case "post":
			seq, _ := strconv.ParseUint(f[2], 10, 64)
			fmt.Println("posted", helperPost(links[f[1]], seq))
		case "words":
			lane, _ := strconv.Atoi(f[1])
			fmt.Println("words", helperWords(r, lane))
		case "detach":
			if err := links[f[1]].Close(); err != nil {
				fmt.Println("detach-error", oneLine(err))
				continue
			}
			fmt.Println("detached", f[1])
		case "pause":
			setBeating(nil)
			fmt.Println("paused")
		case "resume":
			setBeating(r)
			fmt.Println("resumed")
		case "reregister":
			setBeating(nil)
			if err := r.Close(ctx); err != nil {
				fmt.Println("close-error", oneLine(err))
				continue
			}
			if r, err = register(ctx, opts, &hooks{beforeStep: inject}); err != nil {
				fmt.Println("register-error", oneLine(err))
				return 3
			}
			links = make(map[string]*PeerLink)
			setBeating(r)
			fmt.Println("ready", r.Name())
		case "close":
			stopBeats()
			if err := r.Close(ctx); err != nil {
				fmt.Println("close-error", oneLine(err))
				continue
			}
			fmt.Println("closed")
		default:
			fmt.Println("unknown-command", f[0])
		}
	}
	stopBeats()
	if err := r.Close(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
		return 4
	}
	return 0
}

func helperAttach(ctx context.Context, r *Rank, name string) (*PeerLink, error) {
	// Attach takes the PeerInfo from Peers; a closing peer is no longer
	// listed, so a name that is not there is attached by identity, which
	// Attach re-validates under the lock.
	ps, err := r.Peers(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range ps {
		if p.Name == name {
			return r.Attach(ctx, p)
		}
	}
	kind, id := folder.ParseEntryName(name)
	if kind != folder.EntryRank {
		return nil, fmt.Errorf("%q is not a rank name", name)
	}
	return r.Attach(ctx, PeerInfo{Name: name, Identity: id})
}

// helperSteal claims a lane of l's relay as a member may try to take one
// it does not hold: with the owner words of lane, as the relay's control
// file shows them to anyone who reads it. It says "refused <error>" or
// "got lane <n>".
func helperSteal(r *Rank, l *PeerLink, lane int) string {
	l.viewMu.Lock()
	err := l.read()
	owner, _ := l.view.Lanes[lane].Owner.Load()
	ns := l.view.Lanes[lane].Owner.LoadNS()
	l.viewMu.Unlock()
	if err != nil {
		return "refused " + oneLine(err)
	}
	c, err := dialArenaSocket(r.d, folder.SockFileName(l.peer.Identity), fdRequest{Owner: owner, NS: ns}, 0, staging.MonoNanos())
	if err != nil {
		return "refused " + oneLine(err)
	}
	defer c.close()
	for {
		ans, fds, done, err := c.poll(10 * time.Millisecond)
		if !done && staging.MonoNanos() < c.deadline {
			continue
		}
		if err != nil || !done {
			return fmt.Sprintf("refused %v", err)
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		return fmt.Sprintf("got lane %d", ans.Lane)
	}
}

// helperHolds lists what of arena's memory this process holds: each
// descriptor and each mapping of one of its memfds, as "fd:<memfd name>"
// and "map:<memfd name>:<bytes>", sorted; "none" for nothing.
func helperHolds(arena string) string {
	var held []string
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.Contains(target, "memfd:"+arena) {
			held = append(held, "fd:"+memfdName(target))
		}
	}
	maps, _ := os.ReadFile("/proc/self/maps")
	for _, line := range strings.Split(string(maps), "\n") {
		if !strings.Contains(line, "memfd:"+arena) {
			continue
		}
		r, _, _ := strings.Cut(line, " ")
		lo, hi, _ := strings.Cut(r, "-")
		start, _ := strconv.ParseUint(lo, 16, 64)
		end, _ := strconv.ParseUint(hi, 16, 64)
		held = append(held, fmt.Sprintf("map:%s:%d", memfdName(line), end-start))
	}
	if len(held) == 0 {
		return "none"
	}
	sort.Strings(held)
	return strings.Join(held, " ")
}

// helperMapModes lists the permissions of this process's mappings of
// name's memfds, as "<memfd name>:<perms>", sorted.
func helperMapModes(name string) string {
	var modes []string
	maps, _ := os.ReadFile("/proc/self/maps")
	for _, line := range strings.Split(string(maps), "\n") {
		if f := strings.Fields(line); len(f) >= 6 && strings.Contains(line, "memfd:"+name) {
			modes = append(modes, memfdName(line)+":"+f[1])
		}
	}
	sort.Strings(modes)
	return strings.Join(modes, " ")
}

// helperPost commits a Desc of seq into the slot of seq in l's sender
// block and rings its doorbell, by hand, whether or not the relay opened
// the lane: what a holder that ran on without its lease would write.
func helperPost(l *PeerLink, seq uint64) string {
	w := l.blocks.sender()
	d := &w.Descs[staging.SlotOf(seq)]
	if err := d.Fill(l.LaneEpoch(), "stale-holder", []staging.PlanEntry{{Dst: 0x1000, Len: 8}}, 8, nil); err != nil {
		return oneLine(err)
	}
	staging.PublishDesc(d, seq)
	staging.RingDoorbell(&w.Ready[staging.SlotOf(seq)].Seq, seq)
	return "ok"
}

// helperWords reports, of each mapping of lane's sender block in this
// process (the relay's, one per claim it keeps), the commit seq and the
// doorbell of slot 0: "<mappings> <commit>/<doorbell>...".
func helperWords(r *Rank, lane int) string {
	maps, _ := os.ReadFile("/proc/self/maps")
	name := fmt.Sprintf("memfd:%s.lane%d.sender ", r.Name(), lane)
	var seen []string
	for _, line := range strings.Split(string(maps), "\n") {
		if !strings.Contains(line, name) {
			continue
		}
		lo, _, _ := strings.Cut(line, "-")
		start, err := strconv.ParseUint(lo, 16, 64)
		if err != nil {
			continue
		}
		// start is a shared mapping of this process, not Go memory.
		p := uintptr(start)
		w := (*staging.LaneSenderBlock)(*(*unsafe.Pointer)(unsafe.Pointer(&p)))
		seen = append(seen, fmt.Sprintf("%d/%d", staging.LoadCommitSeq(&w.Descs[0]), atomic.LoadUint64(&w.Ready[0].Seq)))
	}
	return strconv.Itoa(len(seen)) + " " + strings.Join(seen, " ")
}

// memfdName is the memfd's name in a /proc link or maps line.
func memfdName(s string) string {
	_, name, _ := strings.Cut(s, "memfd:")
	name, _, _ = strings.Cut(name, " ")
	return name
}

// foreignBytes is n bytes at addr, memory mapped outside Go's heap.
func foreignBytes(addr uintptr, n int) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr))), n)
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " | ") }

// regChild is a helper process seen from the test.
type regChild struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr bytes.Buffer
	done   chan struct{}
	err    error // of Wait, valid after done
}

type childOpts struct {
	root, group, rail string
	env               []string
	exe               string
	cred              *syscall.Credential
	// pidns runs the child in a PID namespace of its own, as a rank of
	// another pod (see needPidNS); pid() is then unshare's pid, and killing
	// it kills the child.
	pidns bool
}

func startRegChild(t *testing.T, o childOpts) *regChild {
	t.Helper()
	exe := o.exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			t.Fatal(err)
		}
	}
	if o.rail == "" {
		o.rail = "rail0"
	}
	c := &regChild{t: t, lines: make(chan string, 64), done: make(chan struct{})}
	c.cmd = exec.Command(exe)
	if o.pidns {
		c.cmd = exec.Command("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", exe)
	}
	c.cmd.Dir = "/"
	c.cmd.Env = append(os.Environ(),
		registryHelperEnv+"=rank",
		helperRootEnv+"="+o.root,
		helperGroupEnv+"="+o.group,
		helperRailEnv+"="+o.rail)
	c.cmd.Env = append(c.cmd.Env, o.env...)
	c.cmd.Stderr = &c.stderr
	if o.cred != nil {
		c.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: o.cred}
	}
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			c.lines <- s.Text()
		}
		close(c.lines)
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.stdin.Close()
		select {
		case <-c.done:
		case <-time.After(childWait):
			c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

func (c *regChild) pid() int { return c.cmd.Process.Pid }

func (c *regChild) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		c.t.Fatalf("child %d: send %q: %v", c.pid(), line, err)
	}
}

// expect returns the rest of the child's next line, which must start with
// word.
func (c *regChild) expect(word string) string {
	c.t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			<-c.done
			c.t.Fatalf("child %d exited (%v) while we waited for %q; stderr:\n%s", c.pid(), c.err, word, c.stderr.String())
		}
		got, rest, _ := strings.Cut(line, " ")
		if got != word {
			c.t.Fatalf("child %d said %q, want %q ...", c.pid(), line, word)
		}
		return rest
	case <-time.After(childWait):
		c.t.Fatalf("child %d said nothing for %v while we waited for %q", c.pid(), childWait, word)
	}
	return ""
}

// finish closes the child's stdin and waits for a clean exit; it returns
// the child's stderr.
func (c *regChild) finish() string {
	c.t.Helper()
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(childWait):
		c.t.Fatalf("child %d did not exit", c.pid())
	}
	if c.err != nil {
		c.t.Fatalf("child %d: %v; stderr:\n%s", c.pid(), c.err, c.stderr.String())
	}
	return c.stderr.String()
}

// kill ends the child with SIGKILL and reaps it.
func (c *regChild) kill() {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(childWait):
		c.t.Fatalf("child %d survived SIGKILL", c.pid())
	}
}

// regTestRoot is a registry root of the test's own under /dev/shm (a
// temporary directory where there is no /dev/shm), removed at the end.
func regTestRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "pxn-registry-test-")
	if err != nil {
		t.Logf("no /dev/shm (%v): using a temporary directory", err)
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// testHeartbeatTimeout keeps ranks that do not beat (those a test runs in
// its own process have no pump) fresh on a loaded machine; tests of
// staleness write heartbeats older than it.
const testHeartbeatTimeout = 30 * time.Second

// regOptions logs to klog's default (stderr), which the multi-process tests
// read.
func regOptions(root, group, rail string) Options {
	return Options{Root: root, Group: group, UID: os.Geteuid(), Rail: rail, HCA: "hca-" + rail, HeartbeatTimeout: testHeartbeatTimeout, Logger: klog.Background()}
}

func mustRegister(t testing.TB, o Options) *Rank {
	t.Helper()
	r, err := Register(context.Background(), o)
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	return r
}

func groupDir(root, group string) string {
	return filepath.Join(root, folder.GroupDirPrefix+strconv.Itoa(os.Geteuid())+"-"+group)
}

// listDir returns the sorted names in dir, or nil when dir does not exist
// or is no directory.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// pollUntil polls cond every millisecond until it holds or the deadline
// passes.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(childWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
