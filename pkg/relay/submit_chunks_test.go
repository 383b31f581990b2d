// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// readyCounter counts the source-ready events Submit records: one for each
// group of each chunk it queues.
type readyCounter struct {
	*cpucopy.HostCopier
	n atomic.Int32
}

func (c *readyCounter) RecordReady(stream uintptr) (relay.Event, error) {
	c.n.Add(1)
	return c.HostCopier.RecordReady(stream)
}

// TestLongSubmitIsQueuedInChunks: a long batch is queued in chunks of one
// slot, then twice that, up to eight slots, each cut where the batch's
// bytes are a whole number of slots, so that its first Pieces move while
// Submit plans the rest and no Piece changes. Each chunk's group records
// its own source-ready event, which counts the chunks.
func TestLongSubmitIsQueuedInChunks(t *testing.T) {
	const total = 20 * staging.SlotSize
	var rc *readyCounter
	p := newPair(t, pairOpts{tgtSize: total, srcSize: total, copierA: func(h *cpucopy.HostCopier) relay.Copier {
		rc = &readyCounter{HostCopier: h}
		return rc
	}})
	for _, tc := range []struct {
		name   string
		block  uint64
		n      int
		chunks int32
		pieces uint64
	}{
		// 1 + 2 + 4 + 8 slots, then the 5 left.
		{"20 slots of 16 KiB blocks", 16 << 10, total / (16 << 10), 5, 20},
		// Cuts after 8 requests (24 MiB, the first whole number of slots
		// past 8 MiB) and 16 (48 MiB past 24 + 16); then 12 MiB.
		{"3 MiB requests", 3 << 20, 20, 3, 8},
		{"one slot", 16 << 10, staging.SlotSize / (16 << 10), 1, 1},
		{"less than a slot", 1 << 20, 3, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clear(p.tgt[sessRail1])
			reqs := make([]relay.Request, tc.n)
			for i := range reqs {
				// Sources in order, destinations in reverse: every block
				// lands somewhere else than a contiguous copy would put it.
				src := uint64(i) * tc.block
				dst := uint64(tc.n-1-i) * tc.block
				reqs[i] = relay.Request{Op: relay.Write, Src: p.src(int(src)), Len: tc.block, Target: sessRail1, Dst: tgtBase + dst}
			}
			before := p.a.Counters()
			rc.n.Store(0)
			b, err := p.a.Submit(reqs)
			if err != nil {
				t.Fatal(err)
			}
			if got := rc.n.Load(); got != tc.chunks {
				t.Errorf("Submit queued %d chunks, want %d", got, tc.chunks)
			}
			waitBatch(t, b)
			for i := range reqs {
				if st := statusOf(t, b, i); st.State != relay.Completed || b.Route(i) != relay.RoutePXN {
					t.Fatalf("request %d: %+v, route %v", i, st, b.Route(i))
				}
			}
			_ = b.Release()
			if got := p.a.Counters().RelayedPieces - before.RelayedPieces; got != tc.pieces {
				t.Errorf("%d Pieces relayed, want %d (the batch's Pieces as one plan would cut them)", got, tc.pieces)
			}
			tgt := p.tgt[sessRail1]
			for i := range reqs {
				src := p.srcBytes[uint64(i)*tc.block:][:tc.block]
				dst := tgt[uint64(tc.n-1-i)*tc.block:][:tc.block]
				if !bytes.Equal(src, dst) {
					t.Fatalf("request %d: bytes differ at the target", i)
				}
			}
		})
	}
}
