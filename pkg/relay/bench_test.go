// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/relay"
)

// The benchmarks of this file use only the engine's public API and the
// in-process pair, so that hack/bench-baseline.sh can run the same file
// against an earlier commit and report before/after ratios of one run.

// releaser is a Batch that can go back to the engine's pool. Probed, not
// required, so that this file builds against engines without Release.
type releaser interface{ Release() error }

// transferSizes are the sizes of the performance contract's host-path table.
var transferSizes = []struct {
	name string
	n    int
}{
	{"10KiB", 10 << 10},
	{"8MiB", 8 * mib},
	{"1GiB", 1 << 30},
}

// BenchmarkTransfer moves one contiguous cross-rail write per iteration
// through a relay (in-process pair, loopback second hop), waits for it, and
// reports heap allocations per Piece for the whole process: both engines,
// both pumps, the copier and the hop.
func BenchmarkTransfer(b *testing.B) {
	for _, sz := range transferSizes {
		b.Run(sz.name, func(b *testing.B) {
			p := newPairTB(b, pairOpts{tgtSize: sz.n, srcSize: sz.n})
			req := []relay.Request{{Op: relay.Write, Src: p.src(0), Len: uint64(sz.n), Target: sessRail1, Dst: tgtBase}}
			run := func() {
				bt, err := p.a.Submit(req)
				if err != nil {
					b.Fatal(err)
				}
				for !bt.Done() {
					runtime.Gosched()
				}
				if st, _ := bt.Status(0); st.State != relay.Completed {
					b.Fatalf("transfer %s: %v (%v)", sz.name, st.State, st.Err)
				}
				if r, ok := any(bt).(releaser); ok {
					if err := r.Release(); err != nil {
						b.Fatal(err)
					}
				}
			}
			// Warm up: pools, the route cache and the hop reach their
			// steady-state sizes before anything is counted. The host
			// copier fills a buffer per queued copy on first use, so
			// that takes twice its lane depth in Pieces.
			for n := 0; n < 3 || p.a.Counters().RelayedPieces < 2*cpucopy.LaneQueueDepth; n++ {
				run()
			}
			measureSteadyState(b, p, uint64(sz.n), run)
			if !bytes.Equal(p.tgt[sessRail1][:sz.n], p.srcBytes[:sz.n]) {
				b.Fatalf("transfer %s: target differs from source", sz.name)
			}
		})
	}
}

// measureSteadyState runs op b.N times and reports, beside ns/op, the heap
// allocations and bytes per Piece over the timed loop. It fails the
// benchmark when any Piece went direct: it would not measure the relay.
func measureSteadyState(b *testing.B, p *pair, bytesPerOp uint64, op func()) {
	b.Helper()
	measurePieces(b, bytesPerOp, func() (uint64, uint64) {
		c := p.a.Counters()
		return c.RelayedPieces, c.FallbackPieces
	}, op)
}

// measurePieces is measureSteadyState with the Piece count read by pieces:
// those carried by the path under test, and those that went direct.
func measurePieces(b *testing.B, bytesPerOp uint64, pieces func() (carried, direct uint64), op func()) {
	b.Helper()
	done0, direct0 := pieces()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	b.SetBytes(int64(bytesPerOp))
	b.ResetTimer()
	for b.Loop() {
		op()
	}
	b.StopTimer()
	runtime.ReadMemStats(&m1)
	done1, direct1 := pieces()
	n := done1 - done0
	if fb := direct1 - direct0; fb != 0 || n == 0 {
		b.Fatalf("%d Pieces relayed, %d went direct: not a relay measurement", n, fb)
	}
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(n), "allocs/piece")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(n), "B/piece")
	b.ReportMetric(float64(n)/float64(b.N), "pieces/op")
}

// BenchmarkCrossRailBlocks16KiB moves 64 MiB of 16 KiB blocks through a
// relay (512 plan entries per Piece) per iteration.
func BenchmarkCrossRailBlocks16KiB(b *testing.B) {
	const n, block = 64 * mib, 16 << 10
	p := newPairTB(b, pairOpts{tgtSize: n, srcSize: n})
	reqs := make([]relay.Request, 0, n/block)
	for off := 0; off < n; off += block {
		reqs = append(reqs, relay.Request{Op: relay.Write, Src: p.src(off), Len: block, Target: sessRail1, Dst: tgtBase + uint64(off)})
	}
	run := func() {
		bt, err := p.a.Submit(reqs)
		if err != nil {
			b.Fatal(err)
		}
		for !bt.Done() {
			runtime.Gosched()
		}
		for i := range reqs {
			if st, _ := bt.Status(i); st.State != relay.Completed {
				b.Fatalf("block %d: %v (%v)", i, st.State, st.Err)
			}
		}
		if r, ok := any(bt).(releaser); ok {
			if err := r.Release(); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i := 0; i < 3 || p.a.Counters().RelayedPieces < 2*cpucopy.LaneQueueDepth; i++ {
		run()
	}
	measureSteadyState(b, p, n, run)
}
