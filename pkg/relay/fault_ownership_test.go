// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

// The slot ownership rule (docs/reliability.md): a slot is written by a
// sender only when no second-hop write of an earlier epoch can still read
// it, a lane never leaves a live owner, and a write the NIC may still hold
// keeps its slot. Each test checks the destination of every task, failed
// ones included: it holds that task's own bytes or none.

// ownOrNone checks that the destination of every write of rank index holds,
// byte by byte, that write's own source byte or zero: a failed or
// unfinished write may leave its destination untouched or partly written,
// never with another write's bytes.
func (g *faultGroup) ownOrNone(index int, ws []faultWrite) {
	g.t.Helper()
	for _, w := range ws {
		got := g.dest(w)
		want := make([]byte, w.Len)
		faultPattern(want, faultSeed(index), w.Src)
		for i := range got {
			if got[i] != 0 && got[i] != want[i] {
				g.t.Errorf("rank %d write %+v: destination byte %d is %#x, neither its own %#x nor untouched", index, w, i, got[i], want[i])
				break
			}
		}
	}
}

// hostPid is the process of p as this process sees it: the rank itself,
// or, for a rank in a PID namespace of its own, the one child of unshare.
func (p *faultProc) hostPid() int {
	p.t.Helper()
	pid := p.cmd.Process.Pid
	for range 100 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if err != nil {
			p.t.Fatal(err)
		}
		kids := strings.Fields(string(b))
		if len(kids) == 0 {
			return pid
		}
		next, err := strconv.Atoi(kids[0])
		if err != nil {
			p.t.Fatal(err)
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", next)); err != nil || strings.HasSuffix(exe, "unshare") {
			pid = next
			continue
		}
		return next
	}
	p.t.Fatalf("%s: no rank process under pid %d", p.name, p.cmd.Process.Pid)
	return 0
}

// signal sends sig to the rank process of p.
func (p *faultProc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := syscall.Kill(p.hostPid(), sig); err != nil {
		p.t.Fatalf("%s: %v: %v", p.name, sig, err)
	}
}

// stopped reports whether the rank process of p is stopped (state T).
func (p *faultProc) stopped() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.hostPid()))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'T'
}

// A sender killed while the relay's second hop still reads its slots: its
// lane goes to the next sender at once, but that sender copies nothing into
// a slot before the relay has opened the new epoch, which it does only once
// the dead sender's writes have ended. So the dead sender's destinations
// hold its own bytes, and the new sender's writes go through the relay.
func TestFaultReclaimWaitsForTheSecondHop(t *testing.T) {
	g := newFaultGroup(t, faultGroupOpts{})
	r := g.start("relay", 1, faultMiB)
	s1 := g.start("sender", 0, 4*faultMiB)
	s1.route(faultRail(1), true, 20*time.Second)
	r.call(faultReq{Op: "hold", On: true})
	first := faultWrites(1, 10, faultPiece, 0, 0)
	s1.submit(true, first...)
	var lane int
	eventually(t, 20*time.Second, "ten published, four of them in the relay's held second hop", func() bool {
		l := g.laneOf(r.pid, s1.pid)
		if l == nil {
			return false
		}
		lane = l.Lane
		return l.Published == 10 && r.call(faultReq{Op: "held"}).Held == 4
	})
	eventually(t, 20*time.Second, "ten doorbells", func() bool {
		return s1Landed(r, lane, 10)
	})
	s1.kill()

	// The next sender, with credit to wait for as long as the test runs,
	// gets the dead sender's lane under a new epoch, not yet open.
	s2 := g.start("next sender", 0, 4*faultMiB, "MC_PXN_CREDIT_TIMEOUT_MS=60000")
	s2.route(faultRail(1), true, 20*time.Second)
	second := faultWrites(1, 10, faultPiece, 2*faultMiB, 10*faultPiece)
	s2.submit(true, second...)
	eventually(t, 20*time.Second, "the new sender waiting on the dead sender's lane", func() bool {
		l := g.laneOf(r.pid, s2.pid)
		c := s2.counters().Counters
		return l != nil && l.Lane == lane && (l.Published > 0 || c.CreditWaits > 0)
	})
	if l := g.laneOf(r.pid, s2.pid); l.Open || l.Published != 0 {
		t.Errorf("lane %+v opened to a new sender while the second hop still reads the old sender's slots", *l)
	}
	r.call(faultReq{Op: "hold", On: false})
	ts := s2.wait(30 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 10})
	g.verify(0, ts)
	for i, task := range ts {
		if task.Route != "pxn" {
			t.Errorf("new sender's task %d went %s, want through the relay", i, task.Route)
		}
	}
	// Four Pieces were in the second hop when the sender died: those land
	// whole; the six the relay had not taken never go.
	eventually(t, 20*time.Second, "the relay forwarding the dead sender's four", func() bool {
		return r.counters().Counters.ForwardedPieces == 14
	})
	g.ownOrNone(0, first)
	var landed []faultTask
	for _, w := range first[:4] {
		landed = append(landed, faultTask{Write: w, State: "completed", Transferred: w.Len})
	}
	g.verify(0, landed)
}

