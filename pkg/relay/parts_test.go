// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/memrange"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// partStepper is the sender's copier with a first hop the test runs by
// hand for Pieces in parts: CopyParts only records the copy, and land
// copies one part into the slot and signals it. Copy (a Piece in one part)
// goes to the host copier and is counted.
type partStepper struct {
	*cpucopy.HostCopier
	mu     sync.Mutex
	jobs   []partJob
	copies atomic.Int32
}

type partJob struct {
	entries []relay.CopyEntry
	ends    []uint32
	bell    *uint64
	words   *[staging.MaxParts - 1]uint64
	seq     uint64
}

func (c *partStepper) Copy(lane int, ready relay.Event, entries []relay.CopyEntry, doorbell *uint64, seq uint64) error {
	c.copies.Add(1)
	return c.HostCopier.Copy(lane, ready, entries, doorbell, seq)
}

func (c *partStepper) CopyParts(_ int, _ relay.Event, entries []relay.CopyEntry, ends []uint32, doorbell *uint64, words *[staging.MaxParts - 1]uint64, seq uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.jobs = append(c.jobs, partJob{entries: slices.Clone(entries), ends: slices.Clone(ends), bell: doorbell, words: words, seq: seq})
	return nil
}

func (c *partStepper) job(i int) (partJob, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i >= len(c.jobs) {
		return partJob{}, false
	}
	return c.jobs[i], true
}

// land copies part p of job j into the slot and signals it: its part word,
// or, for the last part, the doorbell.
func (j partJob) land(p int) {
	j.copyPart(p)
	if p < len(j.ends) {
		staging.RingDoorbell(&j.words[p], j.seq)
	} else {
		staging.RingDoorbell(j.bell, j.seq)
	}
}

// copyPart copies part p of the job into the slot, signalling nothing.
func (j partJob) copyPart(p int) {
	from, to := 0, len(j.entries)
	if p > 0 {
		from = int(j.ends[p-1])
	}
	if p < len(j.ends) {
		to = int(j.ends[p])
	}
	for _, e := range j.entries[from:to] {
		copy(memrange.Bytes(e.Dst, e.Len), memrange.Bytes(e.Src, e.Len))
	}
}

// submitInParts submits reqs and runs both pumps until the sender has
// handed their Piece to the copier in parts.
func submitInParts(t *testing.T, p *pair, st *partStepper, reqs []relay.Request) (*relay.Batch, partJob) {
	t.Helper()
	b, err := p.a.Submit(reqs)
	if err != nil {
		t.Fatal(err)
	}
	var j partJob
	roundsUntil(t, p, "the Piece copied in parts", func() bool {
		var ok bool
		j, ok = st.job(0)
		return ok
	})
	return b, j
}

func stepperPair(t *testing.T, size int, cfg func(*engineconfig.Config)) (*pair, *partStepper) {
	t.Helper()
	var st *partStepper
	p := joinPair(t, pairOpts{tgtSize: size, srcSize: size, cfg: cfg, copierA: func(h *cpucopy.HostCopier) relay.Copier {
		st = &partStepper{HostCopier: h}
		return st
	}})
	return p, st
}

// roundsUntil runs both pumps until cond holds.
func roundsUntil(t *testing.T, p *pair, what string, cond func() bool) {
	t.Helper()
	waitFor(t, what, func() bool {
		p.a.RunRound()
		p.b.RunRound()
		return cond()
	})
}

// settle runs both pumps for a few rounds, for a test that checks that
// something did not happen.
func settle(p *pair) {
	for range 50 {
		p.a.RunRound()
		p.b.RunRound()
	}
}

// A request alone on its lane goes in parts of about equal bytes, and the
// relay hands each part to its hop once that part has landed, while the
// later ones are still copied: nothing before part 0 lands, exactly the
// writes of the parts landed so far after, and the Piece completes only
// once the doorbell says the last part is in. Every byte lands where it
// belongs, and the relay counts one forwarded Piece.
func TestSlotPartsForwardAsTheyLand(t *testing.T) {
	const block, n = 16 << 10, 256 // 4 MiB: 8 parts of 32 blocks
	p, st := stepperPair(t, n*block, nil)
	b, j := submitInParts(t, p, st, kvRequests(p, n, block))
	if want := []uint32{32, 64, 96, 128, 160, 192, 224}; !slices.Equal(j.ends, want) {
		t.Fatalf("part ends %v, want %v", j.ends, want)
	}
	settle(p)
	if s := p.hopB.Stats(); s.Submitted != 0 {
		t.Fatalf("the relay's hop took %d writes before any part landed", s.Submitted)
	}
	j.land(0)
	roundsUntil(t, p, "part 0 forwarded", func() bool { return p.hopB.Stats().Submitted > 0 })
	settle(p)
	if s := p.hopB.Stats(); s.Submitted != 32 || s.Pieces != 1 {
		t.Fatalf("after part 0 the hop took %d writes in %d hand-overs; want 32 in 1", s.Submitted, s.Pieces)
	}
	for part := 1; part <= 3; part++ {
		j.land(part)
	}
	roundsUntil(t, p, "parts 1 to 3 forwarded", func() bool { return p.hopB.Stats().Submitted > 32 })
	settle(p)
	if s := p.hopB.Stats(); s.Submitted != 128 || s.Pieces != 2 {
		t.Fatalf("after parts 1 to 3 the hop took %d writes in %d hand-overs; want 128 in 2", s.Submitted, s.Pieces)
	}
	if c := p.b.Counters(); c.ForwardedPieces != 0 || b.Done() {
		t.Fatalf("Piece counted forwarded (%d) or batch done (%v) before its last part landed", c.ForwardedPieces, b.Done())
	}
	for part := 4; part < 7; part++ {
		j.land(part)
	}
	roundsUntil(t, p, "parts 4 to 6 forwarded", func() bool { return p.hopB.Stats().Submitted == 224 })
	settle(p)
	if c := p.b.Counters(); c.ForwardedPieces != 0 || b.Done() {
		t.Fatalf("Piece counted forwarded (%d) or batch done (%v) before the doorbell", c.ForwardedPieces, b.Done())
	}
	j.land(7)
	runUntilDone(t, p, []*relay.Batch{b})
	batchOK(t, b)
	checkReversed(t, p, n, block)
	if s := p.hopB.Stats(); s.Submitted != n || s.Succeeded != n || s.Pieces != 4 {
		t.Fatalf("the hop took %d writes (%d succeeded) in %d hand-overs; want %d in 4", s.Submitted, s.Succeeded, s.Pieces, n)
	}
	if c := p.b.Counters(); c.ForwardedPieces != 1 || c.ForwardedBytes != n*block {
		t.Fatalf("relay forwarded %d Pieces, %d bytes; want 1 and %d", c.ForwardedPieces, c.ForwardedBytes, n*block)
	}
	if c := p.a.Counters(); c.RelayedPieces != 1 || c.FallbackPieces != 0 {
		t.Fatalf("sender relayed %d Pieces, %d fell back; want 1 and 0", c.RelayedPieces, c.FallbackPieces)
	}
	if st.copies.Load() != 0 {
		t.Fatalf("%d Pieces copied in one part; want none", st.copies.Load())
	}
}

