// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// needPidNS skips a test that runs ranks in PID namespaces of their own
// where unshare cannot make one (not root, no unshare, a kernel or
// container that forbids it).
func needPidNS(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: ranks in PID namespaces of their own are started with unshare --pid")
	}
	out, err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "true").CombinedOutput()
	if err != nil {
		t.Skipf("unshare --pid --fork --mount-proc does not work here (%v: %s): no PID namespaces to test", err, strings.TrimSpace(string(out)))
	}
}

// nsFiles are the files a published rank named name has in the directory:
// its arena is a memfd, not a file.
func nsFiles(name string) []string {
	_, id := folder.ParseEntryName(name)
	return []string{name, folder.SockFileName(id)}
}

func missingFiles(dir string, names []string) []string {
	var missing []string
	for _, n := range names {
		if !fileExists(filepath.Join(dir, n)) {
			missing = append(missing, n)
		}
	}
	return missing
}

// Two ranks, each in a PID namespace of its own (two pods without
// hostPID), started one after the other: neither removes the other's
// files, they see each other, attach to each other by descriptor and share
// memory. A kill -9 of one is cleaned up once its heartbeat has stood
// still for the heartbeat timeout, and not before.
func TestNamespaceRanksInSeparatePidNamespaces(t *testing.T) {
	needPidNS(t)
	// The observer's heartbeat timeout, the engine's default: long enough
	// that a child starved of CPU on a loaded machine for a while is not
	// taken for dead.
	const timeout = 3 * time.Second
	root := regTestRoot(t)
	dir := groupDir(root, "g")

	a := startRegChild(t, childOpts{root: root, group: "g", rail: "rail-a", pidns: true})
	aName := a.expect("ready")
	pollUntil(t, "the first rank's heartbeat to move", func() bool {
		hb := fileHeartbeat(t, filepath.Join(dir, aName))
		return staging.MonoNanos()-hb < int64(time.Second) && fileHeartbeat(t, filepath.Join(dir, aName)) != 0
	})
	b := startRegChild(t, childOpts{root: root, group: "g", rail: "rail-b", pidns: true})
	bName := b.expect("ready")
	if m := missingFiles(dir, append(nsFiles(aName), nsFiles(bName)...)); len(m) > 0 {
		t.Fatalf("after the second rank registered, %v are gone: a live rank's files were removed (%v)", m, listDir(t, dir))
	}

	for _, c := range []struct {
		self      *regChild
		me, other string
	}{{a, aName, bName}, {b, bName, aName}} {
		c.self.send("peers")
		if got, want := c.self.expect("peers"), "1 "+c.other; got != want {
			t.Errorf("%s sees peers %q, want %q", c.me, got, want)
		}
		c.self.send("attach " + c.other)
		f := strings.Fields(c.self.expect("attached"))
		if len(f) != 4 || f[3] != "lane-descriptor" {
			t.Fatalf("%s attached to %s as %v; want the lane mapped by descriptor", c.me, c.other, f)
		}
		c.self.send(fmt.Sprintf("fill %s %d", c.other, len(c.me)))
		c.self.expect("filled")
		other := a
		if c.self == a {
			other = b
		}
		other.send("sum " + f[1])
		got := strings.Fields(other.expect("sum"))
		want := make([]byte, fillBytes)
		for i := range want {
			want[i] = byte(len(c.me)) + byte(i)
		}
		if len(got) != 2 || got[1] != fnvHex(want) {
			t.Errorf("%s wrote through its mapping of %s's arena, which reads %v there, want %s", c.me, c.other, got, fnvHex(want))
		}
	}

	// A third namespace, this process's, watches both by heartbeat.
	obs := scanObserver(t, root, "g", timeout, scanTest{})
	stop := staging.MonoNanos() + 2*int64(timeout)
	for staging.MonoNanos() < stop {
		nextPeers(t, obs)
		if m := missingFiles(dir, append(nsFiles(aName), nsFiles(bName)...)); len(m) > 0 {
			t.Fatalf("a rank of another namespace removed %v of live ranks; the directory holds %v", m, listDir(t, dir))
		}
		time.Sleep(20 * time.Millisecond)
	}
	pollUntil(t, "both ranks listed by a third namespace", func() bool {
		ps, _ := nextPeers(t, obs)
		_, okA := findPeer(ps, aName)
		_, okB := findPeer(ps, bName)
		return okA && okB
	})
	groups, err := inspect.Root(root, timeout)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range groups[0].Ranks {
		if (r.File == aName || r.File == bName) && (r.Liveness != inspect.JudgedByHeartbeat || r.PidNS == selfNS(t).String()) {
			t.Errorf("inspect from another namespace shows %s in %s judged by %q, want its own namespace judged by %q", r.File, r.PidNS, r.Liveness, inspect.JudgedByHeartbeat)
		}
	}

	killed := staging.MonoNanos()
	a.kill()
	// Generous: a loaded machine may run the observer's calls late; what
	// matters is that the files go, and not before the heartbeat timeout.
	deadline := time.Now().Add(childWait)
	for fileExists(filepath.Join(dir, aName)) {
		if time.Now().After(deadline) {
			t.Fatalf("the killed rank's files are still there %v later: %v", childWait, listDir(t, dir))
		}
		nextPeers(t, obs)
		time.Sleep(20 * time.Millisecond)
	}
	if since := time.Duration(staging.MonoNanos() - killed); since < timeout/2 {
		t.Errorf("the killed rank's files went %v after the kill, before its heartbeat could be stale (%v): judged by something else", since, timeout)
	}
	if m := missingFiles(dir, nsFiles(aName)); len(m) != len(nsFiles(aName)) {
		t.Errorf("of the killed rank's files, only %v were removed", m)
	}
	if m := missingFiles(dir, nsFiles(bName)); len(m) > 0 {
		t.Errorf("the survivor lost %v", m)
	}
	b.send("peers")
	b.expect("peers")
}

