// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// scanObserver registers a rank of this process that watches the group,
// with heartbeat timeout timeout (0: the tests' default) and test set on
// its scan.
func scanObserver(t *testing.T, root, group string, timeout time.Duration, test scanTest) *Rank {
	t.Helper()
	o := regOptions(root, group, "rail-observer")
	if timeout > 0 {
		o.HeartbeatTimeout = timeout
	}
	r := mustRegister(t, o)
	r.scanMu.Lock()
	if test.noPidfd {
		r.scan.host.pidfdOpen = nil
	}
	if test.listEvery > 0 {
		r.scan.host.listEvery = test.listEvery
	}
	r.scanMu.Unlock()
	return r
}

// scanTest takes the paths that other machines take.
type scanTest struct {
	// noPidfd makes every watch read /proc, as where pidfds are missing.
	noPidfd bool
	// listEvery replaces the machine's period when set.
	listEvery time.Duration
}

func listings(r *Rank) int {
	r.scanMu.Lock()
	defer r.scanMu.Unlock()
	return r.scan.listings
}

// nextPeers is one call of Peers; listed says whether it listed the
// directory.
func nextPeers(t *testing.T, r *Rank) (ps []PeerInfo, listed bool) {
	t.Helper()
	before := listings(r)
	ps, err := r.Peers(context.Background())
	if err != nil {
		t.Fatalf("Peers: %v", err)
	}
	return ps, listings(r) != before
}

