// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// hostileRank registers the test process itself in the group, beating, so
// that it can claim a lane through the real registry and then write
// whatever it likes into it.
func (g *faultGroup) hostileRank(index int) *registry.Rank {
	t := g.t
	t.Helper()
	ctx := context.Background()
	rank, err := registry.Register(ctx, registry.Options{Root: g.root, Group: g.group, UID: os.Geteuid(),
		Rail: faultRail(index), HCA: fmt.Sprintf("mlx5_%d", index), HeartbeatTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				rank.Heartbeat(staging.MonoNanos())
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-stopped
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = rank.Close(cctx)
	})
	return rank
}

// hostileLane is a lane on a relay that the test writes by hand.
type hostileLane struct {
	t    *testing.T
	link *registry.PeerLink
	// w and r are the claim's blocks as mapped here: the sender block
	// read-write, the relay block read-only.
	w     *staging.LaneSenderBlock
	r     *staging.LaneRelayBlock
	epoch uint64
	next  uint64
}

func attachHostile(t *testing.T, g *faultGroup, rank *registry.Rank, relay *faultProc) *hostileLane {
	t.Helper()
	ctx := context.Background()
	var info registry.PeerInfo
	eventually(t, 20*time.Second, "the relay listed", func() bool {
		ps, err := rank.Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Pid == relay.pid && p.Refused == nil && p.State == staging.StateReady {
				info = p
				return true
			}
		}
		return false
	})
	link, err := rank.Attach(ctx, info)
	if err != nil {
		t.Fatal(err)
	}
	// A hostile sender writes the lane's words by hand, through its own
	// mapping of the claim's sender block, not through the endpoint.
	ws, ok := blockMapping(os.Getpid(), relay.rank, link.LaneIndex(), "sender", "rw-s")
	rs, ok2 := blockMapping(os.Getpid(), relay.rank, link.LaneIndex(), "relay", "r--s")
	if !ok || !ok2 {
		t.Fatalf("no mapping of lane %d's blocks of %s", link.LaneIndex(), relay.rank)
	}
	// ws and rs are shared mappings, not Go memory.
	w := (*staging.LaneSenderBlock)(*(*unsafe.Pointer)(unsafe.Pointer(&ws)))
	r := (*staging.LaneRelayBlock)(*(*unsafe.Pointer)(unsafe.Pointer(&rs)))
	// Like an honest one, it waits for the relay to open its epoch.
	eventually(t, 20*time.Second, "the lane opened", func() bool { return link.Sender().Opened() })
	return &hostileLane{t: t, link: link, w: w, r: r, epoch: link.LaneEpoch(), next: 1}
}

// post writes a valid Desc of one plan entry (n bytes of rank seed's
// pattern to dst of session) into the next slot, lets mutate break it,
// commits it as commit (0: its own seq) and rings the doorbell.
func (h *hostileLane) post(session string, dst, n uint64, commit uint64, mutate func(d *staging.Desc)) uint64 {
	h.t.Helper()
	seq := h.next
	h.next++
	slot := staging.SlotOf(seq)
	addr := h.link.StagingBase() + uintptr(slot)*staging.SlotSize
	// addr is the relay's arena as mapped here, not Go memory.
	data := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr))), n)
	faultPattern(data, hostileSeed, seq*n)
	d := &h.w.Descs[slot]
	if err := d.Fill(h.epoch, session, []staging.PlanEntry{{Dst: dst, Len: n}}, n, nil); err != nil {
		h.t.Fatal(err)
	}
	if mutate != nil {
		mutate(d)
	}
	if commit == 0 {
		commit = seq
	}
	staging.PublishDesc(d, commit)
	atomic.StoreUint64(&h.w.Ready[slot].Seq, seq)
	return seq
}

