// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/internal/sim/hostfault"
	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/internal/testhooks"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

const (
	mib       = 1 << 20
	tgtBase   = 0x7f0000000000
	sessRail0 = "target-rail0"
	sessRail1 = "target-rail1"
)

var railMap = map[string]string{
	"mlx5_0": "rail0", "mlx5_1": "rail1",
	"rmlx5_0": "rail0", "rmlx5_1": "rail1",
}

// pair is two engines on two rails of one group, each with its own hop, and
// two target sessions (one per rail) whose buffers both hops write into.
type pair struct {
	g        *memGroup
	a, b     *relay.Engine
	hopA     *fabric.Loopback
	hopB     *fabric.Loopback
	copA     *cpucopy.HostCopier
	holdA    *hostfault.Holder
	tgt      map[string][]byte
	rankA    *memRank
	rankB    *memRank
	srcBytes []byte
}

type pairOpts struct {
	tgtSize   int
	srcSize   int
	hopDepth  int
	cfg       func(*engineconfig.Config)
	holdReady bool
	// wrapB, when set, gives engine b the hop and directory it returns
	// instead of hopB itself.
	wrapB func(*fabric.Loopback) (relay.Hop, relay.Directory)
	// manual opens the engines with their pumps unstarted: the test runs
	// rounds with RunRound. without leaves one engine ("a" or "b") out,
	// its rank still registered, for a test that plays its part.
	manual bool
	// gpuDrain, for newGPUPair, bounds the GPU copier's Close
	// (gpu.CopierOptions.DrainTimeout; 0: its default).
	gpuDrain time.Duration
	without  string
	// separate publishes every Piece in a slot of its own: tests that fill
	// a ring Piece by Piece.
	separate bool
	// copierA, when set, gives engine a the copier it returns instead of
	// its host copier.
	copierA func(*cpucopy.HostCopier) relay.Copier
	// goStarted, when set, is called for each goroutine either engine
	// starts.
	goStarted func()
}

// enabledConfig is PXN on without the planner's ramp: the tests count and
// place Pieces in whole slots. Ramp tests set FirstPiece themselves.
func enabledConfig() engineconfig.Config {
	cfg := engineconfig.Default()
	cfg.Enable = true
	cfg.GroupID = "test"
	cfg.RailMap = railMap
	cfg.FirstPiece = staging.SlotSize
	return cfg
}

func newPair(t *testing.T, o pairOpts) *pair { return newPairTB(t, o) }

