// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"errors"
	"testing"
)

// testLane is one lane as its relay sees it: the current claim's blocks
// and the summary. A claim makes new blocks, as the relay does.
type testLane struct {
	*LaneSenderBlock
	*LaneRelayBlock
	summary LaneSummary
	rx      *RelayLane
}

func (l *testLane) Claim(owner Identity, ns PidNS, epoch uint64, now int64) {
	l.LaneSenderBlock, l.LaneRelayBlock = new(LaneSenderBlock), new(LaneRelayBlock)
	l.summary.Claim(owner, ns, epoch, now)
	l.rx.Offer(&LaneWords{Epoch: epoch, Sender: l.LaneSenderBlock, Relay: l.LaneRelayBlock, WakeFD: -1, Free: func() {}})
}

func (l *testLane) Free() {
	l.summary.Free()
	l.rx.Withdraw()
}

func (l *testLane) State() LaneState {
	l.summary.CopyProgress(l.LaneSenderBlock, l.LaneRelayBlock)
	return l.summary.State()
}

func (l *testLane) Owned(owner Identity, epoch uint64) bool { return l.summary.Owned(owner, epoch) }
func (l *testLane) Epoch() uint64                           { return l.summary.Epoch() }

func newTestLane(t *testing.T, epoch uint64) (*testLane, *SenderLane, *RelayLane) {
	t.Helper()
	lane := &testLane{rx: NewRelayLane()}
	lane.Claim(Identity{Pid: 42, StartTime: 7, Epoch: 9}, PidNS{Dev: 3, Ino: 4}, epoch, 1)
	tx, err := NewSenderLane(lane.LaneSenderBlock, lane.LaneRelayBlock, epoch)
	if err != nil {
		t.Fatal(err)
	}
	rx := lane.rx
	if got, prev := rx.Sync(); got != epoch || prev != 0 {
		t.Fatalf("Sync = %#x, %#x; want %#x, 0", got, prev, epoch)
	}
	rx.Open()
	return lane, tx, rx
}

// send runs one ticket through the sender's side: commit, doorbell,
// publish.
func send(t *testing.T, tx *SenderLane) uint64 {
	t.Helper()
	seq, ok := tx.Ticket()
	if !ok {
		t.Fatalf("no ticket at next %d, reaped %d", tx.Next(), tx.Reaped())
	}
	if err := tx.Commit(seq, "s", []PlanEntry{{Dst: 0x1000, Len: 64}}, 64, nil); err != nil {
		t.Fatal(err)
	}
	tx.ring(seq)
	if err := tx.Publish(seq); err != nil {
		t.Fatal(err)
	}
	return seq
}