// s1Landed reports whether seqs 1..n of lane of relay r have their
// doorbells, as r's memory shows them.
func s1Landed(r *faultProc, lane int, n uint64) bool {
	ready, ok := relayReadyWords(r, lane)
	if !ok {
		return false
	}
	for seq := uint64(1); seq <= n; seq++ {
		if ready[staging.SlotOf(seq)] != seq {
			return false
		}
	}
	return true
}

// A sender that is stopped (SIGSTOP) keeps its lane however late its
// heartbeat, whether the relay shares its PID namespace or not: another
// sender gets another lane, and the relay does not free it. Resumed, the
// stopped sender's writes complete with its own bytes, and so do the other
// sender's.
func TestFaultStoppedSenderKeepsItsLane(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pidns bool
	}{{"same PID namespace", false}, {"own PID namespace", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const hb = 500 * time.Millisecond
			g := newFaultGroup(t, faultGroupOpts{rails: 3, env: map[string]string{
				"MC_PXN_HEARTBEAT_TIMEOUT_MS": strconv.Itoa(int(hb / time.Millisecond)),
				"MC_PXN_CREDIT_TIMEOUT_MS":    "60000",
			}})
			r := g.start("relay", 1, faultMiB)
			s1 := g.startProc(tc.pidns, "stopped sender", 0, 4*faultMiB)
			s1.route(faultRail(1), true, 20*time.Second)
			r.call(faultReq{Op: "hold", On: true})
			first := faultWrites(1, 6, faultPiece, 0, 0)
			s1.submit(true, first...)
			var lane int
			eventually(t, 20*time.Second, "six published", func() bool {
				l := g.laneOf(r.pid, s1.pid)
				if l != nil {
					lane = l.Lane
				}
				return l != nil && l.Published == 6
			})
			s1.signal(syscall.SIGSTOP)
			t.Cleanup(func() { _ = syscall.Kill(s1.hostPid(), syscall.SIGCONT) })
			eventually(t, 20*time.Second, "the sender stopped and its heartbeat three timeouts old", func() bool {
				rep := g.inspect(s1.pid)
				return s1.stopped() && rep != nil && rep.HeartbeatAge > 3*hb
			})

			s2 := g.start("other sender", 2, 4*faultMiB)
			s2.route(faultRail(1), true, 20*time.Second)
			l2 := g.laneOf(r.pid, s2.pid)
			if l2 == nil || l2.Lane == lane {
				t.Fatalf("other sender's lane %+v, want one other than the stopped sender's lane %d", l2, lane)
			}
			if l1 := g.laneOf(r.pid, s1.pid); l1 == nil || l1.Lane != lane {
				t.Fatalf("the stopped sender lost lane %d: %+v", lane, l1)
			}
			second := faultWrites(1, 4, faultPiece, 0, 6*faultPiece)

			s1.signal(syscall.SIGCONT)
			r.call(faultReq{Op: "hold", On: false})
			s2.submit(true, second...)
			ts2 := s2.wait(30 * time.Second)
			checkStates(t, ts2, map[string]int{"completed": 4})
			g.verify(2, ts2)
			ts1 := s1.wait(30 * time.Second)
			checkStates(t, ts1, map[string]int{"completed": 6})
			g.verify(0, ts1)
			// The relay copies a lane's progress into its control file
			// with its heartbeat.
			var l1 *inspect.LaneReport
			eventually(t, 20*time.Second, "the resumed sender's lane with six completed", func() bool {
				l1 = g.laneOf(r.pid, s1.pid)
				return l1 != nil && l1.Completed == 6
			})
			if l1.Lane != lane {
				t.Errorf("resumed sender's lane %+v, want lane %d", l1, lane)
			}
		})
	}
}

