// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// joinPair is a pair whose pumps the test runs, with a's lane to b's relay
// up: whatever the test submits next is queued before any round sees it.
func joinPair(t *testing.T, o pairOpts) *pair {
	t.Helper()
	o.manual = true
	p := newPair(t, o)
	for i := 0; !p.a.HasRelay("rail1"); i++ {
		if i == 10000 {
			t.Fatal("a never attached to b's relay")
		}
		p.a.RunRound()
		p.b.RunRound()
	}
	return p
}

// submitEach submits each request as a Submit of its own.
func submitEach(t *testing.T, p *pair, reqs []relay.Request) []*relay.Batch {
	t.Helper()
	bs := make([]*relay.Batch, len(reqs))
	for i := range reqs {
		b, err := p.a.Submit(reqs[i : i+1])
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = b
	}
	return bs
}

// firstThrough runs a's pump for one round, which publishes the Pieces
// queued so far in as few slots as credit allows (the lane has completed
// nothing since they were queued, so each joined one holds a ticket's
// credit), and b's until it has forwarded the first: a's next round reaps
// that completion first, and may then join the rest freely.
func firstThrough(t *testing.T, p *pair) {
	t.Helper()
	before := p.b.Counters().ForwardedPieces
	p.a.RunRound()
	waitFor(t, "the first slot forwarded", func() bool {
		p.b.RunRound()
		return p.b.Counters().ForwardedPieces > before
	})
}

// runUntilDone runs both pumps until every batch is done.
func runUntilDone(t *testing.T, p *pair, bs []*relay.Batch) {
	t.Helper()
	waitFor(t, "every batch done", func() bool {
		p.a.RunRound()
		p.b.RunRound()
		for _, b := range bs {
			if !b.Done() {
				return false
			}
		}
		return true
	})
}

// singleBlocks is n requests of one block each to sessRail1, sources in
// order and destinations in reverse, so a block staged at the wrong offset
// of a joined slot lands in the wrong place.
func singleBlocks(p *pair, n int, block uint64) []relay.Request {
	reqs := make([]relay.Request, n)
	for i := range reqs {
		reqs[i] = relay.Request{Op: relay.Write, Src: p.src(i * int(block)), Len: block, Target: sessRail1, Dst: tgtBase + uint64(n-1-i)*block}
	}
	return reqs
}

func checkLanded(t *testing.T, p *pair, reqs []relay.Request, skip int) {
	t.Helper()
	for i, r := range reqs {
		if i == skip {
			continue
		}
		off := r.Src - p.src(0)
		if !bytes.Equal(p.srcBytes[off:off+uintptr(r.Len)], p.tgt[sessRail1][r.Dst-tgtBase:][:r.Len]) {
			t.Fatalf("request %d: bytes differ at the target", i)
		}
	}
}

// TestSmallSubmitsJoinOneSlot: one-block Submits queued behind each other
// go, before the relay has completed anything, in one slot that holds the
// credit of a slot each (as many as the ring has); once it completes one,
// the rest move in as few slots as their bytes and entries need, each
// one's bytes where it belongs and each task done through PXN. The relay
// counts slots, the sender every Piece and those that joined another's.
func TestSmallSubmitsJoinOneSlot(t *testing.T) {
	const k = staging.SlotsPerLane
	for _, tc := range []struct {
		name  string
		n     int
		block uint64
		slots uint64
	}{
		// A ring's worth at once, the 14 others in one slot.
		{"32 blocks of 16 KiB", 32, 16 << 10, 2},
		// Two fit a slot, a third would not.
		{"4 blocks of 3 MiB", 4, 3 * mib, 2},
		// A ring's worth at once; then a slot holds at most MaxPlans
		// entries.
		{"a ring, MaxPlans and two blocks of 1 KiB", k + staging.MaxPlans + 2, 1 << 10, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			total := tc.n * int(tc.block)
			p := joinPair(t, pairOpts{tgtSize: total, srcSize: total})
			reqs := singleBlocks(p, tc.n, tc.block)
			a0, b0 := p.a.Counters(), p.b.Counters()
			bs := submitEach(t, p, reqs)
			firstThrough(t, p)
			runUntilDone(t, p, bs)
			for i, b := range bs {
				if st := statusOf(t, b, 0); st.State != relay.Completed || b.Route(0) != relay.RoutePXN {
					t.Fatalf("request %d: %+v via %v", i, st, b.Route(0))
				}
			}
			checkLanded(t, p, reqs, -1)
			a, b := p.a.Counters(), p.b.Counters()
			if got := b.ForwardedPieces - b0.ForwardedPieces; got != tc.slots {
				t.Errorf("relay forwarded %d slots, want %d", got, tc.slots)
			}
			if got := a.RelayedPieces - a0.RelayedPieces; got != uint64(tc.n) || a.FallbackPieces != a0.FallbackPieces {
				t.Errorf("sender relayed %d Pieces (fallback %d), want %d", got, a.FallbackPieces-a0.FallbackPieces, tc.n)
			}
			if got := a.JoinedPieces - a0.JoinedPieces; got != uint64(tc.n)-tc.slots {
				t.Errorf("sender joined %d Pieces into another's slot, want %d", got, uint64(tc.n)-tc.slots)
			}
		})
	}
}