// settle calls Peers until a call trusts the directory's stat and lists
// nothing, and returns that call's peers.
func settle(t *testing.T, r *Rank) []PeerInfo {
	t.Helper()
	deadline := time.Now().Add(childWait)
	for {
		ps, listed := nextPeers(t, r)
		if !listed {
			return ps
		}
		if time.Now().After(deadline) {
			t.Fatalf("Peers still lists the directory after %v of no change", childWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// noListing fails the test when the call that should have seen a change
// without listing the directory listed it.
func noListing(t *testing.T, listed bool, change string) {
	t.Helper()
	if listed {
		t.Fatalf("the call after %s listed the directory; want the change seen without a listing", change)
	}
}

func findPeer(ps []PeerInfo, name string) (PeerInfo, bool) {
	for _, p := range ps {
		if p.Name == name {
			return p, true
		}
	}
	return PeerInfo{}, false
}

// pokeFile writes b at off of path in place: the directory does not change.
func pokeFile(t *testing.T, path string, off uintptr, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, int64(off)); err != nil {
		t.Fatal(err)
	}
}

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// fileHeartbeat reads the heartbeat stamp of the control file at path.
func fileHeartbeat(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.ReadAt(b[:], int64(unsafe.Offsetof(staging.Header{}.Heartbeat))); err != nil {
		t.Fatal(err)
	}
	return int64(binary.NativeEndian.Uint64(b[:]))
}

func TestPeersSeeInPlaceChangesOnTheNextCall(t *testing.T) {
	root := regTestRoot(t)
	r := scanObserver(t, root, "g", 0, scanTest{listEvery: time.Hour})
	id := staging.Identity{Pid: os.Getpid(), StartTime: selfStart(t), Epoch: 0x5001}
	name := folder.RankFileName(id)
	path := filepath.Join(r.Dir(), name)
	writeFakeRank(t, r.Dir(), id, name, func(h *staging.Header) { h.State = staging.StateInit })
	if p, ok := findPeer(settle(t, r), name); ok {
		t.Fatalf("a rank in INIT is listed: %+v", p)
	}
	stateAt := unsafe.Offsetof(staging.Header{}.State)
	steps := []struct {
		change string
		poke   func()
		// want: listed, and if so refused with this text ("" for usable).
		listed  bool
		refused string
	}{
		{"INIT becomes READY", func() { pokeFile(t, path, stateAt, u32(staging.StateReady)) }, true, ""},
		{"READY becomes CLOSING", func() { pokeFile(t, path, stateAt, u32(staging.StateClosing)) }, false, ""},
		{"CLOSING becomes READY", func() { pokeFile(t, path, stateAt, u32(staging.StateReady)) }, true, ""},
		{"the state becomes garbage", func() { pokeFile(t, path, stateAt, u32(9)) }, true, "state 9"},
		{"the state is READY again", func() { pokeFile(t, path, stateAt, u32(staging.StateReady)) }, true, ""},
		{"the lane count changes", func() { pokeFile(t, path, unsafe.Offsetof(staging.Header{}.LaneCount), u32(8)) }, true, "lane count 8 differs from ours 7"},
		{"the lane count is ours again", func() { pokeFile(t, path, unsafe.Offsetof(staging.Header{}.LaneCount), u32(staging.LaneCount)) }, true, ""},
		{"the heartbeat gets older than the timeout", func() {
			pokeFile(t, path, unsafe.Offsetof(staging.Header{}.Heartbeat), binary.NativeEndian.AppendUint64(nil, uint64(staging.MonoNanos()-int64(2*testHeartbeatTimeout))))
		}, false, ""},
		{"the heartbeat is fresh again", func() {
			pokeFile(t, path, unsafe.Offsetof(staging.Header{}.Heartbeat), binary.NativeEndian.AppendUint64(nil, uint64(staging.MonoNanos())))
		}, true, ""},
		{"the file is cut inside the header", func() {
			if err := os.Truncate(path, 100); err != nil {
				t.Fatal(err)
			}
		}, true, "short read"},
	}
	for _, s := range steps {
		s.poke()
		ps, listed := nextPeers(t, r)
		noListing(t, listed, s.change)
		p, ok := findPeer(ps, name)
		switch {
		case ok != s.listed:
			t.Errorf("after %s: listed %v, want %v (%+v)", s.change, ok, s.listed, p)
		case !ok:
		case s.refused == "" && (p.Refused != nil || p.State != staging.StateReady || p.Rail != "rail-x"):
			t.Errorf("after %s: peer %+v, want it READY on rail-x", s.change, p)
		case s.refused != "" && (p.Refused == nil || !strings.Contains(p.Refused.Error(), s.refused)):
			t.Errorf("after %s: refused %v, want %q", s.change, p.Refused, s.refused)
		}
	}
}

func TestPeersSeeNewRanksLeavingRanksAndTooManyPeers(t *testing.T) {
	root := regTestRoot(t)
	r := scanObserver(t, root, "g", 0, scanTest{listEvery: time.Hour})
	if ps := settle(t, r); len(ps) != 0 {
		t.Fatalf("peers of an empty group: %+v", ps)
	}
	// Ranks join within milliseconds of each other, several within one
	// tick of the file system's clock: each is seen on the next call.
	var in []*Rank
	for i := 1; i < staging.LaneCount; i++ {
		p := mustRegister(t, regOptions(root, "g", fmt.Sprintf("rail%d", i)))
		in = append(in, p)
		ps, _ := nextPeers(t, r)
		if _, ok := findPeer(ps, p.Name()); !ok || len(ps) != i {
			t.Fatalf("the call after rank %d joined lists %d peers, want %d with %s", i, len(ps), i, p.Name())
		}
	}
	c := startRegChild(t, childOpts{root: root, group: "g", rail: "rail-child"})
	name := c.expect("ready")
	ps, _ := nextPeers(t, r)
	if p, ok := findPeer(ps, name); !ok || len(ps) != staging.LaneCount || p.Pid != c.pid() || p.Rail != "rail-child" {
		t.Fatalf("the call after a process joined lists %d peers (%v), want %d with %s", len(ps), ok, staging.LaneCount, name)
	}
	settle(t, r)
	if err := in[0].Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	ps, _ = nextPeers(t, r)
	if _, ok := findPeer(ps, in[0].Name()); ok || len(ps) != staging.LaneCount-1 {
		t.Fatalf("the call after a rank left lists %d peers, want %d without %s", len(ps), staging.LaneCount-1, in[0].Name())
	}
	in[0] = mustRegister(t, regOptions(root, "g", "rail1"))
	settle(t, r)
	c2 := startRegChild(t, childOpts{root: root, group: "g", rail: "rail-child2"})
	c2.expect("ready")
	_, err := r.Peers(context.Background())
	if !errors.Is(err, ErrTooManyPeers) || !strings.Contains(err.Error(), fmt.Sprintf("%d valid peers", staging.LaneCount+1)) {
		t.Fatalf("the call after an eighth peer joined: %v, want %v with %d valid peers", err, ErrTooManyPeers, staging.LaneCount+1)
	}
	if _, err := r.Peers(context.Background()); !errors.Is(err, ErrTooManyPeers) {
		t.Errorf("the call after: %v; PXN stays off", err)
	}
}

func TestPeersSeeRestartWithNewEpoch(t *testing.T) {
	root := regTestRoot(t)
	r := scanObserver(t, root, "g", 0, scanTest{listEvery: time.Hour})
	c := startRegChild(t, childOpts{root: root, group: "g"})
	old := c.expect("ready")
	if _, ok := findPeer(settle(t, r), old); !ok {
		t.Fatalf("%s not listed", old)
	}
	c.send("reregister")
	neu := c.expect("ready")
	_, oldID := folder.ParseEntryName(old)
	_, newID := folder.ParseEntryName(neu)
	if oldID.Pid != newID.Pid || oldID.Epoch == newID.Epoch {
		t.Fatalf("re-registered as %v after %v, want the same pid under a new epoch", newID, oldID)
	}
	ps, _ := nextPeers(t, r)
	p, ok := findPeer(ps, neu)
	if _, still := findPeer(ps, old); still || !ok || p.Identity != newID || len(ps) != 1 {
		t.Fatalf("the call after the restart lists %+v, want only %s", ps, neu)
	}
}

func TestPeersDoNotTrustAStampTooCloseToAChange(t *testing.T) {
	root := regTestRoot(t)
	r := scanObserver(t, root, "g", 0, scanTest{listEvery: time.Hour})
	settle(t, r)
	// A change within the same tick of a coarse clock as the stamp a
	// listing saw would leave the stamp as it was: so while the stamp is
	// within stampSettle of the clock, every call lists the directory
	// whatever its stamp says. A stamp set ahead of the clock is that close
	// however long the calls take.
	writeFile0600(t, filepath.Join(r.Dir(), "other"), nil)
	ahead := time.Now().Add(time.Hour)
	if err := os.Chtimes(r.Dir(), ahead, ahead); err != nil {
		t.Fatal(err)
	}
	for call := 1; call <= 3; call++ {
		if _, listed := nextPeers(t, r); !listed {
			t.Fatalf("call %d with the stamp ahead of the clock did not list; a stamp that close to a change cannot be trusted", call)
		}
	}
	// Once the last change (this Chtimes, by the status change time) is
	// stampSettle old, the call that lists trusts what it saw, and the
	// next call, nothing having changed, lists nothing.
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(r.Dir(), past, past); err != nil {
		t.Fatal(err)
	}
	time.Sleep(stampSettle)
	if _, listed := nextPeers(t, r); !listed {
		t.Errorf("the first call after the stamp moved back did not list")
	}
	if _, listed := nextPeers(t, r); listed {
		t.Errorf("a call with the stamp settled and listed listed again")
	}
}

// startUnreapedRank starts a rank process that nothing reaps before the
// test ends: once killed it stays a zombie.
func startUnreapedRank(t *testing.T, root, group string) (*exec.Cmd, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), registryHelperEnv+"=rank", helperRootEnv+"="+root, helperGroupEnv+"="+group, helperRailEnv+"=rail-z")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		s.Scan()
		line <- s.Text()
	}()
	select {
	case l := <-line:
		name, ok := strings.CutPrefix(l, "ready ")
		if !ok {
			t.Fatalf("unreaped rank said %q, want ready", l)
		}
		return cmd, name
	case <-time.After(childWait):
		t.Fatalf("unreaped rank said nothing for %v", childWait)
	}
	return nil, ""
}