// A relay whose transport reports a timeout for a write its NIC still
// holds keeps the write's slot until the final report: the sender cannot
// reuse the slot meanwhile, so the late write carries its own Piece's
// bytes. The Piece fails once, as timed out; the rest complete.
func TestFaultTimedOutWriteKeepsItsSlot(t *testing.T) {
	g := newFaultGroup(t, faultGroupOpts{})
	r := g.start("relay", 1, faultMiB)
	s := g.start("sender", 0, 4*faultMiB, "MC_PXN_CREDIT_TIMEOUT_MS=60000")
	s.route(faultRail(1), true, 20*time.Second)
	r.call(faultReq{Op: "hold", On: true})
	ws := faultWrites(1, staging.SlotsPerLane+2, faultPiece, 0, 0)
	s.submit(true, ws...)
	eventually(t, 20*time.Second, "a full ring, four writes held", func() bool {
		l := g.laneOf(r.pid, s.pid)
		return l != nil && l.Published == staging.SlotsPerLane && r.call(faultReq{Op: "held"}).Held == 4
	})
	if n := r.call(faultReq{Op: "timeouts"}).Held; n != 4 {
		t.Fatalf("%d timeout reports queued, want 4", n)
	}
	eventually(t, 20*time.Second, "the relay reading the timeout reports", func() bool {
		return r.call(faultReq{Op: "held"}).Reports == 0
	})
	// A relay that took the reports for final would have completed the
	// four and the sender reused their slots: the ring would run on.
	// Nothing may be reaped until the NIC lets go.
	if l := g.laneOf(r.pid, s.pid); l.Reaped != 0 || l.Published != staging.SlotsPerLane {
		t.Errorf("lane %+v after timeout reports, want nothing reaped and no slot reused", *l)
	}
	r.call(faultReq{Op: "hold", On: false})
	ts := s.wait(30 * time.Second)
	g.ownOrNone(0, ws)
	g.verify(0, ts)
	for i, task := range ts {
		want := "completed"
		if i < 4 {
			want = "failed"
		}
		if task.State != want {
			t.Errorf("task %d is %s (%s), want %s", i, task.State, task.Err, want)
		}
		if i < 4 && !strings.Contains(task.Err, "timed out") {
			t.Errorf("task %d failed with %q, want a timeout", i, task.Err)
		}
	}
	if c := s.counters().Counters; c.FailedPieces != 4 || c.RelayedPieces != staging.SlotsPerLane-2 {
		t.Errorf("sender failed %d and relayed %d Pieces, want 4 and %d", c.FailedPieces, c.RelayedPieces, staging.SlotsPerLane-2)
	}
}