func newPairTB(t testing.TB, o pairOpts) *pair {
	t.Helper()
	p := &pair{g: newMemGroup(t), tgt: map[string][]byte{}}
	p.hopA = fabric.NewLoopback(fabric.LoopbackOptions{QueueDepth: o.hopDepth})
	p.hopB = fabric.NewLoopback(fabric.LoopbackOptions{QueueDepth: o.hopDepth})
	for sess, hca := range map[string]string{sessRail0: "rmlx5_0", sessRail1: "rmlx5_1"} {
		buf := mapAnon(t, o.tgtSize)
		p.tgt[sess] = buf
		for _, h := range []*fabric.Loopback{p.hopA, p.hopB} {
			if err := h.AddTarget(sess, hca, buf, tgtBase); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg := enabledConfig()
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	p.srcBytes = mapAnon(t, o.srcSize)
	fillPattern(p.srcBytes, 1)
	if o.holdReady {
		p.holdA = hostfault.NewHolder()
		p.copA = testhooks.NewHostCopier(testhooks.HostCopier{Ready: p.holdA}).(*cpucopy.HostCopier)
	} else {
		p.copA = cpucopy.NewHostCopier()
	}
	if err := p.copA.RegisterDevice(p.src(0), uint64(len(p.srcBytes))); err != nil {
		t.Fatal(err)
	}
	p.rankA = p.g.add("rail0", "mlx5_0")
	p.rankB = p.g.add("rail1", "mlx5_1")
	hooks := relay.FaultHooks{ManualPump: o.manual, SeparateSlots: o.separate, GoStarted: o.goStarted}
	var err error
	if o.without != "a" {
		var copA relay.Copier = p.copA
		if o.copierA != nil {
			copA = o.copierA(p.copA)
		}
		p.a, err = relay.OpenWithFaultHooks(cfg, relay.Deps{Hop: p.hopA, Directory: p.hopA, Copier: copA, Registry: p.rankA, LocalHCA: "mlx5_0"}, hooks)
		if err != nil {
			t.Fatal(err)
		}
	}
	if o.without != "b" {
		var hopB relay.Hop = p.hopB
		var dirB relay.Directory = p.hopB
		if o.wrapB != nil {
			hopB, dirB = o.wrapB(p.hopB)
		}
		p.b, err = relay.OpenWithFaultHooks(cfg, relay.Deps{Hop: hopB, Directory: dirB, Copier: cpucopy.NewHostCopier(), Registry: p.rankB, LocalHCA: "mlx5_1"}, hooks)
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, e := range []*relay.Engine{p.a, p.b} {
			if e != nil {
				_ = e.Close(ctx)
			}
		}
	})
	if p.a != nil && !o.manual {
		waitFor(t, "route to rail1", func() bool { return p.a.HasRelay("rail1") })
	}
	return p
}

func (p *pair) src(off int) uintptr { return uintptr(unsafe.Pointer(&p.srcBytes[0])) + uintptr(off) }

// fillPattern writes a pattern that differs at every offset of a Piece and
// between Pieces, so a byte staged in the wrong slot or at the wrong offset is
// caught.
func fillPattern(b []byte, seed uint64) {
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		*(*uint64)(unsafe.Pointer(&b[i])) = x
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(i)
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func waitBatch(t *testing.T, b *relay.Batch) {
	t.Helper()
	waitFor(t, "batch completion", b.Done)
}

func statusOf(t *testing.T, b *relay.Batch, i int) relay.TaskStatus {
	t.Helper()
	st, err := b.Status(i)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestSameRailGoesDirect(t *testing.T) {
	p := newPair(t, pairOpts{tgtSize: 16 * mib, srcSize: 16 * mib})
	before := p.a.Counters()
	b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(0), Len: 10 << 10, Target: sessRail0, Dst: tgtBase}})
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, b)
	if st := statusOf(t, b, 0); st.State != relay.Completed || st.Transferred != 10<<10 {
		t.Fatalf("status %+v, want completed with %d bytes", st, 10<<10)
	}
	if b.Route(0) != relay.RouteDirect {
		t.Fatalf("same-rail write routed %v, want direct", b.Route(0))
	}
	after := p.a.Counters()
	if after.RelayedBytes != before.RelayedBytes || after.DirectBytes-before.DirectBytes != 10<<10 {
		t.Fatalf("counters before %+v after %+v", before, after)
	}
	if !bytes.Equal(p.tgt[sessRail0][:10<<10], p.srcBytes[:10<<10]) {
		t.Fatal("destination bytes differ from the source")
	}
}

func TestCrossRailThroughRelay(t *testing.T) {
	sizes := []int{10 << 10, 8*mib - 1, 8 * mib, 8*mib + 1, 40*mib + 3}
	p := newPair(t, pairOpts{tgtSize: 64 * mib, srcSize: 64 * mib})
	for _, n := range sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			clear(p.tgt[sessRail1])
			beforeA, beforeB := p.a.Counters(), p.b.Counters()
			b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(0), Len: uint64(n), Target: sessRail1, Dst: tgtBase}})
			if err != nil {
				t.Fatal(err)
			}
			waitBatch(t, b)
			if st := statusOf(t, b, 0); st.State != relay.Completed || st.Transferred != uint64(n) {
				t.Fatalf("status %+v", st)
			}
			if b.Route(0) != relay.RoutePXN {
				t.Fatalf("route %v, want PXN", b.Route(0))
			}
			if !bytes.Equal(p.tgt[sessRail1][:n], p.srcBytes[:n]) {
				t.Fatal("destination bytes differ from the source")
			}
			a, bb := p.a.Counters(), p.b.Counters()
			wantPieces := uint64((n + staging.SlotSize - 1) / staging.SlotSize)
			if a.RelayedBytes-beforeA.RelayedBytes != uint64(n) || a.RelayedPieces-beforeA.RelayedPieces != wantPieces {
				t.Fatalf("sender relayed %d bytes in %d pieces, want %d in %d", a.RelayedBytes-beforeA.RelayedBytes, a.RelayedPieces-beforeA.RelayedPieces, n, wantPieces)
			}
			if a.FallbackBytes != 0 {
				t.Fatalf("healthy run fell back: %+v", a)
			}
			if bb.ForwardedBytes-beforeB.ForwardedBytes != uint64(n) {
				t.Fatalf("relay forwarded %d bytes, want %d", bb.ForwardedBytes-beforeB.ForwardedBytes, n)
			}
		})
	}
}

