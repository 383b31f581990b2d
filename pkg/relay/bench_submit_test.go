// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
)

// BenchmarkSubmitKV times Submit alone for one KV-cache-shaped request:
// 20480 blocks scattered over a source pool and a target pool, all
// cross-rail. Submit classifies, plans and queues every block of a chunk
// before the chunk's first Piece moves, so the first chunk's time is added
// to every request's completion, and the whole Submit to the caller's.
func BenchmarkSubmitKV(b *testing.B) {
	const blocks, block = 20480, 1 << 10
	const pool = 2 * blocks * block
	p := newPairTB(b, pairOpts{tgtSize: pool, srcSize: pool})
	reqs := make([]relay.Request, 0, blocks)
	for i := 0; i < blocks; i++ {
		s := (i * 7919 % (2 * blocks)) * block
		d := (i * 104729 % (2 * blocks)) * block
		reqs = append(reqs, relay.Request{Op: relay.Write, Src: p.src(s), Len: block, Target: sessRail1, Dst: tgtBase + uint64(d)})
	}
	var submit time.Duration
	for b.Loop() {
		t0 := time.Now()
		bt, err := p.a.Submit(reqs)
		submit += time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		for !bt.Done() {
			runtime.Gosched()
		}
		if st, _ := bt.Status(blocks - 1); st.State != relay.Completed || bt.Route(blocks-1) != relay.RoutePXN {
			b.Fatalf("last block: %+v, route %v", st, bt.Route(blocks-1))
		}
		_ = bt.Release()
	}
	b.ReportMetric(float64(submit.Nanoseconds())/float64(b.N)/blocks, "submit-ns/block")
}
