// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"slices"
	"testing"

	"github.com/pxn-project/pxn/pkg/relay"
)

// queueHop is a hop of a bounded queue that records the length of every
// Submit it takes and completes each op at the next Poll.
type queueHop struct {
	depth   int
	queued  []uint64
	submits []int
	tokens  []uint64
	busy    int
}

func (h *queueHop) Submit(ops []relay.WriteOp) error {
	if len(h.queued)+len(ops) > h.depth {
		h.busy++
		return relay.ErrHopBusy
	}
	h.submits = append(h.submits, len(ops))
	for _, op := range ops {
		h.queued = append(h.queued, op.Token)
	}
	return nil
}

func (h *queueHop) Poll(out []relay.HopCompletion) int {
	n := min(len(out), len(h.queued))
	for i, tok := range h.queued[:n] {
		out[i] = relay.HopCompletion{Token: tok}
	}
	h.tokens = append(h.tokens, h.queued[:n]...)
	h.queued = h.queued[n:]
	return n
}

// TestBarePostsAsTheEngine: the direct baseline hands its requests over in
// the calls transferEngine makes (16 requests on a spinning device, all on
// the host path, --per-submit when set), posts a call's writes to the hop
// in Submits that end at the call's end while nothing waits, and the rest,
// once the hop was busy, in Submits of 32 across calls, as the engine's
// backlog does; every write once, one op a request whatever its length.
func TestBarePostsAsTheEngine(t *testing.T) {
	cases := []struct {
		name      string
		n         int
		spin      bool
		perSubmit int
		depth     int
		want      []int
	}{
		{"spinning device, room for all", 40, true, 0, 1000, []int{16, 16, 8}},
		{"host path: one call, chunks of 32", 70, false, 0, 1000, []int{32, 32, 6}},
		{"per-submit 5", 12, false, 5, 1000, []int{5, 5, 2}},
		{"busy at the third call: the backlog in chunks of 32", 80, true, 0, 40, []int{16, 16, 32, 16}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const block = 8 << 20
			mine := []transfer{{Rank: 0, Target: 0, Len: uint64(c.n) * block, Block: block, Remote: sessionName(0)}}
			h := &queueHop{depth: c.depth}
			res, err := transferBare(h, mine, 0x1000, c.spin, c.perSubmit)
			if err != nil {
				t.Fatal(err)
			}
			if res.Requests != c.n || res.Bytes != uint64(c.n)*block || res.Failed != 0 {
				t.Fatalf("result %+v", res)
			}
			if !slices.Equal(h.submits, c.want) || (c.depth < c.n) != (h.busy > 0) {
				t.Errorf("Submits of %v ops (%d refused), want %v", h.submits, h.busy, c.want)
			}
			want := make([]uint64, c.n)
			for i := range want {
				want[i] = uint64(i)
			}
			if !slices.Equal(h.tokens, want) {
				t.Errorf("tokens completed %v, want each request once in order", h.tokens)
			}
		})
	}
}