func TestPeersSeeKilledRanks(t *testing.T) {
	for _, noPidfd := range []bool{false, true} {
		t.Run(fmt.Sprintf("noPidfd=%v", noPidfd), func(t *testing.T) {
			root := regTestRoot(t)
			r := scanObserver(t, root, "g", 0, scanTest{noPidfd: noPidfd, listEvery: time.Hour})
			c := startRegChild(t, childOpts{root: root, group: "g"})
			name := c.expect("ready")
			z, zname := startUnreapedRank(t, root, "g")
			ps := settle(t, r)
			if _, ok := findPeer(ps, name); !ok || len(ps) != 2 {
				t.Fatalf("peers %+v, want %s and %s", ps, name, zname)
			}
			_, id := folder.ParseEntryName(name)

			c.kill() // and reaped
			ps, listed := nextPeers(t, r)
			noListing(t, listed, "SIGKILL")
			if _, ok := findPeer(ps, name); ok || len(ps) != 1 {
				t.Errorf("the call after SIGKILL lists %+v, want only %s", ps, zname)
			}
			for _, f := range []string{name, folder.SockFileName(id)} {
				if fileExists(filepath.Join(r.Dir(), f)) {
					t.Errorf("the call after SIGKILL left %s of the killed rank", f)
				}
			}

			settle(t, r)
			if err := z.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			// The leader shows Z while its other threads still exit; the
			// process has exited once they are all gone.
			pollUntil(t, "the killed rank to become a zombie", func() bool {
				st, err := folder.ReadProcStat(z.Process.Pid)
				tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", z.Process.Pid))
				return err == nil && st.State == 'Z' && len(tasks) == 1
			})
			ps, listed = nextPeers(t, r)
			noListing(t, listed, "SIGKILL of an unreaped rank")
			if len(ps) != 0 {
				t.Errorf("the call after a rank became a zombie lists %+v, want none", ps)
			}
			if fileExists(filepath.Join(r.Dir(), zname)) {
				t.Errorf("the call after a rank became a zombie left its control file")
			}
		})
	}
}

