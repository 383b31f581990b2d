// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// creditRig is a pair with both pumps driven by the test on a clock of its
// own, so that the credit timeout's decisions follow the test's steps and
// not the machine's load. The relay's hop holds every write until the test
// completes it: each completed write is one relayed Piece.
type creditRig struct {
	t       *testing.T
	p       *pair
	clock   time.Time
	batches []*relay.Batch
}

const creditPiece = 64 << 10

func newCreditRig(t *testing.T, pieces int) *creditRig {
	n := pieces * creditPiece
	p := newPair(t, pairOpts{tgtSize: n, srcSize: n, manual: true, separate: true,
		cfg: func(c *engineconfig.Config) { c.CreditTimeout = time.Second }})
	r := &creditRig{t: t, p: p, clock: time.Now()}
	r.driveUntil("the relay's lane attached", func() bool { return p.a.HasRelay("rail1") })
	p.hopB.SetHold(true)
	// One Submit a Piece: each is a group of its own, so each is one Piece
	// whatever the planner's ramp, in a slot of its own.
	for i := range pieces {
		b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(i * creditPiece), Len: creditPiece, Target: sessRail1, Dst: tgtBase + uint64(i*creditPiece)}})
		if err != nil {
			t.Fatal(err)
		}
		r.batches = append(r.batches, b)
	}
	lane := p.rankB.lane(0)
	r.driveUntil("a full ring and a credit wait", func() bool {
		return lane.State().Published == staging.SlotsPerLane && len(p.hopB.Held()) == 4 && p.a.Counters().CreditWaits == 1
	})
	return r
}

// driveUntil runs rounds of both pumps at the rig's clock until cond holds.
// The deadline is the wall clock's and generous: the host copier's lanes
// copy on goroutines of their own, which a loaded machine may hold back.
func (r *creditRig) driveUntil(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %s; sender counters %+v", what, r.p.a.Counters())
		}
		r.p.a.RunRoundAt(r.clock)
		r.p.b.RunRoundAt(r.clock)
	}
}

// settle runs rounds at the rig's clock until neither pump makes progress
// in a round, so that every decision due at this clock has been taken.
func (r *creditRig) settle() {
	for quiet := 0; quiet < 3; {
		a, b := r.p.a.RunRoundAt(r.clock), r.p.b.RunRoundAt(r.clock)
		if a || b {
			quiet = 0
			continue
		}
		quiet++
	}
}

// completeOne finishes the oldest write the relay's hop holds and waits
// until the sender has reaped the Piece. The first hop's copies land on the
// host copier's goroutines, so the relay may first have to wait for one.
func (r *creditRig) completeOne() {
	r.t.Helper()
	r.driveUntil("a write held by the relay", func() bool { return len(r.p.hopB.Held()) > 0 })
	relayed := r.p.a.Counters().RelayedPieces
	if err := r.p.hopB.Complete(r.p.hopB.Held()[0]); err != nil {
		r.t.Fatal(err)
	}
	r.driveUntil("the sender reaping the completed Piece", func() bool { return r.p.a.Counters().RelayedPieces == relayed+1 })
}

// finish lets the relay's hop complete everything and checks every byte.
func (r *creditRig) finish() relay.CounterSnapshot {
	r.t.Helper()
	r.p.hopB.SetHold(false)
	r.p.hopB.CompleteAll()
	r.driveUntil("every batch done", func() bool {
		for _, b := range r.batches {
			if !b.Done() {
				return false
			}
		}
		return true
	})
	for i, b := range r.batches {
		if st := statusOf(r.t, b, 0); st.State != relay.Completed {
			r.t.Fatalf("batch %d: %+v", i, st)
		}
	}
	n := len(r.batches) * creditPiece
	if !bytes.Equal(r.p.tgt[sessRail1][:n], r.p.srcBytes[:n]) {
		r.t.Fatal("destination bytes differ from the source")
	}
	return r.p.a.Counters()
}

