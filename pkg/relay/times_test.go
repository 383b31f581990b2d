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
