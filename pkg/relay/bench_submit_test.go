// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
	"golang.org/x/sys/unix"
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

// BenchmarkSubmitBlocks times Submit alone, with the pumps driven by the
// benchmark outside the timer, for one request of 10240 blocks (80 layers
// × K/V × 64 pages, the 4 KiB-block shape of P14): the caller's cost per
// block of classifying, grouping, planning, counting and queueing.
func BenchmarkSubmitBlocks(b *testing.B) {
	for _, block := range []int{2 << 10, 4 << 10, 16 << 10} {
		b.Run(fmt.Sprintf("%dKiB", block>>10), func(b *testing.B) {
			const blocks = 80 * 2 * 64
			pool := 2 * blocks * block
			p := newPairTB(b, pairOpts{tgtSize: pool, srcSize: pool, manual: true})
			for !p.a.HasRelay("rail1") {
				p.a.RunRound()
				p.b.RunRound()
			}
			reqs := make([]relay.Request, 0, blocks)
			for i := range blocks {
				s := (i * 7919 % (2 * blocks)) * block
				d := (i * 104729 % (2 * blocks)) * block
				reqs = append(reqs, relay.Request{Op: relay.Write, Src: p.src(s), Len: uint64(block), Target: sessRail1, Dst: tgtBase + uint64(d)})
			}
			// The thread's CPU time, not the wall clock, is what a block
			// costs the caller; on a loaded machine the two differ a lot.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var cpu time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				t0 := threadCPU()
				bt, err := p.a.Submit(reqs)
				cpu += threadCPU() - t0
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				for !bt.Done() {
					p.a.RunRound()
					p.b.RunRound()
				}
				if st, _ := bt.Status(blocks - 1); st.State != relay.Completed || bt.Route(blocks-1) != relay.RoutePXN {
					b.Fatalf("last block: %+v, route %v", st, bt.Route(blocks-1))
				}
				_ = bt.Release()
				b.StartTimer()
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/blocks, "cpu-ns/block")
		})
	}
}

// threadCPU is the calling thread's CPU time.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}