// TestJoinWaitsForSourceReady: a queued Piece whose source-ready event has
// not completed joins no slot (the slot's copy waits for its lead's event
// only): each such Piece gets a slot of its own.
func TestJoinWaitsForSourceReady(t *testing.T) {
	const n, block = 4, 16 << 10
	p := joinPair(t, pairOpts{tgtSize: n * block, srcSize: n * block, holdReady: true})
	reqs := singleBlocks(p, n, block)
	b0 := p.b.Counters()
	bs := submitEach(t, p, reqs)
	// Every event is held while the sender publishes, a Piece a round.
	for range 2 * n {
		p.a.RunRound()
	}
	if got := len(p.holdA.HeldReady()); got != n {
		t.Fatalf("%d source-ready events held, want %d", got, n)
	}
	p.holdA.ReleaseAllReady()
	runUntilDone(t, p, bs)
	checkLanded(t, p, reqs, -1)
	if got := p.b.Counters().ForwardedPieces - b0.ForwardedPieces; got != n {
		t.Errorf("relay forwarded %d slots, want %d: Pieces whose source was not ready joined a slot", got, n)
	}
}

// TestJoinedSlotFailureRedoesEachDirect: when one write of a joined slot
// fails on the relay's second hop, every Piece of the slot is written again
// direct, so that only the request whose write fails there too fails.
func TestJoinedSlotFailureRedoesEachDirect(t *testing.T) {
	const n, block, bad = 5, 16 << 10, 2
	p := joinPair(t, pairOpts{tgtSize: n * block, srcSize: n * block})
	reqs := singleBlocks(p, n, block)
	errBad := errors.New("no such memory")
	badRange := relay.Range{Addr: reqs[bad].Dst, Len: block}
	p.hopA.FailRange(sessRail1, badRange, errBad)
	p.hopB.FailRange(sessRail1, badRange, errBad)
	a0, b0 := p.a.Counters(), p.b.Counters()
	bs := submitEach(t, p, reqs)
	// All five in the first slot, which fails.
	runUntilDone(t, p, bs)
	for i, b := range bs {
		st := statusOf(t, b, 0)
		if want := relay.Completed; i == bad {
			if st.State != relay.Failed {
				t.Errorf("request %d into failing memory: %+v, want failed", i, st)
			}
		} else if st.State != want {
			t.Errorf("request %d: %+v, want completed", i, st)
		}
	}
	checkLanded(t, p, reqs, bad)
	a, b := p.a.Counters(), p.b.Counters()
	if got := b.SecondHopFailures - b0.SecondHopFailures; got != 1 {
		t.Errorf("relay counted %d failed slots, want 1 (the %d Pieces joined one)", got, n)
	}
	if got := a.FallbackPiecesByReason[staging.FallbackOther] - a0.FallbackPiecesByReason[staging.FallbackOther]; got != n {
		t.Errorf("%d Pieces sent direct again, want %d", got, n)
	}
}

