// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// opsOnly hides every capability of a hop but Submit and Poll, so that the
// relay hands it a Piece's writes one by one.
type opsOnly struct{ relay.Hop }

// kvRequests is n blocks of block bytes, block k from source offset k·block
// to the target at tgtBase plus the blocks in reverse order, so that no two
// neighbours in the source are neighbours in the target.
func kvRequests(p *pair, n, block int) []relay.Request {
	reqs := make([]relay.Request, n)
	for k := range reqs {
		reqs[k] = relay.Request{Op: relay.Write, Src: p.src(k * block), Len: uint64(block), Target: sessRail1,
			Dst: tgtBase + uint64((n-1-k)*block)}
	}
	return reqs
}

func checkReversed(t *testing.T, p *pair, n, block int) {
	t.Helper()
	tgt := p.tgt[sessRail1]
	for k := range n {
		d := (n - 1 - k) * block
		if !bytes.Equal(tgt[d:d+block], p.srcBytes[k*block:(k+1)*block]) {
			t.Fatalf("block %d: target at %#x differs from the source", k, d)
		}
	}
}

// A hop that takes Pieces whole gets each relayed Piece in one call, with
// every write of it, and the relay counts one completion a Piece; a hop
// without the capability gets the same writes one by one. Both land the
// same bytes.
func TestRelayHandsPiecesWhole(t *testing.T) {
	// 4096 blocks of 2 KiB fill one slot with the most entries a Piece
	// holds; the 100 after them are a second Piece.
	const block, n = 2 << 10, staging.MaxPlans + 100
	for _, whole := range []bool{true, false} {
		name := "PieceHop"
		if !whole {
			name = "ops one by one"
		}
		t.Run(name, func(t *testing.T) {
			// One hand-over a Piece: parts would add one for each part
			// that lands apart from the others.
			o := pairOpts{tgtSize: n * block, srcSize: n * block, cfg: func(c *engineconfig.Config) { c.SlotParts = 1 }}
			if !whole {
				o.wrapB = func(l *fabric.Loopback) (relay.Hop, relay.Directory) { return opsOnly{l}, l }
			}
			p := newPair(t, o)
			p.writeAll(t, kvRequests(p, n, block))
			checkReversed(t, p, n, block)
			st := p.hopB.Stats()
			if st.Submitted != n || st.Succeeded != n {
				t.Fatalf("relay's hop took %d writes, %d succeeded; want %d", st.Submitted, st.Succeeded, n)
			}
			wantPieces := uint64(0)
			if whole {
				wantPieces = 2
			}
			if st.Pieces != wantPieces {
				t.Fatalf("relay's hop took %d Pieces whole; want %d", st.Pieces, wantPieces)
			}
			if c := p.b.Counters(); c.ForwardedPieces != 2 || c.ForwardedBytes != n*block {
				t.Fatalf("relay forwarded %d Pieces, %d bytes; want 2 and %d", c.ForwardedPieces, c.ForwardedBytes, n*block)
			}
		})
	}
}

// A busy PieceHop takes none of a Piece; the relay offers the whole Piece
// again, and once the hop has room it takes every write in one call. The
// Piece is copied whole (one part): a Piece in parts is handed over as its
// parts land, in as many calls as the hop was free while they landed.
func TestRelayRetriesABusyPieceWhole(t *testing.T) {
	const block, n = 4 << 10, 300
	p := newPair(t, pairOpts{tgtSize: n * block, srcSize: n * block, manual: true,
		cfg: func(c *engineconfig.Config) { c.SlotParts = 1 }})
	for !p.a.HasRelay("rail1") {
		p.a.RunRound()
		p.b.RunRound()
	}
	p.hopB.SetBusy(true)
	b, err := p.a.Submit(kvRequests(p, n, block))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the relay to offer the Piece to its busy hop", func() bool {
		p.a.RunRound()
		p.b.RunRound()
		return p.hopB.Stats().Busy >= 3
	})
	if st := p.hopB.Stats(); st.Submitted != 0 || st.Pieces != 0 {
		t.Fatalf("a busy hop took %d writes in %d Pieces; want none", st.Submitted, st.Pieces)
	}
	p.hopB.SetBusy(false)
	waitFor(t, "the batch", func() bool {
		p.a.RunRound()
		p.b.RunRound()
		return b.Done()
	})
	if st := p.hopB.Stats(); st.Submitted != n || st.Pieces != 1 {
		t.Fatalf("hop took %d writes in %d Pieces; want %d in 1", st.Submitted, st.Pieces, n)
	}
	for i := range n {
		if st := statusOf(t, b, i); st.State != relay.Completed {
			t.Fatalf("task %d: %+v", i, st)
		}
	}
	checkReversed(t, p, n, block)
}

// refusingHop refuses every Piece for a reason other than being busy.
type refusingHop struct {
	*fabric.Loopback
	mu    sync.Mutex
	calls int
}

var errRefused = errors.New("piece refused by the hop")

func (h *refusingHop) SubmitPiece([]relay.WriteOp, uint64) error {
	h.mu.Lock()
	h.calls++
	h.mu.Unlock()
	return errRefused
}

// A Piece the hop refuses outright fails once, with the hop's reason, and
// completes its ticket: the sender's tasks fail, nothing is retried, and
// no write reaches the target.
func TestRelayFailsAPieceTheHopRefuses(t *testing.T) {
	const block, n = 4 << 10, 64
	var hop *refusingHop
	p := newPair(t, pairOpts{tgtSize: n * block, srcSize: n * block, wrapB: func(l *fabric.Loopback) (relay.Hop, relay.Directory) {
		hop = &refusingHop{Loopback: l}
		return hop, l
	}})
	b, err := p.a.Submit(kvRequests(p, n, block))
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, b)
	for i := range n {
		st := statusOf(t, b, i)
		if st.State != relay.Failed || st.Err == nil || !strings.Contains(st.Err.Error(), "second hop") {
			t.Fatalf("task %d: %+v; want failed by the second hop", i, st)
		}
	}
	hop.mu.Lock()
	calls := hop.calls
	hop.mu.Unlock()
	if calls != 1 {
		t.Fatalf("hop was offered the Piece %d times; want 1", calls)
	}
	if c := p.b.Counters(); c.SecondHopFailures != 1 || c.ForwardedPieces != 0 {
		t.Fatalf("relay counted %d second-hop failures, %d forwarded Pieces; want 1 and 0", c.SecondHopFailures, c.ForwardedPieces)
	}
	if st := p.hopB.Stats(); st.Submitted != 0 {
		t.Fatalf("%d writes reached the target", st.Submitted)
	}
}
