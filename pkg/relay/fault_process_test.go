// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

// The fault tests run every rank as its own process (the test binary in a
// rank role, see fault_main_test.go) against the real registry in
// /dev/shm and a TCP target server in the test process, and kill, restart,
// stall and corrupt them. Sizes are small (64 KiB Pieces) so that each test
// stays well under a minute on two loaded cores.

func checkStates(t *testing.T, ts []faultTask, want map[string]int) {
	t.Helper()
	got := map[string]int{}
	for _, task := range ts {
		got[task.State]++
	}
	for s, n := range want {
		if got[s] != n {
			t.Errorf("%d tasks %s, want %d (all: %v)", got[s], s, n, got)
		}
	}
}

// piecesAccountedFor checks relayed + fallback + failed == submitted.
func piecesAccountedFor(t *testing.T, c faultResp, submitted int) {
	t.Helper()
	k := c.Counters
	if got := k.RelayedPieces + k.FallbackPieces + k.FailedPieces; got != uint64(submitted) {
		t.Errorf("relayed %d + fallback %d + failed %d = %d pieces, want the %d submitted",
			k.RelayedPieces, k.FallbackPieces, k.FailedPieces, got, submitted)
	}
}

func filesOf(g *faultGroup, pid int) []string {
	var out []string
	for _, f := range g.files() {
		if strings.Contains(f, "-"+strconv.Itoa(pid)+"-") {
			out = append(out, f)
		}
	}
	return out
}