// postParts writes a Desc of two plan entries of n bytes each (rank
// seed's pattern, to dst and dst+n of session) in two parts, one entry
// each, commits it and stores seq into the first part word only: the first
// part has landed, the second never will.
func (h *hostileLane) postParts(session string, dst, n uint64) uint64 {
	h.t.Helper()
	seq := h.next
	h.next++
	slot := staging.SlotOf(seq)
	addr := h.link.StagingBase() + uintptr(slot)*staging.SlotSize
	// addr is the relay's arena as mapped here, not Go memory.
	data := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr))), 2*n)
	faultPattern(data, hostileSeed, seq*n)
	d := &h.w.Descs[slot]
	plans := []staging.PlanEntry{{Dst: dst, Len: n}, {Dst: dst + n, Len: n}}
	if err := d.Fill(h.epoch, session, plans, 2*n, []uint32{1}); err != nil {
		h.t.Fatal(err)
	}
	staging.PublishDesc(d, seq)
	atomic.StoreUint64(&h.w.Ready[slot].Parts[0], seq)
	return seq
}

// completion waits for seq's completion and returns its status.
func (h *hostileLane) completion(seq uint64) int32 {
	h.t.Helper()
	c := &h.r.Completions[staging.SlotOf(seq)]
	eventually(h.t, 20*time.Second, fmt.Sprintf("the completion of seq %d", seq), func() bool { return atomic.LoadUint64(&c.Seq) == seq })
	return atomic.LoadInt32(&c.Status)
}

const hostileSeed = 0xbad

// A sender that claims a lane through the real registry and writes broken
// Descs by hand gets a failed completion for each, one test per validation
// rule; credit comes back every time, its lane keeps working, and the relay
// goes on serving the honest sender on another lane.
func TestFaultMalformedDesc(t *testing.T) {
	const n = 4096
	g := newFaultGroup(t, faultGroupOpts{rails: 3})
	r := g.start("relay", 1, faultMiB)
	s := g.start("honest sender", 0, 4*faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	s.submit(true, faultWrites(1, 6, faultPiece, 0, 0)...)
	h := attachHostile(t, g, g.hostileRank(2), r)

	dst := faultBase(1) + 4*faultMiB
	rules := []struct {
		name   string
		commit func(seq uint64) uint64
		mutate func(d *staging.Desc)
	}{
		{"commit seq not the doorbell's", func(seq uint64) uint64 { return seq + 100 }, nil},
		{"commit seq beyond MaxLaneSeq", func(uint64) uint64 { return staging.MaxLaneSeq + 1 }, nil},
		{"epoch of another claim", nil, func(d *staging.Desc) { d.Epoch ^= 1 }},
		{"epoch 0", nil, func(d *staging.Desc) { d.Epoch = 0 }},
		{"piece len 0", nil, func(d *staging.Desc) { d.PieceLen = 0 }},
		{"piece len over the slot", nil, func(d *staging.Desc) { d.PieceLen = staging.SlotSize + 1 }},
		{"plan count 0", nil, func(d *staging.Desc) { d.PlanCount = 0 }},
		{"plan count over the maximum", nil, func(d *staging.Desc) { d.PlanCount = staging.MaxPlans + 1 }},
		{"plan len 0", nil, func(d *staging.Desc) {
			d.Plans[1] = d.Plans[0]
			d.Plans[0].Len = 0
			d.PlanCount = 2
		}},
		{"dst overflows", nil, func(d *staging.Desc) { d.Plans[0].Dst = math.MaxUint64 - n + 2 }},
		{"plan sum short of the piece", nil, func(d *staging.Desc) { d.PieceLen = n + 1 }},
		{"plan sum over the piece", nil, func(d *staging.Desc) { d.PieceLen = n - 1 }},
		{"session len 0", nil, func(d *staging.Desc) { d.SessionLen = 0 }},
		{"session len over the maximum", nil, func(d *staging.Desc) { d.SessionLen = staging.MaxSession + 1 }},
		{"parts over the ready line", nil, func(d *staging.Desc) { d.Parts = staging.MaxParts + 1 }},
		{"a part of no entry", nil, func(d *staging.Desc) { d.Parts, d.PartEnds[0] = 2, 1 }},
	}
	for _, rule := range rules {
		t.Run(rule.name, func(t *testing.T) {
			h.t = t
			commit := uint64(0)
			if rule.commit != nil {
				commit = rule.commit(h.next)
			}
			seq := h.post(faultSession(1), dst, n, commit, rule.mutate)
			if st := h.completion(seq); st != staging.CompletionInvalidDesc {
				t.Errorf("status %d, want %d (invalid descriptor)", st, staging.CompletionInvalidDesc)
			}
			if c := atomic.LoadUint64(&h.r.Relay.CompletedSeq); c != seq {
				t.Errorf("completed seq %d, want %d: credit not returned", c, seq)
			}
		})
	}
	h.t = t
	if got := r.counters().Counters.InvalidDescs; got != uint64(len(rules)) {
		t.Errorf("relay counted %d invalid descs, want %d", got, len(rules))
	}
	// The same lane still carries a valid Desc, and refuses a target that
	// is not on the relay's rail.
	seq := h.post(faultSession(1), dst, n, 0, nil)
	if st := h.completion(seq); st != staging.CompletionOK {
		t.Fatalf("valid desc after the invalid ones: status %d", st)
	}
	want := make([]byte, n)
	faultPattern(want, hostileSeed, seq*n)
	if i := firstDiff(g.tgt[1][4*faultMiB:4*faultMiB+n], want); i >= 0 {
		t.Errorf("relayed byte %d wrong", i)
	}
	if st := h.completion(h.post(faultSession(0), faultBase(0), n, 0, nil)); st != staging.CompletionUnresolved {
		t.Errorf("target on another rail: status %d, want %d", st, staging.CompletionUnresolved)
	}
	s.submit(true, faultWrites(1, 6, faultPiece, 6*faultPiece, 6*faultPiece)...)
	ts := s.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 12})
	g.verify(0, ts)
	if c := s.counters().Counters; c.RelayedPieces != 12 {
		t.Errorf("honest sender relayed %d pieces, want 12", c.RelayedPieces)
	}
}