func TestRingFillsAtEighteenAndNineteenthReusesSlotZero(t *testing.T) {
	const pieces = staging.SlotsPerLane + 1
	p := newPair(t, pairOpts{tgtSize: pieces * staging.SlotSize, srcSize: pieces * staging.SlotSize,
		cfg: func(c *engineconfig.Config) { c.CreditTimeout = time.Hour }})
	p.hopB.SetHold(true)
	b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(0), Len: pieces * staging.SlotSize, Target: sessRail1, Dst: tgtBase}})
	if err != nil {
		t.Fatal(err)
	}
	lane := p.rankB.lane(0)
	waitFor(t, "18 pieces published", func() bool { return lane.State().Published == staging.SlotsPerLane })
	waitFor(t, "relay holding its inflight depth", func() bool { return len(p.hopB.Held()) == 4 })
	waitFor(t, "a credit wait", func() bool { return p.a.Counters().CreditWaits > 0 })
	if got := lane.State().Published; got != staging.SlotsPerLane {
		t.Fatalf("published seq %d with a full ring, want %d", got, staging.SlotsPerLane)
	}
	if got := atomic.LoadUint64(&lane.Ready[0].Seq); got != 1 {
		t.Fatalf("slot 0 ready word %d before reuse, want 1", got)
	}
	if b.Done() {
		t.Fatal("batch done while the relay holds its second hop")
	}
	p.hopB.SetHold(false)
	p.hopB.CompleteAll()
	waitBatch(t, b)
	if st := statusOf(t, b, 0); st.State != relay.Completed {
		t.Fatalf("status %+v", st)
	}
	if got := atomic.LoadUint64(&lane.Ready[0].Seq); got != staging.SlotsPerLane+1 {
		t.Fatalf("slot 0 ready word %d, want seq 19 to reuse it", got)
	}
	if c := p.a.Counters(); c.FallbackPieces != 0 || c.RelayedPieces != pieces {
		t.Fatalf("counters %+v, want %d relayed and no fallback", c, pieces)
	}
	if got := lane.State().Reaped; got != pieces {
		t.Fatalf("reaped seq %d, want %d", got, pieces)
	}
	if !bytes.Equal(p.tgt[sessRail1], p.srcBytes) {
		t.Fatal("destination bytes differ from the source")
	}
}

func TestMixedBatchPerTaskStatus(t *testing.T) {
	p := newPair(t, pairOpts{tgtSize: 32 * mib, srcSize: 32 * mib})
	p.hopB.FailRange(sessRail1, relay.Range{Addr: tgtBase + 16*mib, Len: mib}, errors.New("injected NIC error"))
	reqs := []relay.Request{
		{Op: relay.Write, Src: p.src(0), Len: 3 * mib, Target: sessRail0, Dst: tgtBase},
		// A full slot: the failing task below starts the next Piece, since a
		// relay completes (and fails) whole Pieces.
		{Op: relay.Write, Src: p.src(3 * mib), Len: 8 * mib, Target: sessRail1, Dst: tgtBase},
		{Op: relay.Write, Src: p.src(16 * mib), Len: mib, Target: sessRail1, Dst: tgtBase + 16*mib},
		{Op: relay.Write, Src: p.src(0), Len: 0, Target: sessRail1, Dst: tgtBase},
	}
	b, err := p.a.Submit(reqs)
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, b)
	want := []struct {
		state relay.State
		route relay.Route
	}{{relay.Completed, relay.RouteDirect}, {relay.Completed, relay.RoutePXN}, {relay.Failed, relay.RoutePXN}, {relay.Completed, relay.RouteDirect}}
	for i, w := range want {
		st := statusOf(t, b, i)
		if st.State != w.state || b.Route(i) != w.route {
			t.Errorf("task %d: state %v route %v (err %v), want %v via %v", i, st.State, b.Route(i), st.Err, w.state, w.route)
		}
	}
	if st := statusOf(t, b, 2); st.Err == nil || !strings.Contains(st.Err.Error(), "second hop") {
		t.Errorf("failed task error %v, want the second-hop reason", st.Err)
	}
	if !bytes.Equal(p.tgt[sessRail0][:3*mib], p.srcBytes[:3*mib]) || !bytes.Equal(p.tgt[sessRail1][:8*mib], p.srcBytes[3*mib:11*mib]) {
		t.Fatal("destination bytes differ from the source")
	}
}