func onlyLock(t *testing.T, g *faultGroup) {
	t.Helper()
	var fs []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fs = g.files(); len(fs) == 1 && fs[0] == ".lock" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry holds %v, want only .lock", fs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A relay SIGKILLed with a full ring and a queue behind it: every published
// ticket fails exactly once, every queued Piece goes direct exactly once and
// only after its source-ready event, and every completed byte is right.
func TestFaultRelayKilled(t *testing.T) {
	g := newFaultGroup(t, faultGroupOpts{})
	s := g.start("sender", 0, 4*faultMiB)
	r := g.start("relay", 1, faultMiB)
	s.route(faultRail(1), true, 20*time.Second)

	s.submit(true, faultWrites(1, 4, faultPiece, 0, 0)...)
	checkStates(t, s.wait(20*time.Second), map[string]int{"completed": 4})

	// The relay's second hop is held: it takes InflightDepth tickets, the
	// sender fills its ring (18 published) and queues the rest.
	r.call(faultReq{Op: "hold", On: true})
	s.submit(true, faultWrites(1, 30, faultPiece, 4*faultPiece, 4*faultPiece)...)
	eventually(t, 20*time.Second, "a full ring", func() bool {
		l := g.laneOf(r.pid, s.pid)
		return l != nil && l.Published-l.Reaped == staging.SlotsPerLane
	})
	// Five more queued behind, their sources not ready yet.
	s.call(faultReq{Op: "holdready", On: true})
	s.submit(true, faultWrites(1, 5, faultPiece, 34*faultPiece, 34*faultPiece)...)
	r.kill()

	final := func(ts []faultTask, from, to int) bool {
		for _, task := range ts[from:to] {
			if task.State == "pending" {
				return false
			}
		}
		return true
	}
	eventually(t, 20*time.Second, "the ring failed and the queue sent direct", func() bool { return final(s.tasks(), 0, 34) })
	ts := s.tasks()
	for i, task := range ts[34:] {
		if task.State != "pending" {
			t.Errorf("queued task %d is %s before its source was ready", i, task.State)
		}
	}
	if c := s.counters().Counters; c.FallbackPieces != 12 {
		t.Errorf("%d pieces went direct before the held sources were ready, want 12", c.FallbackPieces)
	}
	s.call(faultReq{Op: "holdready", On: false})
	if n := s.call(faultReq{Op: "releaseready"}).Released; n != 5 {
		t.Errorf("%d source-ready events held, want 5", n)
	}
	ts = s.wait(20 * time.Second)
	g.verify(0, ts)
	for i, task := range ts {
		want := "completed"
		if i >= 4 && i < 4+staging.SlotsPerLane {
			want = "failed"
		}
		if task.State != want {
			t.Errorf("task %d (%+v) is %s (%s), want %s", i, task.Write, task.State, task.Err, want)
		}
		if task.State == "failed" && !strings.Contains(task.Err, "relay gone") {
			t.Errorf("task %d failed with %q, want the relay gone", i, task.Err)
		}
	}
	c := s.counters()
	piecesAccountedFor(t, c, 39)
	if k := c.Counters; k.RelayedPieces != 4 || k.FailedPieces != staging.SlotsPerLane || k.FallbackPieces != 17 {
		t.Errorf("relayed %d failed %d fallback %d pieces, want 4, %d and 17", k.RelayedPieces, k.FailedPieces, k.FallbackPieces, staging.SlotsPerLane)
	}
	if n := c.Counters.FallbackPiecesByReason[staging.FallbackRelayGone]; n != 17 {
		t.Errorf("%d pieces fell back because the relay was gone, want all 17 (%v)", n, c.Counters.FallbackPiecesByReason)
	}
	eventually(t, 10*time.Second, "the dead relay's files removed", func() bool { return len(filesOf(g, r.pid)) == 0 })
	if cl := s.close(5 * time.Second); cl.CloseErr != "" {
		t.Errorf("sender close: %s", cl.CloseErr)
	}
	s.exit()
	onlyLock(t, g)
}

// A sender SIGKILLed with tickets in flight: the relay finishes them, frees
// the lane once the sender is gone, and a restarted sender (a new
// registration) claims it and works. Nothing is left behind.
func TestFaultSenderKilled(t *testing.T) {
	g := newFaultGroup(t, faultGroupOpts{})
	r := g.start("relay", 1, faultMiB)
	s1 := g.start("sender", 0, 4*faultMiB)
	s1.route(faultRail(1), true, 20*time.Second)
	r.call(faultReq{Op: "hold", On: true})
	s1.submit(true, faultWrites(1, 10, faultPiece, 0, 0)...)
	var lane inspect.LaneReport
	eventually(t, 20*time.Second, "ten published", func() bool {
		l := g.laneOf(r.pid, s1.pid)
		if l != nil {
			lane = *l
		}
		return l != nil && l.Published == 10
	})
	// Every doorbell rung: from here on the Pieces are the relay's.
	eventually(t, 20*time.Second, "ten doorbells", func() bool { return s1Landed(r, lane.Lane, 10) })
	s1.kill()
	r.call(faultReq{Op: "hold", On: false})
	eventually(t, 20*time.Second, "the dead sender's lane freed and its files removed", func() bool {
		rep := g.inspect(r.pid)
		return rep != nil && rep.Lanes[lane.Lane].OwnerPid == 0 && len(filesOf(g, s1.pid)) == 0
	})
	eventually(t, 20*time.Second, "the relay forwarding what was published", func() bool {
		return r.counters().Counters.ForwardedPieces == 10
	})

	s2 := g.start("sender again", 0, 4*faultMiB)
	s2.route(faultRail(1), true, 20*time.Second)
	s2.submit(true, faultWrites(1, 10, faultPiece, 0, 10*faultPiece)...)
	ts := s2.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 10})
	g.verify(0, ts)
	if c := s2.counters().Counters; c.RelayedPieces != 10 {
		t.Errorf("restarted sender relayed %d pieces, want 10", c.RelayedPieces)
	}
	// The relay copies a lane's progress into its control file with its
	// heartbeat.
	var l *inspect.LaneReport
	eventually(t, 20*time.Second, "the restarted sender's progress in the relay's control file", func() bool {
		l = g.laneOf(r.pid, s2.pid)
		return l != nil && l.Next == 11 && l.Completed == 10
	})
	if l.Lane != lane.Lane || l.LaneEpoch == lane.LaneEpoch {
		t.Errorf("restarted sender's lane %+v, want lane %d reclaimed under a new epoch (old %+v)", l, lane.Lane, lane)
	}
	s2.close(5 * time.Second)
	s2.exit()
	eventually(t, 10*time.Second, "the lane free again", func() bool {
		rep := g.inspect(r.pid)
		return rep != nil && rep.Lanes[lane.Lane].OwnerPid == 0
	})
	if cl := r.close(5 * time.Second); cl.CloseErr != "" {
		t.Errorf("relay close: %s", cl.CloseErr)
	}
	r.exit()
	onlyLock(t, g)
}