func take(t *testing.T, rx *RelayLane, vd *ValidDesc) uint64 {
	t.Helper()
	if seq, st := rx.Poll(); st != TicketReady {
		t.Fatalf("Poll = %d, state %d; want ready", seq, st)
	}
	seq, err := rx.Take(vd)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func TestLaneEndpointsRoundTrip(t *testing.T) {
	lane, tx, rx := newTestLane(t, 5)
	var vd ValidDesc
	// A full ring: K tickets, then none until a reap.
	for i := 1; i <= SlotsPerLane; i++ {
		if seq := send(t, tx); seq != uint64(i) {
			t.Fatalf("ticket %d, want %d", seq, i)
		}
	}
	if _, ok := tx.Ticket(); ok {
		t.Fatal("a ticket beyond credit")
	}
	// The relay takes all and finishes them out of order: nothing is
	// completed until seq 1 is.
	for i := 1; i <= SlotsPerLane; i++ {
		if seq := take(t, rx, &vd); seq != uint64(i) || vd.Epoch() != 5 {
			t.Fatalf("took seq %d epoch %#x, want %d epoch 5", seq, vd.Epoch(), i)
		}
	}
	if _, st := rx.Poll(); st != TicketNone {
		t.Fatalf("Poll past the published seqs: state %d", st)
	}
	for seq := uint64(SlotsPerLane); seq >= 2; seq-- {
		if err := rx.Complete(5, seq, CompletionOK); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, ok := tx.Reap(); ok || lane.State().Completed != 0 {
		t.Fatalf("reaped before seq 1 completed (completed %d)", lane.State().Completed)
	}
	if err := rx.Complete(5, 1, CompletionSecondHop); err != nil {
		t.Fatal(err)
	}
	if got := lane.State().Completed; got != SlotsPerLane {
		t.Fatalf("completed %d, want %d", got, SlotsPerLane)
	}
	for i := 1; i <= SlotsPerLane; i++ {
		seq, st, ok := tx.Reap()
		want := int32(CompletionOK)
		if i == 1 {
			want = CompletionSecondHop
		}
		if !ok || seq != uint64(i) || st != want {
			t.Fatalf("Reap = %d, %d, %v; want %d, %d", seq, st, ok, i, want)
		}
	}
	if seq := send(t, tx); seq != SlotsPerLane+1 {
		t.Fatalf("ticket after the reap %d, want %d", seq, SlotsPerLane+1)
	}
	if st := lane.State(); st.Next != SlotsPerLane+2 || st.Published != SlotsPerLane+1 || st.Reaped != SlotsPerLane || lane.Ready[0].Seq != SlotsPerLane+1 {
		t.Fatalf("progress words %+v", st)
	}
}

func TestLaneEndpointRules(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(t *testing.T, lane *testLane, tx *SenderLane, rx *RelayLane)
	}{
		{"doorbell before commit is rung, not ready", func(t *testing.T, lane *testLane, tx *SenderLane, rx *RelayLane) {
			seq, _ := tx.Ticket()
			tx.ring(seq)
			if _, st := rx.Poll(); st != TicketRung {
				t.Fatalf("state %d, want rung", st)
			}
		}},
		{"commit of another seq than the ticket", func(t *testing.T, lane *testLane, tx *SenderLane, rx *RelayLane) {
			if err := tx.Commit(2, "s", []PlanEntry{{Dst: 1, Len: 1}}, 1, nil); !errors.Is(err, ErrSeqOrder) {
				t.Fatalf("Commit = %v, want %v", err, ErrSeqOrder)
			}
			if err := tx.Publish(2); !errors.Is(err, ErrSeqOrder) {
				t.Fatalf("Publish = %v, want %v", err, ErrSeqOrder)
			}
		}},
		{"invalid desc is taken and needs a completion", func(t *testing.T, lane *testLane, tx *SenderLane, rx *RelayLane) {
			seq, _ := tx.Ticket()
			PublishDesc(&lane.Descs[SlotOf(seq)], seq)
			tx.ring(seq)
			var vd ValidDesc
			got, err := rx.Take(&vd)
			var de *DescError
			if got != seq || !errors.As(err, &de) || rx.Next() != seq+1 {
				t.Fatalf("Take = %d, %v; next %d", got, err, rx.Next())
			}
			if err := rx.Complete(rx.Epoch(), seq, CompletionInvalidDesc); err != nil || lane.State().Completed != seq {
				t.Fatalf("Complete = %v, completed %d", err, lane.State().Completed)
			}
		}},
		{"completion of a left epoch writes nothing", func(t *testing.T, lane *testLane, tx *SenderLane, rx *RelayLane) {
			send(t, tx)
			var vd ValidDesc
			take(t, rx, &vd)
			old := rx.Epoch()
			lane.Claim(Identity{Pid: 43, Epoch: 1}, PidNS{}, old+1, 2)
			if epoch, prev := rx.Sync(); epoch != old+1 || prev != old || rx.Next() != 1 {
				t.Fatalf("Sync = %#x, %#x, next %d", epoch, prev, rx.Next())
			}
			if err := rx.Complete(old, 1, CompletionOK); err != nil {
				t.Fatal(err)
			}
			if st := lane.State(); st.Completed != 0 || lane.Completions[0].Seq != 0 {
				t.Fatalf("old epoch's completion landed: %+v", st)
			}
		}},
		{"completion outside the window", func(t *testing.T, lane *testLane, tx *SenderLane, rx *RelayLane) {
			if err := rx.Complete(rx.Epoch(), SlotsPerLane+1, CompletionOK); !errors.Is(err, ErrSeqOrder) {
				t.Fatalf("Complete = %v, want %v", err, ErrSeqOrder)
			}
		}},
		{"abandon gives up published seqs in order", func(t *testing.T, lane *testLane, tx *SenderLane, rx *RelayLane) {
			send(t, tx)
			send(t, tx)
			for want := uint64(1); want <= 2; want++ {
				if seq, ok := tx.Abandon(); !ok || seq != want {
					t.Fatalf("Abandon = %d, %v; want %d", seq, ok, want)
				}
			}
			if _, ok := tx.Abandon(); ok || tx.InFlight() {
				t.Fatal("abandoned more than was published")
			}
		}},
		{"exhausted lane takes no ticket until claimed anew", func(t *testing.T, lane *testLane, tx *SenderLane, rx *RelayLane) {
			if err := tx.startAt(MaxLaneSeq); err != nil {
				t.Fatal(err)
			}
			rx.startAt(MaxLaneSeq)
			send(t, tx)
			if _, ok := tx.Ticket(); ok || !tx.Exhausted() {
				t.Fatal("a ticket past MaxLaneSeq")
			}
			var vd ValidDesc
			take(t, rx, &vd)
			if err := rx.Complete(rx.Epoch(), MaxLaneSeq, CompletionOK); err != nil {
				t.Fatal(err)
			}
			if _, _, ok := tx.Reap(); !ok {
				t.Fatal("no reap of the last seq")
			}
			// A new claim gives the lane new words and a new epoch.
			lane.Claim(Identity{Pid: 42, StartTime: 7, Epoch: 9}, PidNS{}, 9, 2)
			tx, err := NewSenderLane(lane.LaneSenderBlock, lane.LaneRelayBlock, 9)
			if err != nil {
				t.Fatal(err)
			}
			if epoch, _ := rx.Sync(); epoch != 9 {
				t.Fatalf("relay epoch %#x after the rollover", epoch)
			}
			if _, ok := tx.Ticket(); ok {
				t.Fatal("a ticket of the new epoch before the relay opened it")
			}
			rx.Open()
			if seq := send(t, tx); seq != 1 {
				t.Fatalf("first seq of the new epoch %d", seq)
			}
		}},
		{"claim gives new words and publishes the owner", func(t *testing.T, lane *testLane, tx *SenderLane, rx *RelayLane) {
			send(t, tx)
			owner := Identity{Pid: 77, StartTime: 8, Epoch: 3}
			lane.Claim(owner, PidNS{}, 11, 5)
			st := lane.State()
			if !st.Held || st.Owner != owner || st.LaneEpoch != 11 || st.Published != 0 || lane.Ready[0].Seq != 0 || lane.Descs[0].CommitSeq != 0 {
				t.Fatalf("after the claim: %+v", st)
			}
			if !lane.Owned(owner, 11) || lane.Owned(owner, 12) {
				t.Fatal("Owned disagrees with the claim")
			}
			lane.Free()
			if _, held := lane.summary.Owner.Load(); held || lane.Epoch() != 11 {
				t.Fatal("Free must clear the owner and keep the epoch")
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			lane, tx, rx := newTestLane(t, 5)
			c.run(t, lane, tx, rx)
		})
	}
}

// TestRelayLaneAnnouncedBytes: the relay sums the lengths its sender's
// committed Descs announce, counts a ticket whose Desc is not committed (or
// says more than a slot) as a whole slot, skips what it took, and stops
// once past its limit.
func TestRelayLaneAnnouncedBytes(t *testing.T) {
	lane, tx, rx := newTestLane(t, 5)
	if got := rx.AnnouncedBytes(SlotSize); got != 0 {
		t.Fatalf("nothing published: %d bytes announced", got)
	}
	publish := func(n uint64) {
		t.Helper()
		seq, ok := tx.Ticket()
		if !ok {
			t.Fatal("no ticket")
		}
		if err := tx.Commit(seq, "s", []PlanEntry{{Dst: 0x1000, Len: n}}, n, nil); err != nil {
			t.Fatal(err)
		}
		tx.ring(seq)
		if err := tx.Publish(seq); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []uint64{256 << 10, 512 << 10, 1 << 20} {
		publish(n)
	}
	if got, want := rx.AnnouncedBytes(SlotSize), uint64(256<<10+512<<10+1<<20); got != want {
		t.Fatalf("three committed tickets: %d bytes announced, want %d", got, want)
	}
	// A commit seq that does not match (not yet visible, or a stale one):
	// the ticket counts as a slot.
	lane.Descs[SlotOf(2)].CommitSeq = 0
	if got, want := rx.AnnouncedBytes(2*SlotSize), uint64(256<<10+SlotSize+1<<20); got != want {
		t.Fatalf("an uncommitted Desc: %d bytes, want %d", got, want)
	}
	PublishDesc(&lane.Descs[SlotOf(2)], 2)
	// A length past the slot is garbage: a slot.
	lane.Descs[SlotOf(3)].PieceLen = 1 << 40
	if got, want := rx.AnnouncedBytes(2*SlotSize), uint64(256<<10+512<<10+SlotSize); got != want {
		t.Fatalf("a Desc claiming 1 TiB: %d bytes, want %d", got, want)
	}
	lane.Descs[SlotOf(3)].PieceLen = 1 << 20
	// The limit stops the sum once passed.
	if got, want := rx.AnnouncedBytes(100), uint64(256<<10); got != want {
		t.Fatalf("limit 100: %d bytes, want the first ticket's %d", got, want)
	}
	// A taken ticket is no longer announced.
	var vd ValidDesc
	take(t, rx, &vd)
	if got, want := rx.AnnouncedBytes(SlotSize), uint64(512<<10+1<<20); got != want {
		t.Fatalf("after taking seq 1: %d bytes, want %d", got, want)
	}
}

// TestLaneWrapsAtMaxLaneSeq runs a lane the way the engine does at the end
// of its sequence space: an epoch that starts four seqs below MaxLaneSeq
// publishes up to MaxLaneSeq, the relay finishes them out of order, the
// sender takes no ticket past it and reaps each seq once, and a new claim
// under a new epoch carries traffic from seq 1 while the old epoch's
// doorbells, Descs and late completions match nothing.
func TestLaneWrapsAtMaxLaneSeq(t *testing.T) {
	const first = MaxLaneSeq - 4
	lane, tx, rx := newTestLane(t, 5)
	if err := tx.startAt(first); err != nil {
		t.Fatal(err)
	}
	rx.startAt(first)
	var vd ValidDesc
	for want := uint64(first); want <= MaxLaneSeq; want++ {
		if seq := send(t, tx); seq != want {
			t.Fatalf("ticket %d, want %d", seq, want)
		}
		if seq := take(t, rx, &vd); seq != want || vd.Epoch() != 5 {
			t.Fatalf("took seq %d epoch %#x, want %d epoch 5", seq, vd.Epoch(), want)
		}
	}
	if _, ok := tx.Ticket(); ok || !tx.Exhausted() {
		t.Fatalf("a ticket past MaxLaneSeq (next %d, exhausted %v)", tx.Next(), tx.Exhausted())
	}
	if seq, st := rx.Poll(); st != TicketNone {
		t.Fatalf("relay polls seq %d past MaxLaneSeq: state %d", seq, st)
	}
	for seq := uint64(MaxLaneSeq); seq > first; seq-- {
		if err := rx.Complete(5, seq, CompletionOK); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, ok := tx.Reap(); ok || rx.Completed() != first-1 {
		t.Fatalf("reaped before seq %d completed (relay completed %d)", uint64(first), rx.Completed())
	}
	if err := rx.Complete(5, first, CompletionSecondHop); err != nil {
		t.Fatal(err)
	}
	for want := uint64(first); want <= MaxLaneSeq; want++ {
		seq, status, ok := tx.Reap()
		wantStatus := int32(CompletionOK)
		if want == first {
			wantStatus = CompletionSecondHop
		}
		if !ok || seq != want || status != wantStatus {
			t.Fatalf("Reap = %d, %d, %v; want %d, %d", seq, status, ok, want, wantStatus)
		}
	}
	if _, _, ok := tx.Reap(); ok || !tx.Drained() || tx.InFlight() {
		t.Fatal("reaped past MaxLaneSeq, or the lane is not drained")
	}
	if st := lane.State(); st.Next != MaxLaneSeq+1 || st.Published != MaxLaneSeq || st.Reaped != MaxLaneSeq || st.Completed != MaxLaneSeq {
		t.Fatalf("lane at the end of its epoch: %+v", st)
	}

	// The engine gives up the spent claim and claims the lane anew.
	lane.Free()
	lane.Claim(Identity{Pid: 42, StartTime: 7, Epoch: 9}, PidNS{Dev: 3, Ino: 4}, 6, 2)
	tx, err := NewSenderLane(lane.LaneSenderBlock, lane.LaneRelayBlock, 6)
	if err != nil {
		t.Fatal(err)
	}
	if epoch, prev := rx.Sync(); epoch != 6 || prev != 5 || rx.Next() != 1 || rx.Completed() != 0 {
		t.Fatalf("Sync = %#x, %#x, next %d, completed %d; want 6, 5, 1, 0", epoch, prev, rx.Next(), rx.Completed())
	}
	rx.Open()
	if err := rx.Complete(5, MaxLaneSeq, CompletionOK); err != nil || rx.Completed() != 0 {
		t.Fatalf("a late completion of the old epoch: %v, completed %d", err, rx.Completed())
	}
	for want := uint64(1); want <= 3; want++ {
		if seq := send(t, tx); seq != want {
			t.Fatalf("ticket %d of the new epoch, want %d", seq, want)
		}
		if seq := take(t, rx, &vd); seq != want || vd.Epoch() != 6 {
			t.Fatalf("took seq %d epoch %#x, want %d epoch 6", seq, vd.Epoch(), want)
		}
		if err := rx.Complete(6, want, CompletionOK); err != nil {
			t.Fatal(err)
		}
		if seq, status, ok := tx.Reap(); !ok || seq != want || status != CompletionOK {
			t.Fatalf("Reap = %d, %d, %v; want %d ok", seq, status, ok, want)
		}
	}
	if st := lane.State(); st.Next != 4 || st.Published != 3 || st.Reaped != 3 || st.Completed != 3 {
		t.Fatalf("lane after the new claim: %+v, want seqs 1..3", st)
	}
}

// A Piece in parts: the relay may take its ticket on the first part word
// (with the Desc committed), sees the parts land in order, and all of them
// once the doorbell rings; a new claim resets the part words and ends the
// ring the relay followed.
func TestLanePartWords(t *testing.T) {
	lane, tx, rx := newTestLane(t, 5)
	seq, _ := tx.Ticket()
	plans := []PlanEntry{{Dst: 0x1000, Len: 64}, {Dst: 0x2000, Len: 64}, {Dst: 0x3000, Len: 64}}
	if err := tx.Commit(seq, "s", plans, 192, []uint32{1, 2}); err != nil {
		t.Fatal(err)
	}
	words := tx.PartWords(seq)
	if _, st := rx.Poll(); st != TicketNone {
		t.Fatalf("Poll before any part landed: state %d, want none", st)
	}
	if got := rx.PartsLanded(seq, 3); got != 0 {
		t.Fatalf("PartsLanded before any part = %d, want 0", got)
	}
	// Part 1 before part 0 does not count: parts are taken in order.
	RingDoorbell(&words[1], seq)
	if _, st := rx.Poll(); st != TicketNone {
		t.Fatalf("Poll with only part 1 landed: state %d, want none", st)
	}
	RingDoorbell(&words[0], seq)
	var vd ValidDesc
	if got := take(t, rx, &vd); got != seq {
		t.Fatalf("took seq %d, want %d", got, seq)
	}
	if ends := vd.PartEnds(); !slicesEqual(ends, []uint32{1, 2}) {
		t.Fatalf("taken PartEnds %v, want [1 2]", ends)
	}
	if got := rx.PartsLanded(seq, 3); got != 2 {
		t.Fatalf("PartsLanded with parts 0 and 1 = %d, want 2", got)
	}
	if !rx.Current() {
		t.Fatal("Current = false for the ring the sender holds")
	}
	tx.ring(seq)
	if got := rx.PartsLanded(seq, 3); got != 3 {
		t.Fatalf("PartsLanded after the doorbell = %d, want 3", got)
	}
	// A stale part word of an earlier seq of the slot is not this seq's.
	if got := rx.PartsLanded(seq+SlotsPerLane, 3); got != 0 {
		t.Fatalf("PartsLanded of seq+K = %d, want 0", got)
	}
	lane.Free()
	if rx.Current() {
		t.Fatal("Current = true after the lane was freed")
	}
	lane.Claim(Identity{Pid: 43, StartTime: 8, Epoch: 10}, PidNS{Dev: 3, Ino: 4}, 6, 2)
	if rx.Current() {
		t.Fatal("Current = true after a new claim, before Sync")
	}
	for p, w := range lane.Ready[SlotOf(seq)].Parts {
		if w != 0 {
			t.Fatalf("part word %d = %d after a new claim, want 0", p, w)
		}
	}
	rx.Sync()
	if !rx.Current() {
		t.Fatal("Current = false for the new ring after Sync")
	}
}

// A new claim's sender takes no ticket until the relay opens the epoch,
// and a late doorbell and a late completion of the old epoch land in the
// old claim's words, which the new claim does not share.
func TestLaneOpensOnlyWhenTheRelayOpensIt(t *testing.T) {
	lane, tx, rx := newTestLane(t, 5)
	send(t, tx)
	var vd ValidDesc
	take(t, rx, &vd)

	lane.Claim(Identity{Pid: 43, StartTime: 8, Epoch: 10}, PidNS{}, 6, 2)
	tx2, err := NewSenderLane(lane.LaneSenderBlock, lane.LaneRelayBlock, 6)
	if err != nil {
		t.Fatal(err)
	}
	// The old sender's doorbell of seq 2 lands late; the old epoch's
	// seq 1 completes (the relay had not synced yet).
	RingDoorbell(tx.ReadyWord(2), 2)
	if err := rx.Complete(5, 1, CompletionOK); err != nil {
		t.Fatal(err)
	}
	if _, ok := tx2.Ticket(); ok || tx2.Opened() {
		t.Fatal("a ticket before the relay synced to the new epoch")
	}
	if epoch, prev := rx.Sync(); epoch != 6 || prev != 5 {
		t.Fatalf("Sync = %d, %d", epoch, prev)
	}
	if _, st := rx.Poll(); st != TicketNone || rx.Opened() {
		t.Fatalf("Poll of an epoch not opened = %v", st)
	}
	if _, ok := tx2.Ticket(); ok {
		t.Fatal("a ticket before the relay opened the new epoch")
	}
	if st := lane.State(); st.Open != 0 {
		t.Fatalf("open epoch %d of the new claim before Open, want 0", st.Open)
	}
	rx.Open()
	st := lane.State()
	if st.Open != 6 || lane.Ready[SlotOf(2)].Seq != 0 || lane.Completions[0].Seq != 0 || st.Completed != 0 {
		t.Fatalf("after Open: %+v, completion word %d", st, lane.Completions[0].Seq)
	}
	if seq := send(t, tx2); seq != 1 {
		t.Fatalf("first seq %d, want 1", seq)
	}
	if _, st := rx.Poll(); st != TicketReady {
		t.Fatalf("Poll after Open = %v, want ready", st)
	}
	if _, _, ok := tx2.Reap(); ok {
		t.Fatal("reaped a completion the new sender never got")
	}
}