// A sender whose Piece's first part landed and that then gives its lane
// up (or dies, and the relay frees it) never lands the rest: the relay
// forwards the first part, waits, and once the lane is no longer the
// sender's completes the Piece as failed and frees its place in the second
// hop; the second part's destination is untouched, and the relay goes on
// serving an honest sender.
func TestFaultPartsOfASenderThatLeft(t *testing.T) {
	const n = 4096
	// The parts bound is out of the way: the lane's end fails the Piece.
	g := newFaultGroup(t, faultGroupOpts{rails: 3, env: map[string]string{faultPartsEnv: "600000"}})
	r := g.start("relay", 1, faultMiB)
	h := attachHostile(t, g, g.hostileRank(2), r)
	dst := faultBase(1)
	seq := h.postParts(faultSession(1), dst, n)
	want := make([]byte, 2*n)
	faultPattern(want, hostileSeed, seq*n)
	eventually(t, 20*time.Second, "the first part forwarded", func() bool {
		return firstDiff(g.tgt[1][:n], want[:n]) < 0
	})
	if c := r.counters().Counters; c.ForwardedPieces != 0 || c.SecondHopFailures != 0 {
		t.Fatalf("with a part still to land: %d Pieces forwarded, %d failed; want none", c.ForwardedPieces, c.SecondHopFailures)
	}
	lane := h.link.LaneIndex()
	if err := h.link.Close(); err != nil {
		t.Fatal(err)
	}
	// The sender gave its blocks up with its lane: the completion is
	// read where the relay writes it, in the relay's memory.
	c := unsafe.Offsetof(staging.LaneRelayBlock{}.Completions) + uintptr(staging.SlotOf(seq))*unsafe.Sizeof(staging.Completion{})
	eventually(t, 20*time.Second, fmt.Sprintf("the completion of seq %d", seq), func() bool {
		got, ok := relayWord(r, lane, "relay", c+unsafe.Offsetof(staging.Completion{}.Seq))
		return ok && got == seq
	})
	status, _ := relayWord(r, lane, "relay", c+unsafe.Offsetof(staging.Completion{}.Status))
	if st := int32(uint32(status)); st != staging.CompletionSecondHop {
		t.Fatalf("status %d, want %d (second hop)", st, staging.CompletionSecondHop)
	}
	if c := r.counters().Counters; c.SecondHopFailures != 1 || c.ForwardedPieces != 0 {
		t.Fatalf("relay counted %d second-hop failures and %d forwarded Pieces; want 1 and 0", c.SecondHopFailures, c.ForwardedPieces)
	}
	if i := firstDiff(g.tgt[1][n:2*n], make([]byte, n)); i >= 0 {
		t.Fatalf("the second part, which never landed, was written (byte %d)", i)
	}
	s := g.start("honest sender", 0, 4*faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	s.submit(true, faultWrites(1, 6, faultPiece, 0, 4*faultMiB)...)
	ts := s.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 6})
	g.verify(0, ts)
}