// A relay killed and started again is a new registration: tickets of the
// old one fail, new tickets go to the new one under a new lane epoch.
func TestFaultRelayRestarted(t *testing.T) {
	g := newFaultGroup(t, faultGroupOpts{})
	s := g.start("sender", 0, 4*faultMiB)
	r1 := g.start("relay", 1, faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	r1.call(faultReq{Op: "hold", On: true})
	s.submit(true, faultWrites(1, 25, faultPiece, 0, 0)...)
	var old inspect.LaneReport
	eventually(t, 20*time.Second, "a full ring", func() bool {
		l := g.laneOf(r1.pid, s.pid)
		if l != nil {
			old = *l
		}
		return l != nil && l.Published == staging.SlotsPerLane
	})
	r1.kill()
	r2 := g.start("relay again", 1, faultMiB)
	ts := s.wait(20 * time.Second)
	g.verify(0, ts)
	for i, task := range ts {
		want := "completed"
		if i < staging.SlotsPerLane {
			want = "failed"
		}
		if task.State != want {
			t.Errorf("task %d is %s (%s), want %s", i, task.State, task.Err, want)
		}
	}
	s.route(faultRail(1), true, 20*time.Second)
	s.submit(true, faultWrites(1, 6, faultPiece, 0, 25*faultPiece)...)
	ts = s.wait(20 * time.Second)
	checkStates(t, ts[25:], map[string]int{"completed": 6})
	g.verify(0, ts)
	var l *inspect.LaneReport
	eventually(t, 20*time.Second, "the lane's progress on the new relay", func() bool {
		l = g.laneOf(r2.pid, s.pid)
		return l != nil && l.Next == 7 && l.Completed == 6
	})
	if l.LaneEpoch == old.LaneEpoch {
		t.Errorf("lane on the new relay %+v, want seqs 1..6 under an epoch other than %s", l, old.LaneEpoch)
	}
	if f := r2.counters().Counters.ForwardedPieces; f != 6 {
		t.Errorf("new relay forwarded %d pieces, want 6", f)
	}
	c := s.counters()
	piecesAccountedFor(t, c, 31)
	if k := c.Counters; k.RelayedPieces != 6 || k.FailedPieces != staging.SlotsPerLane || k.FallbackPieces != 7 {
		t.Errorf("counters %+v", k)
	}
	if fs := filesOf(g, r1.pid); len(fs) != 0 {
		t.Errorf("files of the killed relay left: %v", fs)
	}
}

// A relay that stops beating but keeps running gets no new tickets, and the
// ones it has still complete. It stays in the registry: when it beats again
// it is used again, by the ranks that knew it and by a rank that did not.
func TestFaultHeartbeatStall(t *testing.T) {
	g := newFaultGroup(t, faultGroupOpts{rails: 3})
	s := g.start("sender", 0, 4*faultMiB)
	r := g.start("relay", 1, faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	r.call(faultReq{Op: "hold", On: true})
	// 18 published, 4 of them in the relay's second hop; 4 more queued.
	s.submit(true, faultWrites(1, 22, faultPiece, 0, 0)...)
	eventually(t, 20*time.Second, "a full ring", func() bool {
		l := g.laneOf(r.pid, s.pid)
		return l != nil && l.Published == staging.SlotsPerLane
	})
	r.call(faultReq{Op: "pausebeat", On: true})
	s.route(faultRail(1), false, 20*time.Second)

	// Stale, not gone: its control file and arena socket stay (its arena
	// is a memfd, no file).
	if rep := g.inspect(r.pid); rep == nil || len(filesOf(g, r.pid)) != 2 {
		t.Fatalf("a stalled but running relay was removed from the registry (files %v)", filesOf(g, r.pid))
	}
	// New work goes direct, and so do the Pieces that were only queued.
	s.submit(true, faultWrites(1, 2, faultPiece, 22*faultPiece, 22*faultPiece)...)
	eventually(t, 20*time.Second, "the queued and the new pieces sent direct", func() bool {
		ts := s.tasks()
		for _, task := range ts[staging.SlotsPerLane:] {
			if task.State == "pending" {
				return false
			}
		}
		return true
	})
	ts := s.tasks()
	for i, task := range ts[:staging.SlotsPerLane] {
		if task.State != "pending" {
			t.Errorf("published task %d is %s (%s) while the relay stalls, want pending", i, task.State, task.Err)
		}
	}
	for i, task := range ts[22:] {
		if task.Route != "direct" {
			t.Errorf("new task %d routed %s to a stalled relay", i, task.Route)
		}
	}

	// Its published tickets complete.
	r.call(faultReq{Op: "hold", On: false})
	ts = s.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 24})
	g.verify(0, ts)
	if k := s.counters().Counters; k.RelayedPieces != staging.SlotsPerLane || k.FallbackPieces != 4 ||
		k.FallbackPiecesByReason[staging.FallbackRelayStale] != 4 {
		t.Errorf("relayed %d fallback %d pieces (by reason %v), want %d and 4, all for a stale relay",
			k.RelayedPieces, k.FallbackPieces, k.FallbackPiecesByReason, staging.SlotsPerLane)
	}

	// Beating again, it is used again, also by a rank that never saw it.
	r.call(faultReq{Op: "pausebeat", On: false})
	s.route(faultRail(1), true, 20*time.Second)
	s.submit(true, faultWrites(1, 2, faultPiece, 0, 24*faultPiece)...)
	ts = s.wait(20 * time.Second)
	checkStates(t, ts[24:], map[string]int{"completed": 2})
	g.verify(0, ts)
	s3 := g.start("late sender", 2, faultMiB)
	s3.route(faultRail(1), true, 20*time.Second)
	s3.submit(true, faultWrites(1, 2, faultPiece, 0, 26*faultPiece)...)
	ts = s3.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 2})
	g.verify(2, ts)
	for _, task := range ts {
		if task.Route != "pxn" {
			t.Errorf("late sender's task routed %s, want pxn", task.Route)
		}
	}
}