func hasPeer(ps []PeerInfo, name string) bool {
	_, ok := findPeer(ps, name)
	return ok
}

func fnvHex(b []byte) string {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return fmt.Sprintf("%016x", h)
}

// A registration of another PID namespace is never judged by its pid, by
// a registrant or by Peers: only a heartbeat this rank saw stand still for
// the timeout removes its files. Registrations that name no namespace are
// removed only when nothing of them is younger than the timeout and no
// process of this namespace has their pid and start time.
func TestNamespaceForeignAndUnknownEntries(t *testing.T) {
	const timeout = 400 * time.Millisecond
	root := regTestRoot(t)
	dir := groupDir(root, "g")
	obs := scanObserver(t, root, "g", timeout, scanTest{})
	me, start := os.Getpid(), selfStart(t)
	dead := deadPid(t)
	foreign := func(h *staging.Header) { h.PidNSDev, h.PidNSIno = otherNS.Dev, otherNS.Ino }

	// Beating: a rank of another namespace whose pid here is dead, and
	// whose heartbeat this test keeps moving.
	beating := staging.Identity{Pid: dead, StartTime: 12345, Epoch: 0x7001}
	writeFakeRank(t, dir, beating, folder.RankFileName(beating), foreign)
	// Silent: the same, its heartbeat left as written.
	silent := staging.Identity{Pid: dead, StartTime: 12345, Epoch: 0x7002}
	writeFakeRank(t, dir, silent, folder.RankFileName(silent), foreign)
	// Our own pid, but recorded in another namespace: not alive by that.
	mine := staging.Identity{Pid: me, StartTime: start, Epoch: 0x7003}
	writeFakeRank(t, dir, mine, folder.RankFileName(mine), foreign)
	// Garbage: an old ABI names no namespace; never removed on a guess.
	old := staging.Identity{Pid: dead, StartTime: 12345, Epoch: 0x7004}
	writeFakeRank(t, dir, old, folder.RankFileName(old), func(h *staging.Header) { h.ABIVersion = 2 })
	// Never written: a .tmp of a rank that died creating it.
	blank := staging.Identity{Pid: dead, StartTime: 12345, Epoch: 0x7005}
	writeFile0600(t, filepath.Join(dir, folder.TmpFileName(blank)), make([]byte, 100))
	// Alive here, no control file: its pid and start time are this
	// process's.
	arenaOnly := staging.Identity{Pid: me, StartTime: start, Epoch: 0x7006}
	writeFile0600(t, filepath.Join(dir, folder.ArenaFileName(arenaOnly)), nil)
	created := staging.MonoNanos()

	// A registrant has watched nothing: it removes none of them.
	mustRegister(t, regOptions(root, "g", "rail1"))
	for _, id := range []staging.Identity{beating, silent, mine, old} {
		if !fileExists(filepath.Join(dir, folder.RankFileName(id))) || !fileExists(filepath.Join(dir, folder.ArenaFileName(id))) {
			t.Fatalf("a registrant removed files of %v: %v", id, listDir(t, dir))
		}
	}
	if !fileExists(filepath.Join(dir, folder.TmpFileName(blank))) {
		t.Fatalf("a registrant removed an unwritten control file younger than the timeout")
	}

	beat := func() {
		var b [8]byte
		*(*uint64)(unsafe.Pointer(&b[0])) = uint64(staging.MonoNanos())
		pokeFile(t, filepath.Join(dir, folder.RankFileName(beating)), unsafe.Offsetof(staging.Header{}.Heartbeat), b[:])
	}
	gone := func(id staging.Identity) bool {
		return !fileExists(filepath.Join(dir, folder.RankFileName(id))) && !fileExists(filepath.Join(dir, folder.ArenaFileName(id)))
	}
	deadline := time.Now().Add(childWait)
	for !gone(silent) || !gone(mine) || fileExists(filepath.Join(dir, folder.TmpFileName(blank))) {
		if time.Now().After(deadline) {
			t.Fatalf("silent ranks of another namespace still there after %v: %v", childWait, listDir(t, dir))
		}
		beat()
		nextPeers(t, obs)
		time.Sleep(10 * time.Millisecond)
	}
	beat()
	if ps, _ := nextPeers(t, obs); !hasPeer(ps, folder.RankFileName(beating)) || hasPeer(ps, folder.RankFileName(silent)) {
		t.Errorf("peers %+v, want the beating rank of another namespace and not the silent one", ps)
	}
	if since := time.Duration(staging.MonoNanos() - created); since < timeout {
		t.Errorf("silent ranks removed %v after they appeared, before the timeout %v", since, timeout)
	}
	for _, id := range []staging.Identity{beating, old} {
		if gone(id) {
			t.Errorf("%v removed: a beating rank, or garbage that names no namespace", id)
		}
	}
	if !fileExists(filepath.Join(dir, folder.ArenaFileName(arenaOnly))) {
		t.Errorf("an arena whose pid and start time are of a live process here was removed")
	}
}

