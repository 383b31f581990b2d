// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// rampPieces is how many Pieces a request of n bytes in blocks of block
// bytes makes under a ramp from first: Piece i holds first·2^i bytes, at
// most a slot, and at most MaxPlans blocks.
func rampPieces(n, block, first uint64) uint64 {
	var pieces uint64
	limit := first
	for n > 0 {
		take := min(n, limit, block*staging.MaxPlans)
		n -= take
		pieces++
		limit = min(2*limit, staging.SlotSize)
	}
	return pieces
}

// TestRampThroughRelay: with a 256 KiB ramp, a request's first Pieces
// are small and grow to full slots; every byte arrives where it belongs,
// nothing goes direct, and the relay forwards exactly the Pieces the ramp
// makes.
func TestRampThroughRelay(t *testing.T) {
	first := uint64(256 << 10)
	const most = 40*mib + 3
	p := newPair(t, pairOpts{tgtSize: 2 * most, srcSize: most, cfg: func(c *engineconfig.Config) { c.FirstPiece = first }})
	for _, tc := range []struct {
		n, block uint64
	}{
		{10 << 10, 10 << 10},
		{256 << 10, 256 << 10},
		{256<<10 + 1, 256<<10 + 1},
		{4 * mib, 16 << 10},
		{most, most},
	} {
		t.Run(fmt.Sprintf("%d bytes in blocks of %d", tc.n, tc.block), func(t *testing.T) {
			clear(p.tgt[sessRail1])
			var reqs []relay.Request
			count := (tc.n + tc.block - 1) / tc.block
			for off := uint64(0); off < tc.n; off += tc.block {
				// Blocks land in reverse order at twice their spacing, so
				// a block staged at the wrong offset shows.
				k := count - 1 - off/tc.block
				reqs = append(reqs, relay.Request{Op: relay.Write, Src: p.src(int(off)), Len: min(tc.block, tc.n-off), Target: sessRail1, Dst: tgtBase + 2*k*tc.block})
			}
			beforeA, beforeB := p.a.Counters(), p.b.Counters()
			b, err := p.a.Submit(reqs)
			if err != nil {
				t.Fatal(err)
			}
			waitBatch(t, b)
			for i := range reqs {
				if st := statusOf(t, b, i); st.State != relay.Completed || b.Route(i) != relay.RoutePXN {
					t.Fatalf("task %d: %+v via %v", i, st, b.Route(i))
				}
				r := reqs[i]
				off := r.Src - p.src(0)
				if !bytes.Equal(p.tgt[sessRail1][r.Dst-tgtBase:r.Dst-tgtBase+r.Len], p.srcBytes[off:off+uintptr(r.Len)]) {
					t.Fatalf("block %d differs at its destination", i)
				}
			}
			a, bb := p.a.Counters(), p.b.Counters()
			want := rampPieces(tc.n, tc.block, first)
			if got := a.RelayedPieces - beforeA.RelayedPieces; got != want || a.FallbackPieces != 0 {
				t.Fatalf("relayed %d Pieces (fallback %d), want %d under the ramp", got, a.FallbackPieces, want)
			}
			if got := bb.ForwardedPieces - beforeB.ForwardedPieces; got != want {
				t.Fatalf("relay forwarded %d Pieces, want %d", got, want)
			}
		})
	}
}