// Credit that does not come back within the credit timeout sends the
// queued Pieces direct, all of them once the lane has waited that long,
// not one timeout per Piece.
func TestFaultCreditTimeoutSendsQueueDirect(t *testing.T) {
	const (
		queued = 40
		credit = time.Second
		// One timeout per Piece would take queued × credit (40 s); all
		// of them at once take one credit timeout and the direct writes.
		// The limit is half the first, so the rest is for a loaded
		// machine.
		limit = queued * credit / 2
	)
	g := newFaultGroup(t, faultGroupOpts{env: map[string]string{contract.EnvCreditTimeout: fmt.Sprint(credit.Milliseconds())}})
	s := g.start("sender", 0, 4*faultMiB)
	r := g.start("relay", 1, faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	r.call(faultReq{Op: "hold", On: true})
	start := time.Now()
	s.submit(true, faultWrites(1, staging.SlotsPerLane+queued, faultPiece, 0, 0)...)
	eventually(t, limit+20*time.Second, "the queued pieces sent direct", func() bool {
		for _, task := range s.tasks()[staging.SlotsPerLane:] {
			if task.State == "pending" {
				return false
			}
		}
		return true
	})
	took := time.Since(start)
	t.Logf("%d queued pieces went direct %v after the submit, with a %v credit timeout", queued, took.Round(time.Millisecond), credit)
	if took > limit {
		t.Errorf("%d queued pieces took %v to go direct after a %v credit timeout, want at most %v", queued, took, credit, limit)
	}
	r.call(faultReq{Op: "hold", On: false})
	ts := s.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": staging.SlotsPerLane + queued})
	g.verify(0, ts)
	c := s.counters()
	piecesAccountedFor(t, c, staging.SlotsPerLane+queued)
	if k := c.Counters; k.RelayedPieces != staging.SlotsPerLane || k.FallbackPieces != queued ||
		k.FallbackPiecesByReason[staging.FallbackCreditTimeout] != queued {
		t.Errorf("relayed %d fallback %d (by reason %v), want %d and %d, all for the credit timeout",
			k.RelayedPieces, k.FallbackPieces, k.FallbackPiecesByReason, staging.SlotsPerLane, queued)
	}

	// What each pump published in its control file, as inspect reads it.
	var sent, fwd *inspect.StatsReport
	eventually(t, 10*time.Second, "the counters published in the control files", func() bool {
		rs, rr := g.inspect(s.pid), g.inspect(r.pid)
		if rs == nil || rr == nil || rs.Stats == nil || rr.Stats == nil {
			return false
		}
		sent, fwd = rs.Stats, rr.Stats
		return sent.RelayedPieces == staging.SlotsPerLane && sent.FallbackPieces.Total() == queued && fwd.ForwardedPieces == staging.SlotsPerLane
	})
	if sent.FallbackPieces[staging.FallbackCreditTimeout] != queued || sent.FallbackBytes[staging.FallbackCreditTimeout] != queued*faultPiece {
		t.Errorf("sender published fallbacks %v pieces %v bytes, want %d pieces of %d bytes for the credit timeout",
			sent.FallbackPieces, sent.FallbackBytes, queued, faultPiece)
	}
	if sent.Device != "host" || sent.OutboundLanes != 1 || fwd.InboundLanes != 1 || sent.CreditWaits == 0 || sent.PumpCPU <= 0 {
		t.Errorf("sender published %+v, relay %+v: want device host, one lane each way, credit waits and pump CPU", sent, fwd)
	}
}

// A second hop that fails fails the logical slices of its Piece, with the
// reason; the relay and the rest of the traffic go on.
func TestFaultSecondHopFailure(t *testing.T) {
	g := newFaultGroup(t, faultGroupOpts{tgtBytes: 2 * faultMiB, dirBytes: 4 * faultMiB})
	s := g.start("sender", 0, 4*faultMiB)
	r := g.start("relay", 1, faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	ws := append(faultWrites(1, 4, faultPiece, 0, 0), faultWrites(1, 4, faultPiece, 4*faultPiece, 2*faultMiB)...)
	s.submit(true, ws...)
	ts := s.wait(20 * time.Second)
	g.verify(0, ts)
	for i, task := range ts {
		if i < 4 && task.State != "completed" {
			t.Errorf("task %d into registered memory: %s (%s)", i, task.State, task.Err)
		}
		if i >= 4 && (task.State != "failed" || !strings.Contains(task.Err, "second hop failed")) {
			t.Errorf("task %d beyond registered memory: %s (%q), want failed by the second hop", i, task.State, task.Err)
		}
	}
	c := s.counters()
	piecesAccountedFor(t, c, 8)
	if k := c.Counters; k.FailedPieces != 4 || k.SecondHopFailures != 4 || k.FallbackPieces != 0 {
		t.Errorf("sender counters %+v", k)
	}
	if k := r.counters().Counters; k.SecondHopFailures != 4 || k.ForwardedPieces != 4 {
		t.Errorf("relay counters %+v", k)
	}
}

// Closing under load ends within the close deadline and leaves every task
// final, whether a sender or a relay closes first.
func TestFaultShutdownUnderLoad(t *testing.T) {
	const bound = 2 * time.Second
	g := newFaultGroup(t, faultGroupOpts{})
	r := g.start("relay", 1, faultMiB)
	s1 := g.start("sender", 0, 4*faultMiB)
	s1.route(faultRail(1), true, 20*time.Second)
	r.call(faultReq{Op: "hold", On: true})
	s1.submit(true, faultWrites(1, 40, faultPiece, 0, 0)...)
	lane := -1
	eventually(t, 20*time.Second, "a full ring", func() bool {
		l := g.laneOf(r.pid, s1.pid)
		if l != nil {
			lane = l.Lane
		}
		return l != nil && l.Published == staging.SlotsPerLane
	})
	cl := s1.close(bound)
	checkClosed(t, "sender", cl, bound)
	s1.exit()
	// The lane opens to the next sender only once the relay has ended the
	// second hop of what the closed sender published.
	r.call(faultReq{Op: "hold", On: false})
	eventually(t, 20*time.Second, "the closed sender's ring ended", func() bool {
		rep := g.inspect(r.pid)
		return rep != nil && rep.Lanes[lane].Completed == staging.SlotsPerLane
	})
	r.call(faultReq{Op: "hold", On: true})

	s2 := g.start("sender again", 0, 4*faultMiB)
	s2.route(faultRail(1), true, 20*time.Second)
	s2.submit(true, faultWrites(1, 40, faultPiece, 0, 40*faultPiece)...)
	eventually(t, 20*time.Second, "a full ring", func() bool {
		l := g.laneOf(r.pid, s2.pid)
		return l != nil && l.Published == staging.SlotsPerLane
	})
	cl = r.close(bound)
	checkClosed(t, "relay", cl, bound)
	ts := s2.wait(20 * time.Second)
	g.verify(0, ts)
	checkStates(t, ts, map[string]int{"failed": staging.SlotsPerLane, "completed": 40 - staging.SlotsPerLane})
	r.exit()
	// The relay kept its arena for the sender's lease and exited; the
	// sender's next registry scan removes what is left of it.
	eventually(t, 10*time.Second, "the relay's files removed", func() bool { return len(filesOf(g, r.pid)) == 0 })
	cl = s2.close(bound)
	checkClosed(t, "sender", cl, bound)
	s2.exit()
	onlyLock(t, g)
}

// closeSlack is how far past its deadline a Close may return before the
// tests call it a Close that ignores its context. What Close does after the
// deadline (stopping the copier, unmapping, closing the registry with the
// spent context) takes milliseconds; the rest is for a loaded machine under
// -race. It stays below the registry's 10 s drain, which a Close ignoring
// its context would wait out.
const closeSlack = 6 * time.Second

// checkClosed checks that a Close with deadline bound left every task final
// and returned by its deadline, give or take closeSlack.
func checkClosed(t *testing.T, who string, cl faultResp, bound time.Duration) {
	t.Helper()
	if !cl.Done {
		t.Errorf("%s closed with tasks pending: %s", who, pendingSummary(cl.Tasks))
	}
	if took := time.Duration(cl.ElapsedMS * float64(time.Millisecond)); took > bound+closeSlack {
		t.Errorf("%s took %v to close with a %v deadline", who, took, bound)
	}
	t.Logf("%s closed in %.0f ms (%s)", who, cl.ElapsedMS, fmt.Sprint(cl.CloseErr))
}
