// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// readyFailCopier cannot record source-ready events.
type readyFailCopier struct{ *cpucopy.HostCopier }

func (readyFailCopier) RecordReady(uintptr) (relay.Event, error) {
	return 0, errors.New("no event for this stream")
}

// copyFailCopier fails every first-hop copy before its doorbell.
type copyFailCopier struct{ *cpucopy.HostCopier }

func (copyFailCopier) Copy(int, relay.Event, []relay.CopyEntry, *uint64, uint64) error {
	return errors.New("copy engine fault")
}

// wantFallbacks checks the per-reason split of c: pieces[r] Pieces of
// staging.SlotSize bytes for each reason r, none for the others, and totals
// that match.
func wantFallbacks(t *testing.T, c relay.CounterSnapshot, pieces map[int]uint64) {
	t.Helper()
	var total uint64
	for r := range staging.FallbackReasons {
		want := pieces[r]
		total += want
		if got := c.FallbackPiecesByReason[r]; got != want {
			t.Errorf("fallback pieces for %s: %d, want %d", staging.FallbackReasonName(r), got, want)
		}
		if got := c.FallbackBytesByReason[r]; got != want*staging.SlotSize {
			t.Errorf("fallback bytes for %s: %d, want %d", staging.FallbackReasonName(r), got, want*staging.SlotSize)
		}
	}
	if c.FallbackPieces != total || c.FallbackBytes != total*staging.SlotSize {
		t.Errorf("fallback totals %d pieces %d bytes, want %d and %d", c.FallbackPieces, c.FallbackBytes, total, total*staging.SlotSize)
	}
}

func TestFallbackReasonOfAFailedStep(t *testing.T) {
	const pieces = 3
	const n = pieces * staging.SlotSize
	for _, tc := range []struct {
		name   string
		copier func(*cpucopy.HostCopier) relay.Copier
		reason int
	}{
		{"source-ready event not recorded", func(h *cpucopy.HostCopier) relay.Copier { return readyFailCopier{h} }, staging.FallbackSourceEvent},
		{"first-hop copy failed", func(h *cpucopy.HostCopier) relay.Copier { return copyFailCopier{h} }, staging.FallbackLaneBroken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, pairOpts{tgtSize: n, srcSize: n, copierA: tc.copier})
			b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(0), Len: n, Target: sessRail1, Dst: tgtBase}})
			if err != nil {
				t.Fatal(err)
			}
			waitBatch(t, b)
			if st := statusOf(t, b, 0); st.State != relay.Completed || st.Transferred != n {
				t.Fatalf("status %+v, want completed through the direct path", st)
			}
			c := p.a.Counters()
			wantFallbacks(t, c, map[int]uint64{tc.reason: pieces})
			if c.RelayedPieces != 0 {
				t.Errorf("%d pieces relayed, want none", c.RelayedPieces)
			}
		})
	}
}

// The pump publishes its counters, its lanes and its thread's CPU time
// with its heartbeat.
func TestPumpPublishesCounters(t *testing.T) {
	const n = 2 * staging.SlotSize
	p := newPair(t, pairOpts{tgtSize: n, srcSize: n})
	b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(0), Len: n, Target: sessRail1, Dst: tgtBase}})
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, b)
	var a, fwd staging.RankStats
	waitFor(t, "both ranks' counters published", func() bool {
		var okA, okB bool
		a, okA = p.rankA.published()
		fwd, okB = p.rankB.published()
		return okA && okB && a.RelayedPieces == 2 && fwd.ForwardedPieces == 2
	})
	c := p.a.Counters()
	if a.RelayedBytes != c.RelayedBytes || a.RelayedBytes != n || a.DirectBytes != c.DirectBytes || a.FailedPieces != 0 {
		t.Errorf("published relayed %d direct %d failed %d bytes, counters say %+v", a.RelayedBytes, a.DirectBytes, a.FailedPieces, c)
	}
	if a.FallbackBytes != ([8]uint64{}) || a.FallbackPieces != ([8]uint64{}) {
		t.Errorf("published fallbacks %v %v, want none", a.FallbackBytes, a.FallbackPieces)
	}
	if a.OutboundLanes != 1 || fwd.OutboundLanes != 1 {
		t.Errorf("outbound lanes %d and %d, want one each (each rank relays for the other)", a.OutboundLanes, fwd.OutboundLanes)
	}
	if fwd.ForwardedBytes != n {
		t.Errorf("relay published %d forwarded bytes, want %d", fwd.ForwardedBytes, n)
	}
	if a.PumpCPUNanos == 0 || a.Gen == 0 || a.Gen%2 != 0 {
		t.Errorf("pump CPU %d ns, generation %d: want CPU time and a finished publish", a.PumpCPUNanos, a.Gen)
	}
}

// pollFailCopier is a host copier whose engine fails (CopyPoller) once
// fail is set.
type pollFailCopier struct {
	*cpucopy.HostCopier
	fail *atomic.Bool
}

func (c pollFailCopier) Poll() (int, error) {
	if c.fail.Load() {
		return 0, errors.New("copy engine lost")
	}
	return 0, nil
}

// A copier that fails while Pieces it copied are published fails those
// Pieces, but keeps the sender's lane until its drain at close: its copies
// may still be landing in the relay's slots, and the relay may still send
// from them, so the lane must not go to another sender meanwhile.
func TestCopierFailureKeepsTheLaneUntilItDrains(t *testing.T) {
	const n = 4 * staging.SlotSize
	var fail atomic.Bool
	p := newPair(t, pairOpts{tgtSize: n, srcSize: n, separate: true,
		copierA: func(h *cpucopy.HostCopier) relay.Copier { return pollFailCopier{h, &fail} }})
	p.hopB.SetHold(true)
	b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(0), Len: n, Target: sessRail1, Dst: tgtBase}})
	if err != nil {
		t.Fatal(err)
	}
	held := func() int {
		for i := range p.rankB.claims {
			if p.rankB.claims[i].Load() == int32(p.rankA.pid) {
				return i
			}
		}
		return -1
	}
	waitFor(t, "four Pieces published", func() bool { return held() >= 0 && p.rankB.lane(held()).State().Published == 4 })
	lane := held()
	fail.Store(true)
	waitBatch(t, b)
	if st := statusOf(t, b, 0); st.State != relay.Failed {
		t.Fatalf("status %+v, want failed: its Pieces were published when the copier failed", st)
	}
	if c := p.a.Counters(); c.LaneQuarantines != 1 || c.FailedPieces != 4 {
		t.Errorf("quarantines %d, failed pieces %d; want 1 and 4", c.LaneQuarantines, c.FailedPieces)
	}
	// The sender's pump goes on beating and checking its lanes; the claim
	// stays through every round until close.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if held() != lane {
			t.Fatalf("lane %d released while the failed copier had not drained", lane)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.hopB.SetHold(false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = p.a.Close(ctx)
	if held() >= 0 {
		t.Errorf("lane %d still held after the sender closed", lane)
	}
}