// A sender that ignores credit rings the doorbell of seq K+1 while seq 1,
// in the same slot, is still in the relay's second hop. The relay waits:
// it never holds two tickets of one slot, and every seq gets its own
// completion with its own status. (What the sender wrote over its own
// slot meanwhile is its own business.)
func TestFaultSenderIgnoringCredit(t *testing.T) {
	const n = 4096
	g := newFaultGroup(t, faultGroupOpts{rails: 3})
	r := g.start("relay", 1, faultMiB)
	h := attachHostile(t, g, g.hostileRank(2), r)
	r.call(faultReq{Op: "hold", On: true})
	dst := faultBase(1)
	first := h.post(faultSession(1), dst, n, 0, nil)
	broken := func(d *staging.Desc) { d.PieceLen = 0 }
	for i := 0; i < staging.SlotsPerLane-1; i++ {
		h.post(faultSession(1), dst, n, 0, broken)
	}
	eventually(t, 20*time.Second, "the relay refusing seqs 2..18", func() bool {
		return r.counters().Counters.InvalidDescs == staging.SlotsPerLane-1
	})
	// Every pump round polls every inbound lane and, finding nothing to
	// take, ends in a sleep: two sleeps past the count read before the
	// doorbell rang hold a whole round that began after it, in which the
	// relay saw seq 19's doorbell and would have taken it.
	sleeps := r.counters().Counters.PumpSleeps
	over := h.post(faultSession(1), dst, n, 0, broken)
	eventually(t, 20*time.Second, "a relay pump round after the doorbell of seq 19", func() bool {
		return r.counters().Counters.PumpSleeps >= sleeps+2
	})
	if got := r.counters().Counters.InvalidDescs; got != staging.SlotsPerLane-1 {
		t.Fatalf("relay took seq %d while seq %d of the same slot was in flight (%d refused, want %d)", over, first, got, staging.SlotsPerLane-1)
	}
	r.call(faultReq{Op: "hold", On: false})
	// Seq 19 shares slot 0 with seq 1: its completion replaces seq 1's, so
	// seq 1 shows in the relay's counters and the target's bytes.
	if st := h.completion(over); st != staging.CompletionInvalidDesc {
		t.Errorf("seq %d: status %d, want invalid descriptor", over, st)
	}
	if c := atomic.LoadUint64(&h.r.Relay.CompletedSeq); c != over {
		t.Errorf("completed seq %d, want %d", c, over)
	}
	for seq := first + 1; seq < over; seq++ {
		c := &h.r.Completions[staging.SlotOf(seq)]
		if c.Seq != seq || c.Status != staging.CompletionInvalidDesc {
			t.Errorf("completion of slot %d: seq %d status %d, want seq %d invalid", staging.SlotOf(seq), c.Seq, c.Status, seq)
		}
	}
	if k := r.counters().Counters; k.ForwardedPieces != 1 || k.SecondHopFailures != 0 || k.InvalidDescs != staging.SlotsPerLane {
		t.Errorf("relay counters %+v, want seq %d forwarded and %d refused", k, first, staging.SlotsPerLane)
	}
}