// A doorbell covers every part: a Piece whose copier rings only the
// doorbell (a copy-engine Piece, CPU doorbells) is forwarded whole.
func TestSlotPartsDoorbellCoversAll(t *testing.T) {
	const block, n = 16 << 10, 256
	p, st := stepperPair(t, n*block, nil)
	b, j := submitInParts(t, p, st, kvRequests(p, n, block))
	for part := range 7 {
		j.copyPart(part)
	}
	j.land(7)
	runUntilDone(t, p, []*relay.Batch{b})
	batchOK(t, b)
	checkReversed(t, p, n, block)
	if s := p.hopB.Stats(); s.Submitted != n || s.Pieces != 1 {
		t.Fatalf("the hop took %d writes in %d hand-overs; want %d in 1", s.Submitted, s.Pieces, n)
	}
}

// Parts are for a request alone on its lane: Pieces queued behind another,
// a Piece published while another is in flight, a slot under two parts'
// worth, and a configuration of one part are copied whole.
func TestSlotPartsOnlyOnAnIdleLane(t *testing.T) {
	const block, n = 16 << 10, 256
	t.Run("queued behind another", func(t *testing.T) {
		// Two Submits of 5 MiB: too much to join one slot.
		const m = 320
		p, st := stepperPair(t, 2*m*block, nil)
		reqs := kvRequests(p, 2*m, block)
		var bs []*relay.Batch
		for _, r := range [][]relay.Request{reqs[:m], reqs[m:]} {
			b, err := p.a.Submit(r)
			if err != nil {
				t.Fatal(err)
			}
			bs = append(bs, b)
		}
		runUntilDone(t, p, bs)
		// The first had the second queued behind it; the second was
		// published while the first was in flight.
		if _, ok := st.job(0); ok || st.copies.Load() == 0 {
			t.Fatalf("a Piece in parts, %d whole; want none in parts", st.copies.Load())
		}
		checkReversed(t, p, 2*m, block)
	})
	t.Run("under two parts", func(t *testing.T) {
		p, st := stepperPair(t, n*block, nil)
		b, err := p.a.Submit(kvRequests(p, 31, block)) // 496 KiB
		if err != nil {
			t.Fatal(err)
		}
		runUntilDone(t, p, []*relay.Batch{b})
		if _, ok := st.job(0); ok || st.copies.Load() != 1 {
			t.Fatalf("a 496 KiB Piece: in parts %v, %d whole; want it whole", ok, st.copies.Load())
		}
	})
	t.Run("one part configured", func(t *testing.T) {
		p, st := stepperPair(t, n*block, func(c *engineconfig.Config) { c.SlotParts = 1 })
		b, err := p.a.Submit(kvRequests(p, n, block))
		if err != nil {
			t.Fatal(err)
		}
		runUntilDone(t, p, []*relay.Batch{b})
		if _, ok := st.job(0); ok || st.copies.Load() != 1 {
			t.Fatalf("MC_PXN_SLOT_PARTS=1: in parts %v, %d whole; want it whole", ok, st.copies.Load())
		}
		checkReversed(t, p, n, block)
	})
	t.Run("four parts configured", func(t *testing.T) {
		p, st := stepperPair(t, n*block, func(c *engineconfig.Config) { c.SlotParts = 4 })
		b, j := submitInParts(t, p, st, kvRequests(p, n, block))
		if want := []uint32{64, 128, 192}; !slices.Equal(j.ends, want) {
			t.Fatalf("part ends %v, want %v", j.ends, want)
		}
		for part := range 4 {
			j.land(part)
		}
		runUntilDone(t, p, []*relay.Batch{b})
		checkReversed(t, p, n, block)
	})
}

// batchOK fails the test unless every task of b completed through PXN.
func batchOK(t *testing.T, b *relay.Batch) {
	t.Helper()
	for i := range b.Len() {
		if st, err := b.Status(i); err != nil || st.State != relay.Completed || st.Err != nil || b.Route(i) != relay.RoutePXN {
			t.Fatalf("task %d: %v (route %d), %v %v", i, st.State, b.Route(i), err, st.Err)
		}
	}
}
