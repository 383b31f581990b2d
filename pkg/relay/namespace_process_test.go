// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
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

// rankFiles are the files of the rank whose control file is rank: the
// control file and its arena socket (a host arena is a memfd, no file).
func rankFiles(rank string) []string {
	id := strings.TrimPrefix(rank, "rank-")
	return []string{rank, "sock-" + id}
}

func (g *faultGroup) missing(names []string) []string {
	var m []string
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join(g.registryDir(), n)); err != nil {
			m = append(m, n)
		}
	}
	return m
}

func (g *faultGroup) rankReport(rank string) *inspect.RankReport {
	g.t.Helper()
	reports, err := inspect.Root(g.root, 3*time.Second)
	if err != nil {
		g.t.Fatal(err)
	}
	for _, gr := range reports {
		for i := range gr.Ranks {
			if gr.Ranks[i].File == rank {
				return &gr.Ranks[i]
			}
		}
	}
	return nil
}

// Two ranks, each in a PID namespace of its own (two pods of one group,
// neither with hostPID), started one after the other, relay through each
// other: every byte right, every Piece relayed, none sent direct, each
// arena mapped by descriptor, and no file of a live rank removed. A kill -9
// of one is cleaned up by the other once the dead rank's heartbeat has
// stood still for the heartbeat timeout.
func TestNamespaceRanksRelayAcrossPidNamespaces(t *testing.T) {
	needPidNS(t)
	const heartbeatTimeout = 3 * time.Second // the fault group's setting
	g := newFaultGroup(t, faultGroupOpts{})
	a := g.startInPidNS("a", 0, 4*faultMiB)
	// The second starts once the first runs its pump, as a second pod
	// would start after the first.
	eventually(t, 20*time.Second, "the first rank beating", func() bool {
		r := g.rankReport(a.rank)
		return r != nil && r.HeartbeatAge >= 0 && r.HeartbeatAge < time.Second
	})
	b := g.startInPidNS("b", 1, 4*faultMiB)
	both := append(rankFiles(a.rank), rankFiles(b.rank)...)
	if m := g.missing(both); len(m) > 0 {
		t.Fatalf("after the second rank started, %v are gone: a live rank's files were removed (%v)", m, g.files())
	}
	ra, rb := g.rankReport(a.rank), g.rankReport(b.rank)
	if ra.PidNS == rb.PidNS || ra.Liveness != inspect.JudgedByHeartbeat || rb.Liveness != inspect.JudgedByHeartbeat {
		t.Errorf("inspect: %s in %s judged by %s, %s in %s judged by %s; want two namespaces other than ours, judged by heartbeat",
			a.rank, ra.PidNS, ra.Liveness, b.rank, rb.PidNS, rb.Liveness)
	}

	a.route(faultRail(1), true, 20*time.Second)
	b.route(faultRail(0), true, 20*time.Second)
	const n = 8
	a.submit(true, faultWrites(1, n, faultPiece, 0, 0)...)
	b.submit(true, faultWrites(0, n, faultPiece, 0, 0)...)
	for i, p := range []*faultProc{a, b} {
		ts := p.wait(20 * time.Second)
		checkStates(t, ts, map[string]int{"completed": n})
		g.verify(i, ts)
		c := p.counters().Counters
		if c.RelayedPieces != n || c.FallbackPieces != 0 || c.ArenasByFD != 1 || c.ArenasByHandle != 0 {
			t.Errorf("%s: relayed %d, fallback %d pieces, arenas by descriptor %d, by handle %d; want %d, 0, 1, 0",
				p.name, c.RelayedPieces, c.FallbackPieces, c.ArenasByFD, c.ArenasByHandle, n)
		}
	}
	if m := g.missing(both); len(m) > 0 {
		t.Fatalf("%v of live ranks were removed (%v)", m, g.files())
	}

	killed := time.Now()
	a.kill()
	// Generous: the survivor's pump judges the dead rank on its refresh,
	// which a loaded machine may run late; what matters is that the files
	// go, and not before the heartbeat could have gone stale.
	eventually(t, 60*time.Second, "the killed rank's files removed by the survivor", func() bool {
		return len(g.missing(rankFiles(a.rank))) == len(rankFiles(a.rank))
	})
	if since := time.Since(killed); since < heartbeatTimeout/2 {
		t.Errorf("the killed rank's files went %v after the kill, before its heartbeat could be stale: judged by something else", since)
	}
	if m := g.missing(rankFiles(b.rank)); len(m) > 0 {
		t.Errorf("the survivor lost %v", m)
	}
	b.route(faultRail(0), false, 20*time.Second)
	b.submit(true, faultWrites(0, 2, faultPiece, n*faultPiece, n*faultPiece)...)
	ts := b.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": n + 2})
	g.verify(1, ts)
	if cl := b.close(5 * time.Second); cl.CloseErr != "" {
		t.Errorf("close: %s", cl.CloseErr)
	}
	b.exit()
	onlyLock(t, g)
}