// TestJoinsBeforeAnyCompletion: one-block Submits queued together on a
// lane whose relay has completed nothing since go in one slot, one
// ticket, copy and doorbell, when the pump next takes work, not in a slot
// each; none of them is done before that slot completes, and each is then
// done through PXN with its own bytes at its own destination.
func TestJoinsBeforeAnyCompletion(t *testing.T) {
	const n, block = 8, 4 << 10
	p := joinPair(t, pairOpts{tgtSize: n * block, srcSize: n * block})
	reqs := singleBlocks(p, n, block)
	a0, b0 := p.a.Counters(), p.b.Counters()
	bs := submitEach(t, p, reqs)
	p.a.RunRound()
	lane := p.rankB.lane(0)
	if st := lane.State(); st.Published != 1 {
		t.Fatalf("one round published %d slots, want 1 holding all %d Pieces", st.Published, n)
	}
	if got := p.a.Counters().JoinedPieces - a0.JoinedPieces; got != n-1 {
		t.Fatalf("%d Pieces joined the first, want %d", got, n-1)
	}
	for i, b := range bs {
		if b.Done() {
			t.Fatalf("request %d done before its slot was forwarded", i)
		}
	}
	runUntilDone(t, p, bs)
	for i, b := range bs {
		if st := statusOf(t, b, 0); st.State != relay.Completed || b.Route(0) != relay.RoutePXN {
			t.Fatalf("request %d: %+v via %v", i, st, b.Route(0))
		}
	}
	checkLanded(t, p, reqs, -1)
	if got := p.b.Counters().ForwardedPieces - b0.ForwardedPieces; got != 1 {
		t.Errorf("relay forwarded %d slots, want 1", got)
	}
}

// TestLoneSubmitIsPublishedAtOnce: a request alone on its lane is published
// in the pump's first round, in a slot of its own, whatever the lane's
// credit held by joined Pieces before it: it never waits for others.
func TestLoneSubmitIsPublishedAtOnce(t *testing.T) {
	const block = 16 << 10
	p := joinPair(t, pairOpts{tgtSize: 3 * block, srcSize: 3 * block})
	reqs := singleBlocks(p, 3, block)
	lane := p.rankB.lane(0)
	// Two at once: one slot, one of whose Pieces holds a ticket's credit.
	a0 := p.a.Counters()
	bs := submitEach(t, p, reqs[:2])
	p.a.RunRound()
	if st, joined := lane.State(), p.a.Counters().JoinedPieces-a0.JoinedPieces; st.Published != 1 || joined != 1 {
		t.Fatalf("%d slots published, %d Pieces joined, for two queued Pieces; want 1 and 1", st.Published, joined)
	}
	// The third alone, while that slot is still in flight.
	bs = append(bs, submitEach(t, p, reqs[2:])...)
	p.a.RunRound()
	if st := lane.State(); st.Published != 2 {
		t.Fatalf("the lone request was not published in the next round: %d slots published, want 2", st.Published)
	}
	runUntilDone(t, p, bs)
	checkLanded(t, p, reqs, -1)
}