func TestCreditTimeoutSendsDirect(t *testing.T) {
	const n = (staging.SlotsPerLane + 2) * staging.SlotSize
	p := newPair(t, pairOpts{tgtSize: n, srcSize: n, cfg: func(c *engineconfig.Config) { c.CreditTimeout = 50 * time.Millisecond }})
	p.hopB.SetBusy(true)
	b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(0), Len: n, Target: sessRail1, Dst: tgtBase}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "fallback after the credit timeout", func() bool { return p.a.Counters().FallbackPieces >= 2 })
	p.hopB.SetBusy(false)
	waitBatch(t, b)
	if st := statusOf(t, b, 0); st.State != relay.Completed || st.Transferred != n {
		t.Fatalf("status %+v", st)
	}
	c := p.a.Counters()
	if c.FallbackPieces != 2 || c.RelayedPieces != staging.SlotsPerLane {
		t.Fatalf("fallback %d relayed %d pieces, want 2 and %d", c.FallbackPieces, c.RelayedPieces, staging.SlotsPerLane)
	}
	wantFallbacks(t, c, map[int]uint64{staging.FallbackCreditTimeout: 2})
	if !bytes.Equal(p.tgt[sessRail1], p.srcBytes) {
		t.Fatal("destination bytes differ from the source")
	}
}

func TestRelayGoneFailsPublishedOnceAndQueuedGoDirect(t *testing.T) {
	const n = (staging.SlotsPerLane + 4) * staging.SlotSize
	p := newPair(t, pairOpts{tgtSize: n, srcSize: n})
	p.hopB.SetHold(true)
	b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(0), Len: n, Target: sessRail1, Dst: tgtBase}})
	if err != nil {
		t.Fatal(err)
	}
	lane := p.rankB.lane(0)
	waitFor(t, "a full ring", func() bool { return lane.State().Published == staging.SlotsPerLane })
	p.rankB.gone.Store(true)
	waitBatch(t, b)
	st := statusOf(t, b, 0)
	if st.State != relay.Failed || !strings.Contains(st.Err.Error(), "relay gone") {
		t.Fatalf("status %+v, want failed because the relay is gone", st)
	}
	c := p.a.Counters()
	if c.FailedPieces != staging.SlotsPerLane || c.FallbackPieces != 4 {
		t.Fatalf("failed %d fallback %d pieces, want %d and 4", c.FailedPieces, c.FallbackPieces, staging.SlotsPerLane)
	}
	wantFallbacks(t, c, map[int]uint64{staging.FallbackRelayGone: 4})
	if st.Transferred != 4*staging.SlotSize {
		t.Fatalf("transferred %d, want the 4 fallback pieces (%d)", st.Transferred, 4*staging.SlotSize)
	}
}

