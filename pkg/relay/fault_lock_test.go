// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
)

// faultLockHolder takes and drops an exclusive flock on path as its parent
// says on stdin ("lock", "unlock"), and answers each with a line.
func faultLockHolder(path string) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		how := unix.LOCK_EX
		if sc.Text() == "unlock" {
			how = unix.LOCK_UN
		}
		if err := unix.Flock(fd, how); err != nil {
			return fmt.Errorf("flock %s: %w", path, err)
		}
		fmt.Println(sc.Text() + "ed")
	}
	return sc.Err()
}

// lockHolder is a process that takes the group's registry lock when told.
type lockHolder struct {
	t     testing.TB
	cmd   *exec.Cmd
	in    io.Writer
	lines chan string
}

func startLockHolder(t testing.TB, g *faultGroup) *lockHolder {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), faultRoleEnv+"=lock", faultLockEnv+"="+filepath.Join(g.registryDir(), ".lock"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	h := &lockHolder{t: t, cmd: cmd, lines: make(chan string, 4)}
	if h.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	return h
}

// do sends cmd ("lock", "unlock") and waits for it to be done. A stopped
// holder is continued first and stopped again after a lock.
func (h *lockHolder) do(cmd string) {
	h.t.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		h.t.Fatal(err)
	}
	fmt.Fprintln(h.in, cmd)
	select {
	case l := <-h.lines:
		if l != cmd+"ed" {
			h.t.Fatalf("lock holder answered %q to %q", l, cmd)
		}
	case <-time.After(faultCallTimeout):
		h.t.Fatalf("lock holder did not %s", cmd)
	}
	if cmd == "lock" {
		if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			h.t.Fatal(err)
		}
	}
}

// Rounds of crossTraffic write into one of crossDstSlots target regions
// from one of crossSrcSlots source regions; the two counts are coprime, so
// a region always gets other bytes than it held and every round is checked.
const (
	crossDstSlots = 4
	crossSrcSlots = 3
)

// crossTraffic has a and b write n Pieces each through each other (a to
// rail 1 relayed by b, b to rail 0 relayed by a) and returns how long the
// slower took. Every task must complete through PXN.
func crossTraffic(t testing.TB, g *faultGroup, a, b *faultProc, n int, round int) time.Duration {
	t.Helper()
	size := uint64(n) * faultPiece
	dst, src := uint64(round%crossDstSlots)*size, uint64(round%crossSrcSlots)*size
	start := time.Now()
	a.submit(true, faultWrites(1, n, faultPiece, src, dst)...)
	b.submit(true, faultWrites(0, n, faultPiece, src, dst)...)
	ta := a.wait(faultCallTimeout)
	tb := b.wait(faultCallTimeout)
	took := time.Since(start)
	for _, p := range []struct {
		who   string
		tasks []faultTask
	}{{"a", ta}, {"b", tb}} {
		for _, tk := range p.tasks {
			if tk.State != "completed" || tk.Route != "pxn" {
				t.Fatalf("round %d: %s's task %+v did not complete through PXN", round, p.who, tk)
			}
		}
	}
	g.verify(0, ta)
	g.verify(1, tb)
	a.call(faultReq{Op: "forget"})
	b.call(faultReq{Op: "forget"})
	return took
}

