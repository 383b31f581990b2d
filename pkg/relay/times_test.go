// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"testing"

	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// TestPieceTimesFollowAPiece: the sender and the relay each record a
// relayed Piece's steps under the same lane and seq, in the order its way
// takes them: Submit, Copy; then the relay's Seen, Posted, Done; then the
// sender's Reaped. Direct writes are not recorded.
func TestPieceTimesFollowAPiece(t *testing.T) {
	p := newPair(t, pairOpts{tgtSize: 4 * staging.SlotSize, srcSize: 4 * staging.SlotSize})
	p.a.KeepPieceTimes(true)
	p.b.KeepPieceTimes(true)
	const pieces = 3
	var reqs []relay.Request
	for i := range pieces {
		off := i * staging.SlotSize
		reqs = append(reqs, relay.Request{Op: relay.Write, Src: p.src(off), Len: staging.SlotSize, Target: sessRail1, Dst: tgtBase + uint64(off)})
	}
	// One same-rail write, which goes direct.
	reqs = append(reqs, relay.Request{Op: relay.Write, Src: p.src(0), Len: 4096, Target: sessRail0, Dst: tgtBase})
	b, err := p.a.Submit(reqs)
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, b)
	_ = b.Release()
	// The relay writes its completion after its Done; wait for its
	// record rather than assume the batch's end implies it.
	var relayed []relay.PieceTimes
	waitFor(t, "the relay's records", func() bool {
		relayed = p.b.PieceTimes(relayed[:0])
		return len(relayed) == pieces && relayed[pieces-1].Done != 0
	})
	sent := p.a.PieceTimes(nil)
	if len(sent) != pieces {
		t.Fatalf("sender recorded %d Pieces, want %d (the direct write is not one): %+v", len(sent), pieces, sent)
	}
	for k, s := range sent {
		r := relayed[k]
		if s.Lane != r.Lane || s.Seq != r.Seq || s.Bytes != staging.SlotSize || r.Bytes != staging.SlotSize {
			t.Fatalf("Piece %d: sender's record %+v and relay's %+v do not name one Piece of one slot", k, s, r)
		}
		if s.Seen != 0 || s.Posted != 0 || s.Done != 0 || r.Submit != 0 || r.Copy != 0 || r.Reaped != 0 {
			t.Errorf("Piece %d: a side recorded the other's steps: %+v / %+v", k, s, r)
		}
		steps := []struct {
			name string
			at   int64
		}{{"submit", s.Submit}, {"copy", s.Copy}, {"seen", r.Seen}, {"posted", r.Posted}, {"done", r.Done}, {"reaped", s.Reaped}}
		for j := 1; j < len(steps); j++ {
			a, b := steps[j-1], steps[j]
			if a.at == 0 || b.at == 0 || b.at < a.at {
				// Posted may come after Done when the hop finishes a
				// write inside Submit; it never comes before Seen.
				if a.name == "posted" && b.name == "done" && b.at != 0 && b.at >= r.Seen {
					continue
				}
				t.Errorf("Piece %d: %s at %d, then %s at %d", k, a.name, a.at, b.name, b.at)
			}
		}
	}
	if sent[0].Seq+pieces-1 != sent[pieces-1].Seq {
		t.Errorf("seqs %d..%d for %d Pieces in a row", sent[0].Seq, sent[pieces-1].Seq, pieces)
	}
}

// Nobody asked for Piece times: neither side records any.
func TestPieceTimesOffByDefault(t *testing.T) {
	p := newPair(t, pairOpts{tgtSize: 2 * staging.SlotSize, srcSize: 2 * staging.SlotSize})
	if st := p.write(t, 0, 2*staging.SlotSize, sessRail1, tgtBase); st.State != relay.Completed {
		t.Fatalf("write: %+v", st)
	}
	waitFor(t, "the relay's forwarded Pieces", func() bool { return p.b.Counters().ForwardedPieces == 2 })
	if sent, relayed := p.a.PieceTimes(nil), p.b.PieceTimes(nil); len(sent) != 0 || len(relayed) != 0 {
		t.Fatalf("recorded %d sent and %d relayed Pieces with times off; want none", len(sent), len(relayed))
	}
	// Turned on, the next write's Pieces are recorded on both sides.
	p.a.KeepPieceTimes(true)
	p.b.KeepPieceTimes(true)
	if st := p.write(t, 0, staging.SlotSize, sessRail1, tgtBase); st.State != relay.Completed {
		t.Fatalf("write: %+v", st)
	}
	waitFor(t, "the relay's record", func() bool {
		r := p.b.PieceTimes(nil)
		return len(r) == 1 && r[0].Done != 0
	})
	if sent := p.a.PieceTimes(nil); len(sent) != 1 || sent[0].Submit == 0 || sent[0].Copy == 0 {
		t.Fatalf("sent times %+v; want one Piece with Submit and Copy", sent)
	}
}
