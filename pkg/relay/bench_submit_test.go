// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/fakecuda"
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

// BenchmarkSubmitGPU is what one Submit costs on the GPU path, on the
// stand-in CUDA driver (internal/fakecuda, which counts its calls): the
// caller's thread has the GPU's context current, as a CUDA application's
// has, and sources lie in the driver's device memory.
//
// "submit" runs the pumps by hand outside the timer, so that only Submit
// is measured: its driver calls (classifying the source, the source-ready
// event) and its CPU time, for a Submit of one one-block request, of 16
// (pxn-bench's GPU streams) and of a kv-small-like request of 256 blocks.
// "stream" runs the pumps on their threads and submits streams of 256
// one-block requests, 16 a Submit, back to back, then waits for them: the
// driver calls of both the caller and the pump, and the system calls that
// woke the sender's pump (wakes) and the relay's (relay-wakes), a Submit.
func BenchmarkSubmitGPU(b *testing.B) {
	b.Run("submit", func(b *testing.B) {
		for _, sh := range []struct {
			name          string
			reqs, blocks  int
			block, stride int
		}{
			{"1x1x16KiB", 1, 1, 16 << 10, 16 << 10},
			{"16x1x16KiB", 16, 1, 16 << 10, 16 << 10},
			{"1x256x16KiB", 1, 256, 16 << 10, 32 << 10},
		} {
			b.Run(sh.name, func(b *testing.B) { benchGPUSubmit(b, sh.reqs*sh.blocks, sh.block, sh.stride) })
		}
	})
	b.Run("stream", func(b *testing.B) {
		for _, block := range []int{2 << 10, 4 << 10, 16 << 10, 64 << 10} {
			b.Run(fmt.Sprintf("%dKiB", block>>10), func(b *testing.B) { benchGPUStream(b, block) })
		}
	})
}

// gpuRequests are n one-block writes of block bytes from gp's device
// source, stride bytes apart, to rail 1.
func gpuRequests(gp *gpuPair, n, block, stride int) []relay.Request {
	reqs := make([]relay.Request, n)
	for i := range reqs {
		reqs[i] = relay.Request{Op: relay.Write, Src: gp.devSrc(i * stride), Len: uint64(block), Target: sessRail1, Dst: tgtBase + uint64(i*block)}
	}
	return reqs
}

func benchGPUSubmit(b *testing.B, n, block, stride int) {
	gp := newGPUPair(b, pairOpts{tgtSize: n * block, srcSize: n * stride, manual: true})
	for !gp.a.HasRelay("rail1") {
		gp.a.RunRound()
		gp.b.RunRound()
	}
	reqs := gpuRequests(gp, n, block, stride)
	drive := func(bt *relay.Batch) {
		for !bt.Done() {
			gp.a.RunRound()
			gp.b.RunRound()
		}
		if st, _ := bt.Status(n - 1); st.State != relay.Completed || bt.Route(n-1) != relay.RoutePXN {
			b.Fatalf("last request: %+v, route %v", st, bt.Route(n-1))
		}
		_ = bt.Release()
	}
	bt, err := gp.a.Submit(reqs)
	if err != nil {
		b.Fatal(err)
	}
	drive(bt)
	var calls uint64
	var cpu time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		before := gp.calls.Total(b)
		t0 := threadCPU()
		bt, err := gp.a.Submit(reqs)
		cpu += threadCPU() - t0
		b.StopTimer()
		calls += gp.calls.Total(b) - before
		if err != nil {
			b.Fatal(err)
		}
		drive(bt)
		b.StartTimer()
	}
	b.ReportMetric(float64(calls)/float64(b.N), "driver-calls/submit")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/submit")
}

func benchGPUStream(b *testing.B, block int) {
	const requests, perSubmit = 256, 16
	gp := newGPUPair(b, pairOpts{tgtSize: requests * block, srcSize: requests * block})
	reqs := gpuRequests(gp, requests, block, block)
	batches := make([]*relay.Batch, 0, requests/perSubmit)
	stream := func() {
		batches = batches[:0]
		for i := 0; i < requests; i += perSubmit {
			bt, err := gp.a.Submit(reqs[i : i+perSubmit])
			if err != nil {
				b.Fatal(err)
			}
			batches = append(batches, bt)
		}
		for _, bt := range batches {
			for !bt.Done() {
				runtime.Gosched()
			}
			if st, _ := bt.Status(perSubmit - 1); st.State != relay.Completed || bt.Route(perSubmit-1) != relay.RoutePXN {
				b.Fatalf("last request: %+v, route %v", st, bt.Route(perSubmit-1))
			}
			_ = bt.Release()
		}
	}
	stream()
	c0, calls0 := gp.a.Counters(), gp.driverCalls(b)
	total0 := gp.calls.Total(b)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		stream()
	}
	b.StopTimer()
	c1, calls := gp.a.Counters(), fakecuda.Since(calls0, gp.driverCalls(b))
	submits := float64(b.N * requests / perSubmit)
	b.ReportMetric(float64(gp.calls.Total(b)-total0)/submits, "driver-calls/submit")
	b.ReportMetric(float64(c1.WakeCalls-c0.WakeCalls)/submits, "wakes/submit")
	b.ReportMetric(float64(c1.RelayWakeCalls-c0.RelayWakeCalls)/submits, "relay-wakes/submit")
	b.ReportMetric(float64(c1.JoinedPieces-c0.JoinedPieces)/float64(b.N*requests), "joined/request")
	if testing.Verbose() {
		b.Logf("driver calls over %d Submits: %v", int(submits), calls)
	}
}