// The arena socket grants a claim only to the rank that asks: a claim
// naming another process of the relay's namespace, or malformed, is
// refused, and a claim answered gives a lane nobody holds; nothing in a
// claim names a lane, so no asker can ask for another's.
func TestNamespaceArenaSocketClaimsOnlyForTheAsker(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	l := attachByName(t, sender, relay.Name())
	if l.ArenaShare() != staging.ShareLaneFD {
		t.Fatalf("attached by %s, want by lane descriptor", folder.ShareName(l.ArenaShare()))
	}
	if relay.Header().ArenaShares != staging.ShareLaneFD {
		t.Errorf("relay offers shares %#x, want the lane descriptor alone", relay.Header().ArenaShares)
	}
	// The sender's mapping is the relay's memory.
	copy(foreignBytes(l.StagingBase(), 4), "pxn!")
	if got := string(foreignBytes(relay.Arena().Base()+uintptr(staging.LaneOffset(l.LaneIndex())), 4)); got != "pxn!" {
		t.Errorf("the relay reads %q where the sender wrote through its descriptor mapping", got)
	}
	sock := folder.SockFileName(relay.Identity())
	other := mustRegister(t, regOptions(root, "g", "rail2"))
	good := fdRequest{Owner: other.Identity(), NS: other.ns}
	with := func(f func(q *fdRequest)) fdRequest {
		q := good
		f(&q)
		return q
	}
	ask := func(q fdRequest) (fdAnswer, error) {
		c, err := dialArenaSocket(sender.d, sock, q, 0, staging.MonoNanos())
		if err != nil {
			return fdAnswer{}, err
		}
		defer c.close()
		for {
			ans, fds, done, err := c.poll(100 * time.Millisecond)
			if done {
				for _, fd := range fds {
					closeFD(fd)
				}
				return ans, err
			}
			if staging.MonoNanos() > c.deadline {
				return ans, fmt.Errorf("no answer")
			}
		}
	}
	ans, err := ask(good)
	if err != nil {
		t.Fatalf("the asker's own claim: %v", err)
	}
	if int(ans.Lane) == l.LaneIndex() || ans.Rights != 4 {
		t.Errorf("the second claim got lane %d with %d descriptors, want another lane than %d, with 4", ans.Lane, ans.Rights, l.LaneIndex())
	}
	for _, tt := range []struct {
		name string
		q    fdRequest
		want string
	}{
		{"another pid of this namespace", with(func(q *fdRequest) { q.Owner.Pid++ }), "not the rank it names"},
		{"the holder's words", with(func(q *fdRequest) { q.Owner = sender.Identity(); q.Owner.Pid = os.Getppid() }), "not the rank it names"},
		{"the relay itself", with(func(q *fdRequest) { q.Owner = relay.Identity() }), "not the rank it names"},
		{"pid 0", with(func(q *fdRequest) { q.Owner.Pid = 0 }), "malformed"},
		{"epoch 0", with(func(q *fdRequest) { q.Owner.Epoch = 0 }), "malformed"},
	} {
		if _, err := ask(tt.q); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want a refusal saying %q", tt.name, err, tt.want)
		}
	}
	// The server counts after it answers: wait for it.
	pollUntil(t, "the server to count its answers", func() bool { return relay.ServeStats().Refused >= 5 })
	if got := relay.ServeStats(); got.Served != 2 || got.Refused != 5 || got.Busy != 0 {
		t.Errorf("serve stats %+v, want 2 served (the attach, the second claim) and 5 refused", got)
	}
	relay.BeginClose()
	if _, err := ask(good); err == nil || !strings.Contains(err.Error(), "not READY") {
		t.Errorf("a closing relay answered %v, want refused: not READY", err)
	}
}