func TestPeersSeeHeartbeatStopAndResume(t *testing.T) {
	const timeout = 300 * time.Millisecond
	root := regTestRoot(t)
	r := scanObserver(t, root, "g", timeout, scanTest{listEvery: time.Hour})
	c := startRegChild(t, childOpts{root: root, group: "g"})
	name := c.expect("ready")
	path := filepath.Join(r.Dir(), name)
	if _, ok := findPeer(settle(t, r), name); !ok {
		t.Fatalf("%s not listed", name)
	}
	c.send("pause")
	c.expect("paused")
	last := fileHeartbeat(t, path)
	// A call while the heartbeat is inside the timeout lists the rank.
	if ps, _ := nextPeers(t, r); staging.MonoNanos()-last < int64(timeout)/2 {
		if _, ok := findPeer(ps, name); !ok {
			t.Errorf("rank listed out %v after its last heartbeat", time.Duration(staging.MonoNanos()-last))
		}
	}
	time.Sleep(time.Duration(last+int64(timeout)-staging.MonoNanos()) + 10*time.Millisecond)
	ps, listed := nextPeers(t, r)
	noListing(t, listed, "the heartbeat went stale")
	if p, ok := findPeer(ps, name); ok {
		t.Errorf("the call after the heartbeat went stale lists %+v", p)
	}
	if !fileExists(path) {
		t.Errorf("a late rank whose process runs lost its control file")
	}
	c.send("resume")
	c.expect("resumed")
	// The rank comes back without a listing of the directory. A machine
	// slow enough to let a fresh heartbeat age past the timeout before the
	// call reads it keeps the rank out for that call; a later beat brings it
	// back, so the calls go on until one lists it.
	var back PeerInfo
	pollUntil(t, "the rank listed again after its heartbeat resumed", func() bool {
		ps, listed := nextPeers(t, r)
		noListing(t, listed, "the heartbeat resumed")
		p, ok := findPeer(ps, name)
		back = p
		return ok
	})
	if back.HeartbeatAge > timeout {
		t.Errorf("the call after the heartbeat resumed lists %+v, older than the timeout %v", back, timeout)
	}
}

