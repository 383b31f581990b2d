// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/relay"
)

// rangeCopier is a host copier that reports, for device memory, the
// allocation [lo, lo+size) and counts what the engine asks.
type rangeCopier struct {
	*cpucopy.HostCopier
	lo     uintptr
	size   uint64
	ranged atomic.Int64
	plain  atomic.Int64
}

func (c *rangeCopier) Classify(addr uintptr, n uint64) relay.Kind {
	c.plain.Add(1)
	return c.HostCopier.Classify(addr, n)
}

func (c *rangeCopier) ClassifyRange(addr uintptr, n uint64) (relay.Kind, uintptr, uint64) {
	c.ranged.Add(1)
	if c.HostCopier.Classify(addr, n) != relay.Device {
		return relay.Host, 0, 0
	}
	return relay.Device, c.lo, c.size
}

// TestSubmitClassifiesEachAllocationOnce submits KV-like batches of
// scattered 16 KiB blocks: the copier is asked once per allocation of a
// Submit, an allocation that does not hold a request is never trusted for
// it, and host memory still goes direct.
func TestSubmitClassifiesEachAllocationOnce(t *testing.T) {
	const block, blocks = 16 << 10, 256
	var rc *rangeCopier
	p := newPair(t, pairOpts{tgtSize: 16 * mib, srcSize: 8 * mib, copierA: func(h *cpucopy.HostCopier) relay.Copier {
		rc = &rangeCopier{HostCopier: h}
		return rc
	}})
	host := mapAnon(t, block)
	fillPattern(host, 9)
	hostSrc := uintptr(unsafe.Pointer(&host[0]))
	cases := []struct {
		name      string
		size      uint64
		extraHost bool
		wantAsked int64
	}{
		{name: "one allocation holds every block", size: 8 * mib, wantAsked: 1},
		{name: "the reported allocation holds only the first half", size: 4 * mib, wantAsked: 1 + blocks/2},
		{name: "the reported allocation ends inside a block", size: 4*mib + 8<<10, wantAsked: 1 + blocks/2},
		{name: "a host block among device blocks", size: 8 * mib, extraHost: true, wantAsked: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clear(p.tgt[sessRail1])
			rc.lo, rc.size = p.src(0), c.size
			rc.ranged.Store(0)
			rc.plain.Store(0)
			var reqs []relay.Request
			want := make([]byte, 16*mib)
			for i := 0; i < blocks; i++ {
				var s int
				if i < blocks/2 {
					s = (i * 89 % (blocks / 2)) * (8 * mib / blocks)
				} else {
					s = 4*mib + ((i-blocks/2)*89%(blocks/2))*(8*mib/blocks)
				}
				d := (i * 131 % (2 * blocks)) * block
				reqs = append(reqs, relay.Request{Op: relay.Write, Src: p.src(s), Len: block, Target: sessRail1, Dst: tgtBase + uint64(d)})
				copy(want[d:d+block], p.srcBytes[s:s+block])
			}
			if c.extraHost {
				d := 2 * blocks * block
				reqs = append(reqs, relay.Request{Op: relay.Write, Src: hostSrc, Len: block, Target: sessRail1, Dst: tgtBase + uint64(d)})
				copy(want[d:d+block], host)
			}
			b, err := p.a.Submit(reqs)
			if err != nil {
				t.Fatal(err)
			}
			waitBatch(t, b)
			for i := range reqs {
				st := statusOf(t, b, i)
				wantRoute := relay.RoutePXN
				if i == blocks {
					wantRoute = relay.RouteDirect
				}
				if st.State != relay.Completed || b.Route(i) != wantRoute {
					t.Fatalf("request %d: %+v, route %v, want %v", i, st, b.Route(i), wantRoute)
				}
			}
			_ = b.Release()
			if !bytes.Equal(p.tgt[sessRail1], want) {
				t.Fatal("target bytes differ")
			}
			if got, plain := rc.ranged.Load(), rc.plain.Load(); got != c.wantAsked || plain != 0 {
				t.Fatalf("ClassifyRange asked %d times (want %d), Classify %d times (want 0)", got, c.wantAsked, plain)
			}
		})
	}
}

// TestSubmitInterleavedTargetsAndStreams interleaves blocks to a same-rail
// and a cross-rail session, on two source streams, in one Submit: each
// block takes its own session's route and every byte lands, whatever the
// block before it resolved to.
func TestSubmitInterleavedTargetsAndStreams(t *testing.T) {
	const block, blocks = 4 << 10, 512
	p := newPair(t, pairOpts{tgtSize: 4 * mib, srcSize: 4 * mib})
	clear(p.tgt[sessRail0])
	clear(p.tgt[sessRail1])
	want := map[string][]byte{sessRail0: make([]byte, 4*mib), sessRail1: make([]byte, 4*mib)}
	var reqs []relay.Request
	for i := 0; i < blocks; i++ {
		sess := sessRail1
		if i%3 == 1 {
			sess = sessRail0
		}
		s, d := (i*37%blocks)*block, (i*101%blocks)*block
		reqs = append(reqs, relay.Request{Op: relay.Write, Src: p.src(s), Len: block, Target: sess, Dst: tgtBase + uint64(d), Stream: uintptr(i % 2)})
		copy(want[sess][d:d+block], p.srcBytes[s:s+block])
	}
	b, err := p.a.Submit(reqs)
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, b)
	for i, r := range reqs {
		wantRoute := relay.RoutePXN
		if r.Target == sessRail0 {
			wantRoute = relay.RouteDirect
		}
		if st := statusOf(t, b, i); st.State != relay.Completed || b.Route(i) != wantRoute {
			t.Fatalf("request %d to %s: %+v, route %v, want %v", i, r.Target, st, b.Route(i), wantRoute)
		}
	}
	_ = b.Release()
	for sess, w := range want {
		if !bytes.Equal(p.tgt[sess], w) {
			t.Fatalf("%s: target bytes differ", sess)
		}
	}
}
