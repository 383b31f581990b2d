package relay_test

import (
	"testing"

	"github.com/pxn-project/pxn/pkg/relay"
)

// BenchmarkCrossRail moves 64 MiB through a relay (in-process pair,
// loopback second hop) per iteration.
func BenchmarkCrossRail(b *testing.B) {
	const n = 64 * mib
	p := newPairTB(b, pairOpts{tgtSize: n, srcSize: n})
	b.SetBytes(n)
	b.ReportAllocs()
	for b.Loop() {
		bt, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(0), Len: n, Target: sessRail1, Dst: tgtBase}})
		if err != nil {
			b.Fatal(err)
		}
		for !bt.Done() {
		}
	}
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
	b.SetBytes(n)
	b.ReportAllocs()
	for b.Loop() {
		bt, err := p.a.Submit(reqs)
		if err != nil {
			b.Fatal(err)
		}
		for !bt.Done() {
		}
	}
}