func TestPeersFreeTheLaneOfAKilledSender(t *testing.T) {
	root := regTestRoot(t)
	r := scanObserver(t, root, "g", 0, scanTest{listEvery: time.Hour})
	c := startRegChild(t, childOpts{root: root, group: "g"})
	c.expect("ready")
	c.send("attach " + r.Name())
	c.expect("attached")
	settle(t, r)
	held := func() int {
		n := 0
		for i := range r.ctl.Lanes {
			if owner, ok := r.ctl.Lanes[i].Owner.Load(); ok && owner.Pid == c.pid() {
				n++
			}
		}
		return n
	}
	if n := held(); n != 1 {
		t.Fatalf("the sender holds %d lanes, want 1", n)
	}
	c.kill()
	_, listed := nextPeers(t, r)
	noListing(t, listed, "the sender was killed")
	if n := held(); n != 0 {
		t.Errorf("the call after the sender was killed left %d lanes held by it", n)
	}
}

func TestPeersRecheckEveryEntryWithinListEvery(t *testing.T) {
	root := regTestRoot(t)
	r := scanObserver(t, root, "g", 0, scanTest{})
	peer := mustRegister(t, regOptions(root, "g", "rail1"))
	settle(t, r)
	// A mode change is no change of the directory: the calls trust its
	// stat until the periodic listing, which finds it. The deadline only
	// ends a test whose listing never comes: listEvery, and childWait for a
	// loaded machine.
	sock := filepath.Join(r.Dir(), folder.SockFileName(peer.Identity()))
	if err := os.Chmod(sock, 0o640); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(listEvery + childWait)
	var err error
	for {
		time.Sleep(20 * time.Millisecond)
		before := listings(r)
		_, err = r.Peers(context.Background())
		if listings(r) != before {
			break
		}
		if err != nil {
			t.Fatalf("a call that did not list the directory failed: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Peers did not list the directory within %v after an entry became unsafe", listEvery+childWait)
		}
	}
	var ue *folder.UnsafeError
	if !errors.As(err, &ue) || ue.Path != sock || !strings.Contains(ue.Problem, "has mode 0640") {
		t.Errorf("Peers = %v, want an folder.UnsafeError about the mode of %s", err, sock)
	}
}

// registryFds lists this process's descriptors that a scan of the ranks
// under root may hold: files under root, and the /proc/<pid>/stat files and
// pidfds of this process, the only one whose ranks the caller registers.
// Descriptors of other processes (another test's children, whose pidfds
// the runtime closes when it collects them) are not the scan's.
func registryFds(t *testing.T, root string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	self := strconv.Itoa(os.Getpid())
	var fds []string
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(l, root), l == "/proc/"+self+"/stat":
		case strings.Contains(l, "pidfd") && pidfdOf(e.Name()) == self:
		default:
			continue
		}
		fds = append(fds, e.Name()+" "+l)
	}
	return fds
}