// nsRankPid is the pid, in this namespace, of a rank started by
// startInPidNS: the child of its unshare.
func nsRankPid(t *testing.T, p *faultProc) int {
	t.Helper()
	pid := p.cmd.Process.Pid
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		t.Fatalf("unshare %d has children %q, want one", pid, f)
	}
	child, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatal(err)
	}
	return child
}

func countFDs(t *testing.T, pid int) int {
	t.Helper()
	es, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// A hostile client of a relay's arena socket (connections that stall,
// garbage, a request cut short, far more connections than the relay
// serves at once) changes nothing for the others: a sender's transfers
// through that relay complete, the relay's descriptors stay bounded, and
// once the flood stops a new sender gets its descriptor from the relay.
func TestNamespaceHostileArenaSocketClient(t *testing.T) {
	needPidNS(t)
	g := newFaultGroup(t, faultGroupOpts{rails: 3})
	r := g.startInPidNS("relay", 1, faultMiB)
	s := g.startInPidNS("sender", 0, 4*faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	// The relay is a sender too: its own lane on the other rank is part
	// of its steady descriptors.
	r.route(faultRail(0), true, 20*time.Second)
	relayPid := nsRankPid(t, r)
	base := countFDs(t, relayPid)
	sock := filepath.Join(g.registryDir(), rankFiles(r.rank)[1])

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var dials, refusedDials int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			var conns []net.Conn
			for i := 0; i < 64; i++ {
				c, err := net.Dial("unix", sock)
				dials++
				if err != nil {
					refusedDials++
					continue
				}
				switch i % 3 {
				case 0: // stalls
				case 1:
					c.Write([]byte(strings.Repeat("\xff", 32)))
				case 2:
					c.Write([]byte("PXFD\x01\x00\x00\x00\x00\x00"))
				}
				conns = append(conns, c)
			}
			select {
			case <-stop:
			case <-time.After(300 * time.Millisecond):
			}
			for _, c := range conns {
				c.Close()
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	maxFDs := base
	sample := func() { maxFDs = max(maxFDs, countFDs(t, relayPid)) }
	const n = 16
	s.submit(true, faultWrites(1, n, faultPiece, 0, 0)...)
	ts := s.wait(20 * time.Second)
	for i := 0; i < 50; i++ {
		sample()
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	checkStates(t, ts, map[string]int{"completed": n})
	g.verify(0, ts)
	if c := s.counters().Counters; c.RelayedPieces != n || c.FallbackPieces != 0 {
		t.Errorf("under the flood: relayed %d, fallback %d pieces; want %d and 0", c.RelayedPieces, c.FallbackPieces, n)
	}
	// At most 8 connections wait for their request at the relay, and
	// the others are answered or closed as they are accepted: besides
	// those, a few descriptors come and go with its other work.
	if maxFDs > base+8+8 {
		t.Errorf("the relay held up to %d descriptors under the flood, %d before: not bounded by its connection limit", maxFDs, base)
	}
	t.Logf("%d hostile dials (%d refused by the kernel); relay descriptors %d before, at most %d during", dials, refusedDials, base, maxFDs)
	eventually(t, 20*time.Second, "the relay's descriptors back to where they were", func() bool { return countFDs(t, relayPid) <= base+2 })

	late := g.startInPidNS("late", 2, 4*faultMiB)
	late.route(faultRail(1), true, 20*time.Second)
	late.route(faultRail(0), true, 20*time.Second)
	late.submit(true, faultWrites(1, 4, faultPiece, 0, n*faultPiece)...)
	ts = late.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 4})
	g.verify(2, ts)
	// It attaches to both other ranks, the relay and the sender.
	if c := late.counters().Counters; c.ArenasByFD != 2 || c.ArenasByHandle != 0 || c.RelayedPieces != 4 {
		t.Errorf("after the flood a new sender mapped %d arenas by descriptor, %d by handle, and relayed %d pieces; want 2, 0 and 4", c.ArenasByFD, c.ArenasByHandle, c.RelayedPieces)
	}
	if m := g.missing(append(rankFiles(r.rank), rankFiles(s.rank)...)); len(m) > 0 {
		t.Errorf("%v of live ranks were removed", m)
	}
}
