// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
)

// A relay SIGKILLed while one-block Submits, joined into slots, hold its
// ring's whole credit in its second hop: the requests that rode fail, each
// once and with the relay gone, and their destinations hold none of
// another request's bytes; the rest, queued for credit, go direct and
// complete. As many requests ride, and so fail, as would have in a slot
// each: the ring's credit, however the sender joined them.
func TestFaultRelayKilledWithJoinedSlots(t *testing.T) {
	const k, extra, size = staging.SlotsPerLane, 12, 16 * faultKiB
	g := newFaultGroup(t, faultGroupOpts{})
	s := g.start("sender", 0, 4*faultMiB, faultJoinEnv+"=1", contract.EnvCreditTimeout+"=60000")
	r := g.start("relay", 1, faultMiB)
	s.route(faultRail(1), true, 20*time.Second)

	r.call(faultReq{Op: "hold", On: true})
	s.submit(true, faultWrites(1, k+extra, size, 0, 0)...)
	// rode is how many requests are in published slots, and in how many.
	rode := func() (pieces, slots uint64) {
		l, c := g.laneOf(r.pid, s.pid), s.counters().Counters
		if l == nil {
			return 0, 0
		}
		return l.Published - l.Reaped + c.JoinedPieces, l.Published - l.Reaped
	}
	eventually(t, 20*time.Second, "the ring's credit in use", func() bool { n, _ := rode(); return n >= k })
	n, slots := rode()
	if n != k {
		t.Fatalf("%d requests ride in %d slots, want the ring's credit, %d", n, slots, k)
	}
	eventually(t, 20*time.Second, "a credit wait", func() bool { return s.counters().Counters.CreditWaits > 0 })
	if n, slots = rode(); n != k {
		t.Fatalf("%d requests ride in %d slots, want the ring's credit, %d", n, slots, k)
	}
	t.Logf("%d requests rode in %d slots", n, slots)
	r.kill()

	ts := s.wait(20 * time.Second)
	g.verify(0, ts)
	for i, task := range ts {
		want := "completed"
		if i < k {
			want = "failed"
		}
		if task.State != want {
			t.Errorf("task %d (%+v) is %s (%s), want %s", i, task.Write, task.State, task.Err, want)
		}
		if task.State == "failed" {
			if !strings.Contains(task.Err, "relay gone") {
				t.Errorf("task %d failed with %q, want the relay gone", i, task.Err)
			}
			if !bytes.Equal(g.dest(task.Write), make([]byte, task.Write.Len)) {
				t.Errorf("task %d failed but its destination was written", i)
			}
		}
	}
	c := s.counters()
	piecesAccountedFor(t, c, k+extra)
	if n := c.Counters; n.FailedPieces != k || n.FallbackPieces != extra {
		t.Errorf("failed %d and fallback %d Pieces, want %d and %d", n.FailedPieces, n.FallbackPieces, k, extra)
	}
	if cl := s.close(5 * time.Second); cl.CloseErr != "" {
		t.Errorf("sender close: %s", cl.CloseErr)
	}
	s.exit()
}
