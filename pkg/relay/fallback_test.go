// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"errors"
	"testing"

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
