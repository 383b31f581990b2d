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