// TestJoinsHoldTheRingsCredit: while the relay completes nothing, Pieces
// queued for it join slots only in place of tickets of their own: a
// ring's worth rides, in fewer slots, and the rest wait for credit and go
// direct after the credit timeout, as they would have without joining.
// None rides in a slot behind a relay that has stopped beyond the ring's
// credit.
func TestJoinsHoldTheRingsCredit(t *testing.T) {
	const k, extra, block = staging.SlotsPerLane, 4, 16 << 10
	const n = k + extra
	p := joinPair(t, pairOpts{tgtSize: n * block, srcSize: n * block,
		cfg: func(c *engineconfig.Config) { c.CreditTimeout = time.Second }})
	reqs := singleBlocks(p, n, block)
	// The relay's hop holds every write: nothing completes.
	p.hopB.SetHold(true)
	a0 := p.a.Counters()
	clock := time.Now()
	var bs []*relay.Batch
	// Half the ring's worth first, the rest behind it once that slot is
	// out: the second slot holds what credit the first left.
	bs = append(bs, submitEach(t, p, reqs[:k/2])...)
	p.a.RunRoundAt(clock)
	bs = append(bs, submitEach(t, p, reqs[k/2:])...)
	// Until both slots are in the relay's second hop: the relay has
	// resolved their target before the clock moves on.
	waitFor(t, "two slots in the second hop and a credit wait", func() bool {
		p.a.RunRoundAt(clock)
		p.b.RunRoundAt(clock)
		return len(p.hopB.Held()) >= 2 && p.a.Counters().CreditWaits > a0.CreditWaits
	})
	for range 2 * n {
		p.a.RunRoundAt(clock)
		p.b.RunRoundAt(clock)
	}
	lane := p.rankB.lane(0)
	st := lane.State()
	joined := p.a.Counters().JoinedPieces - a0.JoinedPieces
	if st.Published != 2 || st.Published+joined != k {
		t.Fatalf("%d slots published with %d Pieces joined, want 2 slots carrying the ring's %d", st.Published, joined, k)
	}
	clock = clock.Add(2 * time.Second)
	for range 2 * n {
		p.a.RunRoundAt(clock)
		p.b.RunRoundAt(clock)
	}
	if got := p.a.Counters().FallbackPiecesByReason[staging.FallbackCreditTimeout] - a0.FallbackPiecesByReason[staging.FallbackCreditTimeout]; got != extra {
		t.Fatalf("%d Pieces went direct after the credit timeout, want %d (by reason %v)", got, extra, p.a.Counters().FallbackPiecesByReason)
	}
	p.hopB.SetHold(false)
	p.hopB.CompleteAll()
	runUntilDone(t, p, bs)
	for i, b := range bs {
		if st := statusOf(t, b, 0); st.State != relay.Completed {
			t.Fatalf("request %d: %+v", i, st)
		}
	}
	checkLanded(t, p, reqs, -1)
}

// TestJoinedSlotTimeoutFailsEach: a joined slot whose second hop times out
// on one write after the others landed fails every request of it, each
// with the timeout (the relay's completion is the slot's, and a timed-out
// write may still land, so none is written again), and each destination
// holds its own request's bytes or none: never another's.
func TestJoinedSlotTimeoutFailsEach(t *testing.T) {
	const n, block, bad = 6, 16 << 10, 3
	p := joinPair(t, pairOpts{tgtSize: n * block, srcSize: n * block})
	reqs := singleBlocks(p, n, block)
	errLate := fmt.Errorf("write not acknowledged: %w", relay.ErrTimedOut)
	p.hopB.FailRange(sessRail1, relay.Range{Addr: reqs[bad].Dst, Len: block}, errLate)
	a0 := p.a.Counters()
	bs := submitEach(t, p, reqs)
	runUntilDone(t, p, bs)
	if got := p.a.Counters().JoinedPieces - a0.JoinedPieces; got != n-1 {
		t.Fatalf("%d Pieces joined the first, want %d: the test needs one slot", got, n-1)
	}
	for i, b := range bs {
		st := statusOf(t, b, 0)
		if st.State != relay.Failed || !errors.Is(st.Err, relay.ErrTimedOut) {
			t.Errorf("request %d: %+v, want failed with the timeout", i, st)
		}
	}
	tgt := p.tgt[sessRail1]
	for i, r := range reqs {
		off := r.Src - p.src(0)
		got, own := tgt[r.Dst-tgtBase:][:r.Len], p.srcBytes[off:off+uintptr(r.Len)]
		if !bytes.Equal(got, own) && !bytes.Equal(got, make([]byte, r.Len)) {
			t.Errorf("request %d: destination holds neither its own bytes nor none", i)
		}
		if i == bad && !bytes.Equal(got, make([]byte, r.Len)) {
			t.Errorf("request %d: the timed-out write landed", i)
		}
	}
	if c := p.a.Counters(); c.FailedPieces-a0.FailedPieces != n || c.FallbackPieces != a0.FallbackPieces {
		t.Errorf("%d Pieces failed and %d went direct, want %d and 0", c.FailedPieces-a0.FailedPieces, c.FallbackPieces-a0.FallbackPieces, n)
	}
}