// scribble writes random words (and zeros and all-ones, what a buggy
// memset leaves) over the header and the lane summaries of the control
// files, all that a member reaches of another rank, until stop closes,
// and returns how many words it wrote.
func scribble(ctls []*staging.ControlBlock, seed uint64, stop <-chan struct{}) uint64 {
	rng := rand.New(rand.NewPCG(seed, 0x5c1b))
	var n uint64
	value := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return math.MaxUint64
		}
		return rng.Uint64()
	}
	for {
		select {
		case <-stop:
			return n
		default:
		}
		ctl := ctls[rng.IntN(len(ctls))]
		var words []*uint64
		hdr := &ctl.Header
		if rng.IntN(16) == 0 {
			words = []*uint64{&hdr.Magic, (*uint64)(unsafe.Pointer(&hdr.ABIVersion)), (*uint64)(unsafe.Pointer(&hdr.State)),
				&hdr.Pid, &hdr.StartTime, &hdr.BootEpoch, &hdr.SlotSize, &hdr.ArenaSize, &hdr.Heartbeat}
		} else {
			lane := &ctl.Lanes[rng.IntN(staging.LaneCount)]
			if atomic.LoadUint64(&lane.Owner.Pid) == 0 && rng.IntN(8) != 0 {
				continue
			}
			words = []*uint64{&lane.Owner.Pid, &lane.Owner.LaneEpoch, &lane.Owner.SenderEpoch, &lane.Owner.StartTime,
				&lane.Relay.CompletedSeq, &lane.Relay.OpenEpoch, &lane.Sender.ReapedSeq, &lane.Sender.PublishedSeq}
		}
		atomic.StoreUint64(words[rng.IntN(len(words))], value())
		n++
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
}

// A process that scribbles over the control blocks of a relay and a sender
// while traffic flows: neither crashes nor hangs; every task ends, every
// completed task's bytes are right, and afterwards traffic flows again,
// relayed or direct.
func TestFaultHostileWriter(t *testing.T) {
	g := newFaultGroup(t, faultGroupOpts{tgtBytes: 32 * faultMiB, env: map[string]string{contract.EnvCreditTimeout: "300"}})
	ticket := faultTicketEnv + "=1500"
	r := g.start("relay", 1, faultMiB, ticket)
	s := g.start("sender", 0, 4*faultMiB, ticket)
	s.route(faultRail(1), true, 20*time.Second)
	ctls := []*staging.ControlBlock{g.control(r, true), g.control(s, true)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	// Stop scribbling before the mappings go, also when the test fails.
	halt := func() { once.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt)
	var written uint64
	wg.Add(1)
	go func() {
		defer wg.Done()
		written = scribble(ctls, uint64(time.Now().UnixNano()), stop)
	}()
	const per = 8
	round := 0
	for start := time.Now(); time.Since(start) < 3*time.Second && (round+1)*per*int(faultPiece) <= 28*faultMiB; round++ {
		s.submit(true, faultWrites(1, per, faultPiece, 0, uint64(round*per)*faultPiece)...)
		s.wait(30 * time.Second)
	}
	halt()
	if !r.alive() || !s.alive() {
		t.Fatalf("a victim died: relay alive %v, sender alive %v\nrelay:\n%s\nsender:\n%s", r.alive(), s.alive(), r.stderr.tail(20), s.stderr.tail(20))
	}
	ts := s.wait(30 * time.Second)
	states := g.verify(0, ts)
	sc, rc := s.counters().Counters, r.counters().Counters
	t.Logf("%d words scribbled over %d rounds; tasks %v; sender %+v; relay %+v", written, round, states, sc, rc)
	relayed, reasons := 0, map[string]int{}
	for _, task := range ts {
		if task.Route == "pxn" {
			relayed++
		}
		if task.Err != "" {
			reasons[task.Err[:min(len(task.Err), 60)]]++
		}
	}
	t.Logf("failures: %v", reasons)
	piecesAccountedFor(t, faultResp{Counters: sc}, relayed)

	// Afterwards: PXN recovered or turned off for this relay; either way new
	// traffic completes with the right bytes.
	s.submit(true, faultWrites(1, per, faultPiece, 0, 28*faultMiB)...)
	ts = s.wait(30 * time.Second)
	checkStates(t, ts[len(ts)-per:], map[string]int{"completed": per})
	g.verify(0, ts)
	for _, p := range []*faultProc{s, r} {
		cl := p.close(2 * time.Second)
		checkClosed(t, p.name, cl, 2*time.Second)
		p.exit()
	}
}