// TestPumpSpinsWhileOneSlotMoves: the pump polls through its spin window
// while at most one slot's worth of bytes moves through the rank, however
// many Pieces carry it (a short request's ramp), and naps once more is in
// flight. Both pumps are driven by the test; the relay's hop holds every
// write, so what is in flight stays put.
func TestPumpSpinsWhileOneSlotMoves(t *testing.T) {
	tests := []struct {
		name  string
		first uint64
		// sizes are requests submitted one after the other.
		sizes []uint64
		// pieces is what the sender publishes, held is what the relay
		// takes (its inflight depth is 4).
		pieces, held        int
		senderSpin, relSpin bool
	}{
		{"one short request in its ramp", 256 << 10, []uint64{4 * mib}, 5, 4, true, true},
		{"one full Piece", staging.SlotSize, []uint64{8 * mib}, 1, 1, true, true},
		{"two full Pieces", staging.SlotSize, []uint64{8 * mib, 8 * mib}, 2, 2, false, false},
		// The first request ramps (5 Pieces); the second finds the lane
		// busy and is one full Piece.
		{"a short request and one behind it", 256 << 10, []uint64{4 * mib, 8 * mib}, 6, 4, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, pairOpts{tgtSize: 16 * mib, srcSize: 16 * mib, manual: true, cfg: func(c *engineconfig.Config) { c.FirstPiece = tc.first }})
			drive := func(what string, cond func() bool) {
				t.Helper()
				waitFor(t, what, func() bool {
					p.a.RunRound()
					p.b.RunRound()
					return cond()
				})
			}
			drive("the relay's lane attached", func() bool { return p.a.HasRelay("rail1") })
			if !p.a.PumpShallow() || !p.b.PumpShallow() {
				t.Fatal("idle pumps would nap")
			}
			p.hopB.SetHold(true)
			var off uint64
			for _, n := range tc.sizes {
				if _, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(int(off)), Len: n, Target: sessRail1, Dst: tgtBase + off}}); err != nil {
					t.Fatal(err)
				}
				off += n
			}
			lane := p.rankB.lane(0)
			drive("every Piece published and the relay holding what it may", func() bool {
				return lane.State().Published == uint64(tc.pieces) && len(p.hopB.Held()) == tc.held
			})
			if got := p.a.PumpShallow(); got != tc.senderSpin {
				t.Errorf("sender spins %v, want %v", got, tc.senderSpin)
			}
			if got := p.b.PumpShallow(); got != tc.relSpin {
				t.Errorf("relay spins %v, want %v", got, tc.relSpin)
			}
			p.hopB.SetHold(false)
			p.hopB.CompleteAll()
			drive("everything relayed", func() bool { return p.a.Counters().RelayedPieces == uint64(tc.pieces) })
		})
	}
}

// TestRampOnlyOnAnIdleLane: a request that finds its lane busy (Pieces
// queued or in flight) is cut in whole slots, since a small first Piece
// behind others would start no sooner; once the lane is idle again the next
// request ramps.
func TestRampOnlyOnAnIdleLane(t *testing.T) {
	const n = 4 * mib
	p := newPair(t, pairOpts{tgtSize: 3 * n, srcSize: 3 * n, cfg: func(c *engineconfig.Config) { c.FirstPiece = 256 << 10 }})
	submit := func(i int) *relay.Batch {
		t.Helper()
		b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(i * n), Len: n, Target: sessRail1, Dst: tgtBase + uint64(i*n)}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	relayed := func() uint64 { return p.a.Counters().RelayedPieces }
	p.hopB.SetHold(true)
	first := submit(0)
	second := submit(1)
	p.hopB.SetHold(false)
	p.hopB.CompleteAll()
	waitBatch(t, first)
	waitBatch(t, second)
	// 256 KiB, 512 KiB, 1 MiB, 2 MiB, 256 KiB; then one Piece of 4 MiB.
	if got := relayed(); got != 5+1 {
		t.Fatalf("%d Pieces relayed for a request on an idle lane and one behind it, want 6", got)
	}
	third := submit(2)
	waitBatch(t, third)
	if got := relayed() - 6; got != 5 {
		t.Fatalf("%d Pieces for a request on an idle lane again, want the ramp's 5", got)
	}
	for i, b := range []*relay.Batch{first, second, third} {
		if st := statusOf(t, b, 0); st.State != relay.Completed {
			t.Fatalf("request %d: %+v", i, st)
		}
	}
	if !bytes.Equal(p.tgt[sessRail1][:3*n], p.srcBytes[:3*n]) {
		t.Fatal("destination bytes differ from the source")
	}
}