// staleEntry leaves the files of a registration that the next registrant
// to hold the lock removes: a control file and an arena naming a running
// pid (the test's) of this PID namespace under another start time, a
// reused pid. It returns the arena's name.
func staleEntry(t testing.TB, g *faultGroup, k int) string {
	t.Helper()
	ns, err := staging.SelfPidNS()
	if err != nil {
		t.Fatal(err)
	}
	id := staging.Identity{Pid: os.Getpid(), StartTime: 1, Epoch: uint64(k + 1)}
	suffix := fmt.Sprintf("%d-%d-%016x", id.Pid, id.StartTime, id.Epoch)
	h := staging.Header{
		Magic: staging.RegistryMagic, ABIVersion: staging.ABIVersion, HeaderSize: uint32(unsafe.Sizeof(staging.Header{})),
		State: staging.StateInit, UID: uint32(os.Geteuid()), Pid: uint64(id.Pid), StartTime: id.StartTime, BootEpoch: id.Epoch,
		LaneCount: staging.LaneCount, SlotsPerLane: staging.SlotsPerLane, SlotSize: staging.SlotSize, ArenaSize: staging.ArenaSize,
		ArenaKind: staging.ArenaHost, RailLen: 1, Rail: [48]byte{'x'}, ArenaShares: staging.ShareIPCHandle,
		PidNSDev: ns.Dev, PidNSIno: ns.Ino,
	}
	ctl := filepath.Join(g.registryDir(), ".rank-"+suffix+".tmp")
	if err := os.WriteFile(ctl, unsafe.Slice((*byte)(unsafe.Pointer(&h)), unsafe.Sizeof(h)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(ctl, int64(staging.ControlSize)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g.registryDir(), "arena-"+suffix), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return "arena-" + suffix
}

func hasFile(g *faultGroup, name string) bool {
	for _, f := range g.files() {
		if f == name {
			return true
		}
	}
	return false
}

// lockContention is a rank's registry.LockContention: its calls that found
// the registry lock held and gave up (busy) or waited for it (waited).
func lockContention(p *faultProc) (busy, waited uint64) {
	p.t.Helper()
	r := p.counters()
	return r.LockBusy, r.LockWaited
}

// A process holding the group's registry lock, stopped, while the live
// ranks' pumps need it: first a peer dies (stale cleanup, freeing the dead
// sender's lanes, releasing their own lanes on the dead relay), then, run
// after run, a stale file appears. The pumps must not wait for the lock:
// each finds it held, gives up and leaves the work for a later refresh
// (their registry calls count no-wait attempts that found it busy, and
// none that waited), and their transfers complete through PXN while the
// holder is still stopped. Once the lock is free the cleanup finishes,
// also when the holder dies instead of unlocking. The test judges counts
// and states; the transfer rate under a frozen holder against the
// undisturbed one is BenchmarkFaultFrozenLockHolder's figure.
func TestFaultFrozenLockHolder(t *testing.T) {
	const (
		hbTimeout  = time.Second
		pieces     = 300
		frozenRuns = 3
		// settle bounds the waits for what a refresh does: a pump's next
		// try of the lock, and the cleanup once the lock is free, both
		// within the 1 s heartbeat timeout on a quiet machine
		// (docs/registry.md); the rest of it is for a loaded one.
		settle = 20 * time.Second
	)
	g := newFaultGroup(t, faultGroupOpts{rails: 3, tgtBytes: crossDstSlots * pieces * faultPiece,
		env: map[string]string{contract.EnvHeartbeatTimeout: fmt.Sprint(hbTimeout.Milliseconds())}})
	a := g.start("a", 0, crossSrcSlots*pieces*faultPiece)
	b := g.start("b", 1, crossSrcSlots*pieces*faultPiece)
	c := g.start("c", 2, faultMiB)
	for _, r := range []struct {
		p     *faultProc
		rails []int
	}{{a, []int{1, 2}}, {b, []int{0, 2}}} {
		for _, k := range r.rails {
			r.p.route(faultRail(k), true, 20*time.Second)
		}
	}
	eventually(t, 20*time.Second, "c attached to a and b", func() bool {
		return g.laneOf(a.pid, c.pid) != nil && g.laneOf(b.pid, c.pid) != nil
	})
	holder := startLockHolder(t, g)
	round := 0
	cross := func() {
		crossTraffic(t, g, a, b, pieces, round)
		round++
	}
	cross()

	// freeze has the stopped holder take the lock; frozenChecks, while it
	// still holds it, that both live ranks found it held since and never
	// waited for it.
	live := []*faultProc{a, b}
	var busy0, waited0 [2]uint64
	freeze := func() {
		for i, p := range live {
			busy0[i], waited0[i] = lockContention(p)
		}
		holder.do("lock")
	}
	frozenChecks := func(when string) {
		t.Helper()
		for i, p := range live {
			eventually(t, settle, fmt.Sprintf("%s: %s's pump finding the lock held", when, p.name), func() bool {
				busy, _ := lockContention(p)
				return busy > busy0[i]
			})
			if _, waited := lockContention(p); waited != waited0[i] {
				t.Errorf("%s: %s waited %d times for the lock that a stopped process holds", when, p.name, waited-waited0[i])
			}
		}
	}

	freeze()
	c.kill()
	// Each live rank notices the dead relay at its next refresh and stops
	// routing to it, lock or no lock.
	a.route(faultRail(2), false, 10*time.Second)
	b.route(faultRail(2), false, 10*time.Second)
	cross()
	frozenChecks("a peer dead")
	if len(filesOf(g, c.pid)) == 0 {
		t.Fatal("the dead rank's files went while the lock was held: the test did not hold the lock")
	}
	holder.do("unlock")
	freed := time.Now()
	eventually(t, settle, "the dead rank's files removed", func() bool { return len(filesOf(g, c.pid)) == 0 })
	eventually(t, settle, "the dead rank's lanes freed", func() bool {
		return g.laneOf(a.pid, c.pid) == nil && g.laneOf(b.pid, c.pid) == nil
	})
	t.Logf("the dead rank cleaned up %v after the lock was freed", time.Since(freed).Round(time.Millisecond))

	for i := range frozenRuns {
		freeze()
		name := staleEntry(t, g, i)
		cross()
		frozenChecks(fmt.Sprintf("stale file %d", i))
		if !hasFile(g, name) {
			t.Fatal("a stale file went while the lock was held: the test did not hold the lock")
		}
		holder.do("unlock")
		freed := time.Now()
		eventually(t, settle, "the stale file removed", func() bool { return !hasFile(g, name) })
		t.Logf("stale file %d cleaned up %v after the lock was freed", i, time.Since(freed).Round(time.Millisecond))
	}

	// A holder that dies frozen frees the lock with it.
	freeze()
	name := staleEntry(t, g, frozenRuns)
	cross()
	frozenChecks("before the holder died")
	if err := holder.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	eventually(t, settle, "the stale file removed after the holder died", func() bool { return !hasFile(g, name) })
	t.Logf("stale file cleaned up %v after the holder was killed", time.Since(killed).Round(time.Millisecond))
}

// BenchmarkFaultFrozenLockHolder is the rate that TestFaultFrozenLockHolder
// does not judge: two ranks relay for each other, each iteration a run of
// 300 Pieces of 64 KiB each way undisturbed and one while a stopped process
// holds the registry lock and a stale file waits for it, in turn first and
// second, so that a loaded machine slows both kinds alike. It reports both
// rates and the frozen runs' share of the undisturbed rate: the pumps never
// wait for the lock, so about 1 (docs/reliability.md).
func BenchmarkFaultFrozenLockHolder(b *testing.B) {
	const pieces = 300
	g := newFaultGroup(b, faultGroupOpts{tgtBytes: crossDstSlots * pieces * faultPiece})
	x := g.start("a", 0, crossSrcSlots*pieces*faultPiece)
	y := g.start("b", 1, crossSrcSlots*pieces*faultPiece)
	x.route(faultRail(1), true, 20*time.Second)
	y.route(faultRail(0), true, 20*time.Second)
	holder := startLockHolder(b, g)
	var took [2]time.Duration
	round, runs := 0, 0
	for b.Loop() {
		for j := range 2 {
			frozen := (runs + j) % 2
			if frozen == 0 {
				took[0] += crossTraffic(b, g, x, y, pieces, round)
				round++
				continue
			}
			holder.do("lock")
			name := staleEntry(b, g, runs)
			took[1] += crossTraffic(b, g, x, y, pieces, round)
			round++
			holder.do("unlock")
			eventually(b, 20*time.Second, "the stale file removed", func() bool { return !hasFile(g, name) })
		}
		runs++
	}
	mb := float64(runs*2*pieces*faultPiece) / 1e6
	b.ReportMetric(mb/took[0].Seconds(), "undisturbed-MB/s")
	b.ReportMetric(mb/took[1].Seconds(), "frozen-MB/s")
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "frozen/undisturbed")
}