// Pieces whose later parts never land hold one Piece a lane, outside the
// inflight cap, and fail after the parts bound: a hostile sender ringing
// only first part words cannot stop an honest sender on another lane.
func TestFaultPartsThatNeverLandStopNoOtherLane(t *testing.T) {
	const n = 4096
	g := newFaultGroup(t, faultGroupOpts{rails: 3, env: map[string]string{faultPartsEnv: "300"}})
	r := g.start("relay", 1, faultMiB)
	h := attachHostile(t, g, g.hostileRank(2), r)
	var seqs []uint64
	for k := range 4 {
		seqs = append(seqs, h.postParts(faultSession(1), faultBase(1)+uint64(k)*2*n, n))
	}
	s := g.start("honest sender", 0, 4*faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	ws := faultWrites(1, 8, faultPiece, 0, 4*faultMiB)
	s.submit(true, ws...)
	ts := s.wait(30 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 8})
	g.verify(0, ts)
	for _, seq := range seqs {
		if st := h.completion(seq); st != staging.CompletionSecondHop {
			t.Errorf("seq %d: status %d, want %d (second hop)", seq, st, staging.CompletionSecondHop)
		}
	}
	zero := make([]byte, n)
	for k := range 4 {
		second := g.tgt[1][uint64(k)*2*n+n : uint64(k+1)*2*n]
		if i := firstDiff(second, zero); i >= 0 {
			t.Errorf("Piece %d: its second part, which never landed, was written (byte %d)", k, i)
		}
	}
}

// A sender whose heartbeat is late but which still rings (a starved
// process, or one whose GPU streams run on while it is stopped) keeps its
// lane, and its relay takes no new ticket from it until it beats again;
// then every write completes with its own bytes.
func TestFaultLateSenderGetsNoNewTicket(t *testing.T) {
	const hb = 500 * time.Millisecond
	g := newFaultGroup(t, faultGroupOpts{rails: 3, env: map[string]string{
		"MC_PXN_HEARTBEAT_TIMEOUT_MS": strconv.Itoa(int(hb / time.Millisecond)),
		"MC_PXN_CREDIT_TIMEOUT_MS":    "60000",
	}})
	r := g.start("relay", 1, faultMiB)
	s := g.start("sender", 0, 4*faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	s.submit(true, faultWrites(1, 2, faultPiece, 0, 0)...)
	checkStates(t, s.wait(20*time.Second), map[string]int{"completed": 2})

	s.call(faultReq{Op: "pausebeat", On: true})
	eventually(t, 20*time.Second, "the sender's heartbeat three timeouts old", func() bool {
		rep := g.inspect(s.pid)
		return rep != nil && rep.HeartbeatAge > 3*hb
	})
	s.submit(true, faultWrites(1, 4, faultPiece, 0, 2*faultPiece)...)
	var lane int
	eventually(t, 20*time.Second, "four more published", func() bool {
		l := g.laneOf(r.pid, s.pid)
		if l != nil {
			lane = l.Lane
		}
		return l != nil && l.Published == 6
	})
	// Each new heartbeat of the relay is a round of its pump that looked
	// at the lane's tickets after it judged the sender.
	ctl := g.control(r, false)
	beats, last := 0, ctl.Header.LoadHeartbeat()
	eventually(t, 20*time.Second, "three heartbeats of the relay", func() bool {
		if hb := ctl.Header.LoadHeartbeat(); hb != last {
			beats, last = beats+1, hb
		}
		return beats >= 3
	})
	if l := g.laneOf(r.pid, s.pid); l == nil || l.Lane != lane || l.Completed != 2 {
		t.Fatalf("late sender's lane %+v, want lane %d with two completed", l, lane)
	}
	for i, task := range s.tasks()[2:] {
		if task.State != "pending" {
			t.Errorf("task %d of the late sender is %s (%s), want pending", 2+i, task.State, task.Err)
		}
	}

	s.call(faultReq{Op: "pausebeat", On: false})
	ts := s.wait(30 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 6})
	g.verify(0, ts)
	if k := s.counters().Counters; k.RelayedPieces != 6 {
		t.Errorf("relayed %d pieces, want 6", k.RelayedPieces)
	}
}
