// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

// A lane whose epochs end at seq 5 (the sender's laneEnd hook, in place
// of MaxLaneSeq) publishes up to its last seq, drains, and moves to a new
// epoch that starts again at seq 1. Every Piece ends exactly once: relayed,
// or direct when it was queued at the rollover; none is lost or repeated.
// The lane endpoints' own run up to MaxLaneSeq and through a new claim is
// staging's TestLaneWrapsAtMaxLaneSeq.
func TestFaultSequenceWrap(t *testing.T) {
	const last = 5
	hook := faultLastSeqEnv + "=" + strconv.FormatUint(last, 10)
	g := newFaultGroup(t, faultGroupOpts{})
	r := g.start("relay", 1, faultMiB, hook)
	s := g.start("sender", 0, 4*faultMiB, hook)
	s.route(faultRail(1), true, 20*time.Second)
	s.submit(true, faultWrites(1, 12, faultPiece, 0, 0)...)
	ts := s.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 12})
	g.verify(0, ts)
	k := s.counters().Counters
	if k.RelayedPieces != 5 || k.FailedPieces != 0 || k.RelayedBytes+k.FallbackBytes+k.DirectBytes != 12*faultPiece {
		t.Errorf("relayed %d pieces (%d bytes), fallback %d bytes, direct %d bytes, failed %d: want seqs 1..%d relayed and the rest direct",
			k.RelayedPieces, k.RelayedBytes, k.FallbackBytes, k.DirectBytes, k.FailedPieces, last)
	}
	if f := r.counters().Counters.ForwardedPieces; f != 5 {
		t.Errorf("relay forwarded %d pieces, want 5", f)
	}

	// The new epoch carries traffic from seq 1.
	s.route(faultRail(1), true, 20*time.Second)
	s.submit(true, faultWrites(1, 3, faultPiece, 0, 12*faultPiece)...)
	ts = s.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": 15})
	g.verify(0, ts)
	for _, task := range ts[12:] {
		if task.Route != "pxn" {
			t.Errorf("task after the rollover routed %s", task.Route)
		}
	}
	var l *inspect.LaneReport
	eventually(t, 20*time.Second, "the lane after the rollover at seqs 1..3", func() bool {
		l = g.laneOf(r.pid, s.pid)
		return l != nil && l.Next == 4 && l.Published == 3 && l.Completed == 3 && l.Reaped == 3
	})
	if k := s.counters().Counters; k.RelayedPieces != 8 {
		t.Errorf("relayed %d pieces in all, want 8", k.RelayedPieces)
	}
	if f := r.counters().Counters.ForwardedPieces; f != 8 {
		t.Errorf("relay forwarded %d pieces in all, want 8", f)
	}
}