// TestCreditTimeoutBusyRelayKeepsItsPieces: a relay that keeps completing,
// one Piece every 0.9 timeouts, never lets the timeout run out, however long
// the lane stays without credit in all (nine timeouts here): every Piece is
// relayed and none goes direct.
func TestCreditTimeoutBusyRelayKeepsItsPieces(t *testing.T) {
	const steps = 10
	r := newCreditRig(t, staging.SlotsPerLane+steps+1)
	for range steps {
		r.clock = r.clock.Add(900 * time.Millisecond)
		r.completeOne()
		r.settle()
		if c := r.p.a.Counters(); c.FallbackPieces != 0 {
			t.Fatalf("a Piece went direct while the relay completed one every 0.9 s: %+v", c)
		}
	}
	if got := r.p.rankB.lane(0).State().Published; got != staging.SlotsPerLane+steps {
		t.Fatalf("published seq %d, want %d: one new Piece per completion", got, staging.SlotsPerLane+steps)
	}
	c := r.finish()
	if c.FallbackPieces != 0 || c.RelayedPieces != uint64(len(r.batches)) {
		t.Fatalf("counters %+v, want all %d Pieces relayed", c, len(r.batches))
	}
}

// TestCreditTimeoutStalledRelaySendsQueueDirect: a relay that completes
// nothing keeps the queued Pieces until a whole timeout has passed since
// the credit wait began; then every queued Piece goes direct, and the
// published ones stay with the relay.
func TestCreditTimeoutStalledRelaySendsQueueDirect(t *testing.T) {
	const queued = 4
	r := newCreditRig(t, staging.SlotsPerLane+queued)
	r.clock = r.clock.Add(999 * time.Millisecond)
	r.settle()
	if c := r.p.a.Counters(); c.FallbackPieces != 0 {
		t.Fatalf("fallback before the timeout ran out: %+v", c)
	}
	r.clock = r.clock.Add(2 * time.Millisecond)
	r.settle()
	c := r.p.a.Counters()
	if c.FallbackPieces != queued || c.RelayedPieces != 0 || c.FailedPieces != 0 {
		t.Fatalf("counters %+v, want the %d queued Pieces direct and the published ones still with the relay", c, queued)
	}
	c = r.finish()
	if c.FallbackPieces != queued || c.RelayedPieces != staging.SlotsPerLane {
		t.Fatalf("counters %+v, want %d relayed and %d direct", c, staging.SlotsPerLane, queued)
	}
}

// TestCreditTimeoutRestartsAtACompletion: the timeout runs from the lane's
// last completion once there is one. A completion 0.9 s into the wait puts
// the deadline at 1.9 s, not 1 s; with no completion after it, the queue
// goes direct past 1.9 s.
func TestCreditTimeoutRestartsAtACompletion(t *testing.T) {
	const queued = 4
	r := newCreditRig(t, staging.SlotsPerLane+queued)
	start := r.clock
	r.clock = start.Add(900 * time.Millisecond)
	r.completeOne()
	r.settle()
	r.clock = start.Add(1850 * time.Millisecond)
	r.settle()
	if c := r.p.a.Counters(); c.FallbackPieces != 0 {
		t.Fatalf("fallback 0.95 s after the last completion: %+v", c)
	}
	r.clock = start.Add(1950 * time.Millisecond)
	r.settle()
	// One queued Piece took the credit the completion returned.
	if c := r.p.a.Counters(); c.FallbackPieces != queued-1 {
		t.Fatalf("counters %+v, want the %d Pieces still queued direct", c, queued-1)
	}
	c := r.finish()
	if c.FallbackPieces != queued-1 || c.RelayedPieces != staging.SlotsPerLane+1 {
		t.Fatalf("counters %+v, want %d relayed and %d direct", c, staging.SlotsPerLane+1, queued-1)
	}
}
