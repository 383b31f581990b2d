// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"errors"
	"testing"

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

// firstThrough runs a's pump for one round, which publishes the first
// queued Piece in a slot of its own (the lane has completed nothing since
// the rest were queued), and b's until it has forwarded it: a's next round
// reaps that completion first, and may then join the rest.
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
// go in a slot each until the relay completes one; then the rest move in
// as few slots as their bytes and entries need, each one's bytes where it
// belongs and each task done through PXN. The relay counts slots, the
// sender every Piece.
func TestSmallSubmitsJoinOneSlot(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		block uint64
		slots uint64
	}{
		// The first alone, the 31 others in one slot.
		{"32 blocks of 16 KiB", 32, 16 << 10, 2},
		// The first alone; two fit a slot, a third would not.
		{"4 blocks of 3 MiB", 4, 3 * mib, 3},
		// The first alone; a slot holds at most MaxPlans entries.
		{"MaxPlans and two blocks of 1 KiB", staging.MaxPlans + 2, 1 << 10, 3},
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
	// The first in a slot of its own; the four behind it join one.
	firstThrough(t, p)
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
		t.Errorf("relay counted %d failed slots, want 1 (the %d Pieces behind the first joined)", got, n-1)
	}
	if got := a.FallbackPiecesByReason[staging.FallbackOther] - a0.FallbackPiecesByReason[staging.FallbackOther]; got != n-1 {
		t.Errorf("%d Pieces sent direct again, want %d", got, n-1)
	}
}

// TestNoJoinForARelayThatCompletedNothing: Pieces queued while their relay
// completes nothing go in slots of their own, as they would wait for credit
// and go direct after the credit timeout: none rides in a slot behind a
// relay that has stopped.
func TestNoJoinForARelayThatCompletedNothing(t *testing.T) {
	const n, block = 4, 16 << 10
	p := joinPair(t, pairOpts{tgtSize: n * block, srcSize: n * block})
	reqs := singleBlocks(p, n, block)
	b0 := p.b.Counters()
	bs := submitEach(t, p, reqs)
	// The relay runs no round: nothing completes while a publishes.
	for range 2 * n {
		p.a.RunRound()
	}
	runUntilDone(t, p, bs)
	checkLanded(t, p, reqs, -1)
	if got := p.b.Counters().ForwardedPieces - b0.ForwardedPieces; got != n {
		t.Errorf("relay forwarded %d slots, want %d: Pieces joined behind a relay that completed nothing", got, n)
	}
}
