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

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/contract"
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
	t     *testing.T
	cmd   *exec.Cmd
	in    io.Writer
	lines chan string
}

func startLockHolder(t *testing.T, g *faultGroup) *lockHolder {
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

// crossTraffic has a and b write n Pieces each through each other (a to
// rail 1 relayed by b, b to rail 0 relayed by a) and returns how long the
// slower took. Every task must complete through PXN.
func crossTraffic(t *testing.T, g *faultGroup, a, b *faultProc, n int, round int) time.Duration {
	t.Helper()
	off := uint64(round*n) * faultPiece
	start := time.Now()
	a.submit(true, faultWrites(1, n, faultPiece, 0, off)...)
	b.submit(true, faultWrites(0, n, faultPiece, 0, off)...)
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

// A process holding the group's registry lock, stopped, while a peer dies:
// the live ranks' pumps need the lock for stale cleanup, freeing the dead
// sender's lanes and releasing their own lanes on the dead relay, and must
// not wait for it. Their transfers go on at the undisturbed rate; once the
// lock is free the cleanup finishes within the heartbeat timeout. Runs
// with and without a frozen holder alternate, each frozen one with a peer
// of its own dying, so that a loaded machine slows both kinds alike.
func TestFaultFrozenLockHolder(t *testing.T) {
	const (
		hbTimeout = time.Second
		pieces    = 300
		runs      = 3
	)
	g := newFaultGroup(t, faultGroupOpts{rails: 2 + runs, tgtBytes: (2*runs + 1) * pieces * faultPiece,
		env: map[string]string{contract.EnvHeartbeatTimeout: fmt.Sprint(hbTimeout.Milliseconds())}})
	a := g.start("a", 0, pieces*faultPiece)
	b := g.start("b", 1, pieces*faultPiece)
	var victims []*faultProc
	for k := range runs {
		victims = append(victims, g.start(fmt.Sprintf("victim %d", k), 2+k, faultMiB))
	}
	for k := range 2 + runs {
		if k != 0 {
			a.route(faultRail(k), true, 20*time.Second)
		}
		if k != 1 {
			b.route(faultRail(k), true, 20*time.Second)
		}
	}
	for _, v := range victims {
		eventually(t, 20*time.Second, v.name+" attached to a and b", func() bool {
			return g.laneOf(a.pid, v.pid) != nil && g.laneOf(b.pid, v.pid) != nil
		})
	}
	holder := startLockHolder(t, g)

	round := 0
	cross := func() time.Duration {
		d := crossTraffic(t, g, a, b, pieces, round)
		round++
		return d
	}
	cross()
	var undisturbed, frozen time.Duration
	for k, v := range victims {
		if d := cross(); undisturbed == 0 || d < undisturbed {
			undisturbed = d
		}
		holder.do("lock")
		v.kill()
		// Each live rank notices the dead relay at its next refresh and
		// stops routing to it, lock or no lock.
		a.route(faultRail(2+k), false, 10*time.Second)
		b.route(faultRail(2+k), false, 10*time.Second)
		if d := cross(); frozen == 0 || d < frozen {
			frozen = d
		}
		if fs := filesOf(g, v.pid); len(fs) == 0 {
			t.Fatal("a dead rank's files went while the lock was held: the test did not hold the lock")
		}
		holder.do("unlock")
		freed := time.Now()
		eventually(t, hbTimeout, "the dead rank's files removed", func() bool { return len(filesOf(g, v.pid)) == 0 })
		eventually(t, hbTimeout, "the dead rank's lanes freed", func() bool {
			return g.laneOf(a.pid, v.pid) == nil && g.laneOf(b.pid, v.pid) == nil
		})
		t.Logf("cleanup finished %v after the lock was freed", time.Since(freed).Round(time.Millisecond))
	}
	ratio := float64(undisturbed) / float64(frozen)
	t.Logf("%d Pieces each way, best of %d: undisturbed %v, under a frozen lock holder %v: %.2f of the undisturbed rate", pieces, runs, undisturbed, frozen, ratio)
	if ratio < 0.9 {
		t.Errorf("under a frozen lock holder the live ranks ran at %.2f of the undisturbed rate, want at least 0.9", ratio)
	}
}
