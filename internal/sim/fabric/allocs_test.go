// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
)

// The steady state of the data path allocates nothing: these tests count
// every allocation of the process, the hops' and servers' goroutines
// included, over many ops after a warm-up.

const allocRuns = 2000

func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
}

func TestLoopbackAllocs(t *testing.T) {
	skipUnderRace(t)
	l := NewLoopback(LoopbackOptions{})
	if err := l.AddTarget("kv", "mlx5_0", make([]byte, 16*smallOp), loopBase); err != nil {
		t.Fatal(err)
	}
	route, err := l.Route("kv")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := l.Resolve("kv", loopBase)
	if err != nil {
		t.Fatal(err)
	}
	src := mapped(t, smallOp)
	fill(src, 41)
	for _, tt := range []struct {
		name  string
		route any
		key   uint64
	}{{"lookup", nil, 0}, {"routed", route, tg.Ranges[0].Key}, {"routed without key", route, 0}} {
		ops := make([]relay.WriteOp, 4)
		comps := make([]relay.HopCompletion, len(ops))
		i := 0
		allocs := testing.AllocsPerRun(allocRuns, func() {
			for k := range ops {
				ops[k] = relay.WriteOp{Src: addr(src), Len: smallOp, Target: "kv", Dst: loopBase + uint64(i%16)*smallOp, Token: uint64(i), Route: tt.route, Key: tt.key}
				i++
			}
			if err := l.Submit(ops); err != nil {
				t.Fatal(err)
			}
			if n := l.Poll(comps); n != len(ops) {
				t.Fatalf("%d completions, want %d", n, len(ops))
			}
			for _, c := range comps {
				if c.Err != nil {
					t.Fatalf("token %d: %v", c.Token, c.Err)
				}
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per Submit and Poll of %d ops, want 0", tt.name, allocs, len(ops))
		}
	}
	if st := l.Stats(); st.Routed == 0 || st.Lookups == 0 {
		t.Fatalf("stats %+v: both paths must have run", st)
	}
}

func TestTCPHopAllocs(t *testing.T) {
	skipUnderRace(t)
	const depth = 8
	mem := make([]byte, depth*smallOp)
	_, srvAddr := startServer(t, "127.0.0.1:0", mem, nil, nil)
	src := mapped(t, smallOp)
	fill(src, 42)
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"kv": srvAddr}, QueueDepth: depth})
	route := mustRoute(t, h, "kv")
	for _, tt := range []struct {
		name  string
		route any
	}{{"lookup", nil}, {"routed", route}} {
		ops := make([]relay.WriteOp, depth/2)
		comps := make([]relay.HopCompletion, depth)
		i := 0
		// Each run submits a batch and polls until it has completed:
		// the queue, both goroutines of the connection and the server.
		run := func() {
			for k := range ops {
				ops[k] = relay.WriteOp{Src: addr(src), Len: smallOp, Target: "kv", Dst: tcpBase + uint64(i%depth)*smallOp, Token: uint64(i), Route: tt.route}
				i++
			}
			if err := h.Submit(ops); err != nil {
				t.Fatal(err)
			}
			for got := 0; got < len(ops); {
				n := h.Poll(comps)
				for _, c := range comps[:n] {
					if c.Err != nil {
						t.Fatalf("token %d: %v", c.Token, c.Err)
					}
				}
				got += n
				if n == 0 {
					// Sleep, not yield: a spinning goroutine keeps
					// the scheduler from polling the network.
					time.Sleep(20 * time.Microsecond)
				}
			}
		}
		// The first runs dial and grow the tables.
		for range 64 {
			run()
		}
		// Fewer runs: each waits for the network.
		if allocs := testing.AllocsPerRun(allocRuns/4, run); allocs != 0 {
			t.Errorf("%s: %v allocations per batch of %d ops, want 0", tt.name, allocs, len(ops))
		}
	}
	if st := h.Stats(); st.Dials != 1 || st.Routed == 0 {
		t.Fatalf("stats %+v", st)
	}
}
