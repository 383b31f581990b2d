// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// A relay that closes gracefully while a sender has a full ring on it
// completes or fails every published ticket, so the sender gives its lane
// back and the relay's close never waits out the drain for a lease: with a
// second hop that moves, every published Piece is relayed and the close
// ends without error, before its deadline; with one that is held, the
// drain runs out and the published Pieces fail, but the lease still comes
// back.
func TestFaultRelayClosesGracefully(t *testing.T) {
	const writes = 120
	cases := []struct {
		name string
		hold bool
		// bound is the relay's close deadline.
		bound time.Duration
		want  map[string]int
	}{
		{"second hop moving", false, 10 * time.Second, map[string]int{"completed": writes}},
		{"second hop held", true, 2 * time.Second,
			map[string]int{"failed": staging.SlotsPerLane, "completed": writes - staging.SlotsPerLane}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newFaultGroup(t, faultGroupOpts{})
			r := g.start("relay", 1, faultMiB)
			s := g.start("sender", 0, writes*faultPiece)
			s.route(faultRail(1), true, 20*time.Second)
			r.call(faultReq{Op: "hold", On: true})
			s.submit(true, faultWrites(1, writes, faultPiece, 0, 0)...)
			eventually(t, 20*time.Second, "a full ring", func() bool {
				l := g.laneOf(r.pid, s.pid)
				return l != nil && l.Published == staging.SlotsPerLane
			})
			r.call(faultReq{Op: "hold", On: c.hold})
			cl := r.close(c.bound)
			checkClosed(t, "relay", cl, c.bound)
			if strings.Contains(cl.CloseErr, registry.ErrLeaseHeld.Error()) {
				t.Errorf("the relay's close waited out the drain for a lease: %s", cl.CloseErr)
			}
			if !c.hold && cl.CloseErr != "" {
				t.Errorf("close with a moving second hop failed: %s", cl.CloseErr)
			}
			ts := s.wait(20 * time.Second)
			g.verify(0, ts)
			checkStates(t, ts, c.want)
			piecesAccountedFor(t, s.counters(), writes)
			r.exit()
			cs := s.close(5 * time.Second)
			checkClosed(t, "sender", cs, 5*time.Second)
			s.exit()
			onlyLock(t, g)
		})
	}
}