// Without lane descriptors (NoArenaSocket) a by-name arena is mapped by
// its handle, by a sender that maps by name too; the socket still takes
// claims. A host arena of the default kind, a memfd, has no other way to
// be shared and the rank does not register.
func TestNamespaceArenaByHandleWithoutSocket(t *testing.T) {
	root := regTestRoot(t)
	o := regOptions(root, "g", "rail0")
	o.NoArenaSocket = true
	if r, err := Register(context.Background(), o); r != nil || !errors.Is(err, staging.ErrNoHandle) || !strings.Contains(err.Error(), "NoArenaSocket") {
		t.Fatalf("Register of a memfd arena without its socket = %v, %v; want ErrNoHandle naming NoArenaSocket", r, err)
	}
	o.Arenas = HostArenas{ByName: true}
	relay := mustRegister(t, o)
	if relay.Header().ArenaShares != staging.ShareIPCHandle || !fileExists(filepath.Join(relay.Dir(), folder.SockFileName(relay.Identity()))) {
		t.Fatalf("relay without lane descriptors offers %#x, directory %v; want the handle alone and the socket for claims", relay.Header().ArenaShares, listDir(t, relay.Dir()))
	}
	so := regOptions(root, "g", "rail1")
	so.Arenas = HostArenas{ByName: true}
	sender := mustRegister(t, so)
	l := attachByName(t, sender, relay.Name())
	if l.ArenaShare() != staging.ShareIPCHandle {
		t.Errorf("attached by %s, want by handle", folder.ShareName(l.ArenaShare()))
	}
}

// TryAttach never waits for the relay's answer: it returns
// ErrAttachPending with the lane claimed, and a later call completes.
func TestNamespaceTryAttachDoesNotWaitForTheSocket(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	peer := peerByName(t, sender, relay.Name())
	var l *PeerLink
	var err error
	pending := 0
	pollUntil(t, "TryAttach to complete", func() bool {
		l, err = sender.TryAttach(peer)
		if err != nil && !isPending(err) {
			t.Fatalf("TryAttach: %v", err)
		}
		if err != nil {
			pending++
		}
		return err == nil
	})
	if l.ArenaShare() != staging.ShareLaneFD {
		t.Errorf("attached by %s, want by lane descriptor", folder.ShareName(l.ArenaShare()))
	}
	t.Logf("TryAttach returned pending %d times", pending)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func isPending(err error) bool { return errors.Is(err, ErrAttachPending) }

func closeFD(fd int) { os.NewFile(uintptr(fd), "").Close() }

// A rank's control file goes back to its temporary name when it revokes
// READY, so its arena is never without one while the process runs.
func TestNamespaceRevokedRankKeepsItsControlFile(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	if err := relay.revoke(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := relay.Identity()
	if fileExists(filepath.Join(relay.Dir(), relay.Name())) || !fileExists(filepath.Join(relay.Dir(), folder.TmpFileName(id))) {
		t.Errorf("after revoke the directory holds %v, want the control file under its temporary name", listDir(t, relay.Dir()))
	}
	if err := relay.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := listDir(t, relay.Dir()); len(got) != 1 {
		t.Errorf("after Close the directory holds %v, want only the lock", got)
	}
}

// A claim naming a rank of another PID namespace than the relay's (a
// holder in another pod) is not granted to a process of the relay's own
// namespace that presents it: such a process can be no rank of another
// namespace, only a member that copied the words from the control file.
func TestNamespaceArenaSocketRefusesCopiedForeignOwner(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	foreign := staging.Identity{Pid: 4242, StartTime: 1, Epoch: 0x77}
	q := fdRequest{Owner: foreign, NS: staging.PidNS{Dev: 9, Ino: 99}}
	c, err := dialArenaSocket(relay.d, folder.SockFileName(relay.Identity()), q, 0, staging.MonoNanos())
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	for {
		_, fds, done, err := c.poll(100 * time.Millisecond)
		if !done && staging.MonoNanos() < c.deadline {
			continue
		}
		for _, fd := range fds {
			closeFD(fd)
		}
		if err == nil || !strings.Contains(err.Error(), "claim refused: the asker is not the rank it names") {
			t.Errorf("a process of the relay's namespace naming a foreign rank: %v, want the claim refused", err)
		}
		return
	}
}