// pidfdOf returns the PID that the pidfd fd refers to, from its fdinfo, or
// "" when it cannot tell.
func pidfdOf(fd string) string {
	b, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", fd))
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Pid:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestPeersCloseReleasesDescriptors(t *testing.T) {
	for _, noPidfd := range []bool{false, true} {
		t.Run(fmt.Sprintf("noPidfd=%v", noPidfd), func(t *testing.T) {
			root := regTestRoot(t)
			before := registryFds(t, root)
			r := scanObserver(t, root, "g", 0, scanTest{noPidfd: noPidfd})
			peer := mustRegister(t, regOptions(root, "g", "rail1"))
			held := len(registryFds(t, root))
			if ps := settle(t, r); len(ps) != 1 {
				t.Fatalf("peers %+v, want %s", ps, peer.Name())
			}
			if n := len(registryFds(t, root)); n <= held {
				t.Fatalf("Peers holds no descriptor (%d before, %d after); the test checks nothing", held, n)
			}
			for _, x := range []*Rank{r, peer} {
				if err := x.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if after := registryFds(t, root); len(after) != len(before) {
				t.Errorf("descriptors %v before, %v after Close", before, after)
			}
		})
	}
}

func TestPeersSteadyStateAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	for _, noPidfd := range []bool{false, true} {
		t.Run(fmt.Sprintf("noPidfd=%v", noPidfd), func(t *testing.T) {
			ctx := context.Background()
			root := regTestRoot(t)
			r := scanObserver(t, root, "g", 0, scanTest{noPidfd: noPidfd})
			dir := r.Dir()
			for i := 1; i <= 2; i++ {
				mustRegister(t, regOptions(root, "g", fmt.Sprintf("rail%d", i)))
			}
			c := startRegChild(t, childOpts{root: root, group: "g", rail: "rail-child"})
			c.expect("ready")
			c.send("attach " + r.Name())
			c.expect("attached")
			me, start := os.Getpid(), selfStart(t)
			refused := staging.Identity{Pid: me, StartTime: start, Epoch: 0x6001}
			writeFakeRank(t, dir, refused, folder.RankFileName(refused), func(h *staging.Header) { h.LaneCount = 8 })
			late := staging.Identity{Pid: me, StartTime: start, Epoch: 0x6002}
			writeFakeRank(t, dir, late, folder.RankFileName(late), func(h *staging.Header) { h.Heartbeat = 1 })
			initializing := staging.Identity{Pid: me, StartTime: start, Epoch: 0x6003}
			writeFakeRank(t, dir, initializing, folder.TmpFileName(initializing), func(h *staging.Header) { h.State = staging.StateInit })
			// Of another PID namespace: watched by its heartbeat.
			foreign := staging.Identity{Pid: me, StartTime: start, Epoch: 0x6004}
			writeFakeRank(t, dir, foreign, folder.RankFileName(foreign), func(h *staging.Header) { h.PidNSDev, h.PidNSIno = otherNS.Dev, otherNS.Ino })
			writeFile0600(t, filepath.Join(dir, "notes"), []byte("x"))

			settle(t, r)
			buf := make([]PeerInfo, 0, 16)
			var err error
			call := func() {
				if buf, err = r.AppendPeers(ctx, buf[:0]); err != nil {
					t.Fatalf("Peers: %v", err)
				}
			}
			call()
			if usable := len(buf) - 1; usable != 4 {
				t.Fatalf("peers %+v, want 4 usable and 1 refused", buf)
			}
			if a := testing.AllocsPerRun(200, call); a != 0 {
				t.Errorf("a call with nothing changed: %v allocations, want 0", a)
			}
			// A listing of known names allocates nothing either.
			r.scan.host.listEvery = time.Nanosecond
			before := listings(r)
			if a := testing.AllocsPerRun(200, call); a != 0 {
				t.Errorf("a call that lists the directory again: %v allocations, want 0", a)
			}
			if listings(r)-before < 200 {
				t.Errorf("%d listings in 201 calls; the test measured something else", listings(r)-before)
			}
		})
	}
}

func BenchmarkPeersListing(b *testing.B) {
	root, err := os.MkdirTemp("/dev/shm", "pxn-registry-bench-")
	if err != nil {
		b.Skip("no /dev/shm")
	}
	defer os.RemoveAll(root)
	var ranks []*Rank
	for i := 0; i <= staging.LaneCount; i++ {
		r, err := Register(context.Background(), regOptions(root, "g", fmt.Sprintf("rail%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close(context.Background())
		ranks = append(ranks, r)
	}
	r := ranks[0]
	r.scan.host.listEvery = time.Nanosecond
	buf := make([]PeerInfo, 0, staging.LaneCount)
	b.ReportAllocs()
	for b.Loop() {
		if buf, err = r.AppendPeers(context.Background(), buf[:0]); err != nil || len(buf) != staging.LaneCount {
			b.Fatal(len(buf), err)
		}
	}
}