func TestFallbackWaitsForSourceReady(t *testing.T) {
	// With source-ready events held, copies never finish, so the ring fills
	// with published Pieces and the rest stay queued. When the relay goes,
	// the published ones fail and the queued ones go direct, but only once
	// their source is ready.
	const n = (staging.SlotsPerLane + 2) * staging.SlotSize
	p := newPair(t, pairOpts{tgtSize: n, srcSize: n, holdReady: true})
	b, err := p.a.Submit([]relay.Request{
		{Op: relay.Write, Src: p.src(0), Len: staging.SlotsPerLane * staging.SlotSize, Target: sessRail1, Dst: tgtBase},
		{Op: relay.Write, Src: p.src(staging.SlotsPerLane * staging.SlotSize), Len: 2 * staging.SlotSize, Target: sessRail1, Dst: tgtBase + staging.SlotsPerLane*staging.SlotSize},
	})
	if err != nil {
		t.Fatal(err)
	}
	lane := p.rankB.lane(0)
	waitFor(t, "a full ring", func() bool { return lane.State().Published == staging.SlotsPerLane })
	p.rankB.gone.Store(true)
	waitFor(t, "published pieces failed", func() bool { st, _ := b.Status(0); return st.State == relay.Failed })
	if p.a.Counters().FallbackPieces != 0 || b.Done() {
		t.Fatal("the fallback ran before its source-ready event")
	}
	if n := p.holdA.ReleaseAllReady(); n == 0 {
		t.Fatal("no source-ready event was held")
	}
	waitBatch(t, b)
	if st := statusOf(t, b, 1); st.State != relay.Completed || p.a.Counters().FallbackPieces != 2 {
		t.Fatalf("status %+v counters %+v", st, p.a.Counters())
	}
	wantFallbacks(t, p.a.Counters(), map[int]uint64{staging.FallbackRelayGone: 2})
	tail := staging.SlotsPerLane * staging.SlotSize
	if !bytes.Equal(p.tgt[sessRail1][tail:], p.srcBytes[tail:]) {
		t.Fatal("destination bytes differ from the source")
	}
}

// TestDisabledEngineStartsNothing counts the goroutines the engine itself
// starts, through its hooks, not the process's: another test's goroutine
// winding down does not move the count. The enabled pair shows that the
// count sees the goroutines an engine does start.
func TestDisabledEngineStartsNothing(t *testing.T) {
	var pumps atomic.Int32
	newPair(t, pairOpts{tgtSize: mib, srcSize: mib, goStarted: func() { pumps.Add(1) }})
	if n := pumps.Load(); n != 2 {
		t.Fatalf("an enabled pair started %d goroutines, want its 2 pumps", n)
	}
	hop := fabric.NewLoopback(fabric.LoopbackOptions{})
	buf := make([]byte, mib)
	if err := hop.AddTarget(sessRail1, "rmlx5_1", buf, tgtBase); err != nil {
		t.Fatal(err)
	}
	var started atomic.Int32
	e, err := relay.OpenWithFaultHooks(engineconfig.Default(), relay.Deps{Hop: hop, Directory: hop}, relay.FaultHooks{GoStarted: func() { started.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if n := started.Load(); n != 0 {
		t.Fatalf("disabled engine started %d goroutines", n)
	}
	src := bytes.Repeat([]byte{0xab}, 4096)
	b, err := e.Submit([]relay.Request{{Op: relay.Write, Src: uintptr(unsafe.Pointer(&src[0])), Len: 4096, Target: sessRail1, Dst: tgtBase}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "direct completion", func() bool { e.Progress(); return b.Done() })
	if !bytes.Equal(buf[:4096], src) || e.PXNActive() {
		t.Fatal("disabled engine did not carry the write direct")
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A Piece of 16 KiB blocks carries 512 writes; a hop whose queue holds 8
// must still take them all, a few at a time, on the relay, the fallback and
// the direct path alike.
func TestShallowHopQueueTakesWholePieces(t *testing.T) {
	const n, block = 24 * mib, 16 << 10
	p := newPair(t, pairOpts{tgtSize: n, srcSize: n, hopDepth: 8})
	var reqs []relay.Request
	for off := 0; off < n; off += block {
		target := sessRail1
		if off >= 16*mib {
			target = sessRail0
		}
		reqs = append(reqs, relay.Request{Op: relay.Write, Src: p.src(off), Len: block, Target: target, Dst: tgtBase + uint64(off)})
	}
	b, err := p.a.Submit(reqs)
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, b)
	for i := range reqs {
		if st := statusOf(t, b, i); st.State != relay.Completed {
			t.Fatalf("task %d: %+v", i, st)
		}
	}
	if !bytes.Equal(p.tgt[sessRail1][:16*mib], p.srcBytes[:16*mib]) || !bytes.Equal(p.tgt[sessRail0][16*mib:], p.srcBytes[16*mib:]) {
		t.Fatal("destination bytes differ from the source")
	}
	if c := p.a.Counters(); c.RelayedBytes != 16*mib || c.DirectBytes != 8*mib {
		t.Fatalf("counters %+v", c)
	}
}
