// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/relay"
)

// keyOf is the key the test directory gives a range: what an RDMA directory
// would carry as the range's remote key.
func keyOf(addr uint64) uint64 { return addr ^ 0x5a5a_0000_0000_0001 }

// countingDir counts Resolve calls by session and gives every range a key.
type countingDir struct {
	inner relay.Directory
	mu    sync.Mutex
	calls map[string]int
}

func (d *countingDir) Resolve(session string, dst uint64) (relay.Target, error) {
	d.mu.Lock()
	d.calls[session]++
	d.mu.Unlock()
	t, err := d.inner.Resolve(session, dst)
	if err != nil {
		return t, err
	}
	rs := make([]relay.Range, len(t.Ranges))
	for i, r := range t.Ranges {
		rs[i] = relay.Range{Addr: r.Addr, Len: r.Len, Key: keyOf(r.Addr)}
	}
	return relay.Target{HCAs: t.HCAs, Ranges: rs}, nil
}

func (d *countingDir) count(session string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[session]
}

// routerHop is a hop with routes: it hands out one handle per Route call
// and checks that every routed op carries the session's current handle and
// the key of the range its destination lies in (every session of these
// tests has a range at tgtBase). The Loopback underneath
// gets the ops without them.
type routerHop struct {
	lb      *fabric.Loopback
	mu      sync.Mutex
	routes  int
	handles map[string]*hopHandle
	routed  int
	plain   int
	bad     []string
	scratch []relay.WriteOp
}

type hopHandle struct{ session string }

func (h *routerHop) Route(session string) (any, error) {
	if _, err := h.lb.Resolve(session, tgtBase); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.routes++
	hh := &hopHandle{session: session}
	h.handles[session] = hh
	return hh, nil
}

func (h *routerHop) Submit(ops []relay.WriteOp) error {
	h.mu.Lock()
	h.scratch = h.scratch[:0]
	for _, op := range ops {
		if op.Route == nil {
			h.plain++
		} else {
			h.routed++
			if hh, ok := op.Route.(*hopHandle); !ok || hh != h.handles[op.Target] {
				h.bad = append(h.bad, fmt.Sprintf("token %d to %q carries handle %v, want %p", op.Token, op.Target, op.Route, h.handles[op.Target]))
			}
			want := uint64(0)
			tg, _ := h.lb.Resolve(op.Target, op.Dst)
			for _, r := range tg.Ranges {
				if op.Dst >= r.Addr && op.Dst-r.Addr < r.Len {
					want = keyOf(r.Addr)
				}
			}
			if op.Key != want {
				h.bad = append(h.bad, fmt.Sprintf("token %d dst %#x carries key %#x, want %#x", op.Token, op.Dst, op.Key, want))
			}
		}
		op.Route, op.Key = nil, 0
		h.scratch = append(h.scratch, op)
	}
	err := h.lb.Submit(h.scratch)
	h.mu.Unlock()
	return err
}

func (h *routerHop) Poll(out []relay.HopCompletion) int { return h.lb.Poll(out) }

func (h *routerHop) stats() (routes, routed, plain int, bad []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.routes, h.routed, h.plain, append([]string(nil), h.bad...)
}

// routedPair is a pair whose relay b resolves through a countingDir and
// forwards through a routerHop.
func routedPair(t *testing.T, size int) (*pair, *countingDir, *routerHop) {
	t.Helper()
	var dir *countingDir
	var hop *routerHop
	p := newPair(t, pairOpts{tgtSize: size, srcSize: size, wrapB: func(lb *fabric.Loopback) (relay.Hop, relay.Directory) {
		dir = &countingDir{inner: lb, calls: map[string]int{}}
		hop = &routerHop{lb: lb, handles: map[string]*hopHandle{}}
		return hop, dir
	}})
	return p, dir, hop
}

// write sends n bytes of the source at off to dst of session through engine
// a and returns the task's final status.
func (p *pair) write(t *testing.T, off, n int, session string, dst uint64) relay.TaskStatus {
	t.Helper()
	b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(off), Len: uint64(n), Target: session, Dst: dst}})
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, b)
	if b.Route(0) != relay.RoutePXN {
		t.Fatalf("write of %d bytes to %q at %#x routed %v, want PXN", n, session, dst, b.Route(0))
	}
	st := statusOf(t, b, 0)
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	return st
}

// wantCalls checks how often the relay's directory resolved sessRail1 and
// how often its hop handed out a route, with no routed op carrying a wrong
// handle or key.
func wantCalls(t *testing.T, dir *countingDir, hop *routerHop, resolves, routes int) {
	t.Helper()
	if n := dir.count(sessRail1); n != resolves {
		t.Fatalf("relay resolved %q %d times, want %d", sessRail1, n, resolves)
	}
	if r, _, _, bad := hop.stats(); r != routes || len(bad) > 0 {
		t.Fatalf("hop saw %d Route calls and mismatches %q; want %d and none", r, bad, routes)
	}
}

// writeAll submits reqs through engine a and waits until every one has
// completed.
func (p *pair) writeAll(t *testing.T, reqs []relay.Request) {
	t.Helper()
	b, err := p.a.Submit(reqs)
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, b)
	for i := range reqs {
		if st := statusOf(t, b, i); st.State != relay.Completed {
			t.Fatalf("request %d: %+v", i, st)
		}
	}
}

func wantRoutes(t *testing.T, e *relay.Engine, resolves, drops uint64) {
	t.Helper()
	c := e.Counters()
	if c.RouteResolves != resolves || c.RouteDrops != drops {
		t.Fatalf("relay route counters: %d resolves, %d drops; want %d and %d", c.RouteResolves, c.RouteDrops, resolves, drops)
	}
}

func TestRelayResolvesATargetOnce(t *testing.T) {
	p, dir, hop := routedPair(t, 96*mib)
	entries := 0
	for i := range 6 {
		if st := p.write(t, i*8*mib, 8*mib, sessRail1, tgtBase+uint64(i)*8*mib); st.State != relay.Completed {
			t.Fatalf("write %d: %+v", i, st)
		}
		entries++
	}
	// Five Pieces, and a Piece of many entries.
	if st := p.write(t, 48*mib, 40*mib, sessRail1, tgtBase+48*mib); st.State != relay.Completed {
		t.Fatalf("40 MiB write: %+v", st)
	}
	entries += 5
	reqs := make([]relay.Request, 64)
	for i := range reqs {
		reqs[i] = relay.Request{Op: relay.Write, Src: p.src(88*mib + i*16<<10), Len: 16 << 10, Target: sessRail1, Dst: tgtBase + 88*mib + uint64(i)*16<<10}
	}
	p.writeAll(t, reqs)
	entries += len(reqs)
	if !bytes.Equal(p.tgt[sessRail1][:89*mib], p.srcBytes[:89*mib]) {
		t.Fatal("target differs from the source")
	}
	wantRoutes(t, p.b, 1, 0)
	if n := dir.count(sessRail1); n != 1 {
		t.Fatalf("relay resolved %q %d times, want once", sessRail1, n)
	}
	routes, routed, plain, bad := hop.stats()
	if routes != 1 || routed != entries || plain != 0 || len(bad) > 0 {
		t.Fatalf("hop saw %d Route calls, %d routed and %d plain ops, mismatches %q; want 1, %d, 0, none", routes, routed, plain, bad, entries)
	}
}

func TestSecondHopFailureDropsTheRoute(t *testing.T) {
	p, dir, hop := routedPair(t, 16*mib)
	if st := p.write(t, 0, 8*mib, sessRail1, tgtBase); st.State != relay.Completed {
		t.Fatalf("first write: %+v", st)
	}
	wantRoutes(t, p.b, 1, 0)
	p.hopB.FailSession(sessRail1, errors.New("link down"))
	st := p.write(t, 0, 8*mib, sessRail1, tgtBase)
	if st.State != relay.Failed || st.Err == nil || !strings.Contains(st.Err.Error(), "second hop") {
		t.Fatalf("write through a failing hop: %+v, want a second-hop failure", st)
	}
	wantRoutes(t, p.b, 1, 1)
	p.hopB.ClearFailures()
	clear(p.tgt[sessRail1])
	if st := p.write(t, 0, 8*mib, sessRail1, tgtBase); st.State != relay.Completed {
		t.Fatalf("write after the failure cleared: %+v", st)
	}
	if !bytes.Equal(p.tgt[sessRail1][:8*mib], p.srcBytes[:8*mib]) {
		t.Fatal("target differs from the source")
	}
	wantRoutes(t, p.b, 2, 1)
	wantCalls(t, dir, hop, 2, 2)
}

func TestNewRangeOfATargetIsResolvedAgain(t *testing.T) {
	p, dir, hop := routedPair(t, 16*mib)
	if st := p.write(t, 0, 8*mib, sessRail1, tgtBase); st.State != relay.Completed {
		t.Fatalf("first write: %+v", st)
	}
	// The target registers more memory: both engines' directories see it,
	// the relay's cached route does not.
	const base2 = tgtBase + 1<<32
	buf2 := mapAnon(t, 8*mib)
	for _, h := range []*fabric.Loopback{p.hopA, p.hopB} {
		if err := h.AddTarget(sessRail1, "rmlx5_1", buf2, base2); err != nil {
			t.Fatal(err)
		}
	}
	before := p.a.Counters()
	if st := p.write(t, 8*mib, 8*mib, sessRail1, base2); st.State != relay.Completed {
		t.Fatalf("write to the new range: %+v", st)
	}
	if !bytes.Equal(buf2, p.srcBytes[8*mib:16*mib]) {
		t.Fatal("new range differs from the source")
	}
	if c := p.a.Counters(); c.RelayedPieces-before.RelayedPieces != 1 || c.FallbackPieces != before.FallbackPieces {
		t.Fatalf("sender counters before %+v after %+v: want one relayed Piece", before, c)
	}
	// The miss resolved the new address and kept the route and its handle.
	wantRoutes(t, p.b, 2, 0)
	wantCalls(t, dir, hop, 2, 1)
}

func TestDestinationOutsideTheRelaysRangesFails(t *testing.T) {
	p, _, _ := routedPair(t, 16*mib)
	if st := p.write(t, 0, 8*mib, sessRail1, tgtBase); st.State != relay.Completed {
		t.Fatalf("first write: %+v", st)
	}
	// Only the sender's directory knows this range: the relay's does not.
	const base3 = tgtBase + 2<<32
	if err := p.hopA.AddTarget(sessRail1, "rmlx5_1", mapAnon(t, 8*mib), base3); err != nil {
		t.Fatal(err)
	}
	st := p.write(t, 0, 8*mib, sessRail1, base3)
	if st.State != relay.Failed || st.Err == nil || !strings.Contains(st.Err.Error(), "not resolvable") {
		t.Fatalf("write outside the relay's ranges: %+v, want an unresolved failure", st)
	}
	// The miss resolved once more before failing, and left the route as
	// it was.
	wantRoutes(t, p.b, 2, 0)
	if st := p.write(t, 0, 8*mib, sessRail1, tgtBase); st.State != relay.Completed {
		t.Fatalf("write after the miss: %+v", st)
	}
	wantRoutes(t, p.b, 2, 0)
}

// oneRangeDir answers a resolve with only the range that holds dst, as a
// directory of registrations does.
type oneRangeDir struct{ *countingDir }

func (d oneRangeDir) Resolve(session string, dst uint64) (relay.Target, error) {
	t, err := d.countingDir.Resolve(session, dst)
	if err != nil {
		return t, err
	}
	for _, r := range t.Ranges {
		if dst >= r.Addr && dst-r.Addr < r.Len {
			return relay.Target{HCAs: t.HCAs, Ranges: []relay.Range{r}}, nil
		}
	}
	return relay.Target{}, fmt.Errorf("no range of %q holds %#x", session, dst)
}

func TestRouteGathersRangesResolvedOneByOne(t *testing.T) {
	var dir *countingDir
	var hop *routerHop
	p := newPair(t, pairOpts{tgtSize: 8 * mib, srcSize: 16 * mib, wrapB: func(lb *fabric.Loopback) (relay.Hop, relay.Directory) {
		dir = &countingDir{inner: lb, calls: map[string]int{}}
		hop = &routerHop{lb: lb, handles: map[string]*hopHandle{}}
		return hop, oneRangeDir{dir}
	}})
	const base2 = tgtBase + 1<<32
	buf2 := mapAnon(t, 8*mib)
	for _, h := range []*fabric.Loopback{p.hopA, p.hopB} {
		if err := h.AddTarget(sessRail1, "rmlx5_1", buf2, base2); err != nil {
			t.Fatal(err)
		}
	}
	// One Piece reaching into both ranges, then writes to each in turn:
	// two resolves in all, however they alternate.
	reqs := []relay.Request{
		{Op: relay.Write, Src: p.src(0), Len: 4 * mib, Target: sessRail1, Dst: tgtBase},
		{Op: relay.Write, Src: p.src(4 * mib), Len: 4 * mib, Target: sessRail1, Dst: base2},
	}
	for range 3 {
		p.writeAll(t, reqs)
		for _, base := range []uint64{tgtBase, base2, tgtBase, base2} {
			if st := p.write(t, 8*mib, 4*mib, sessRail1, base+4*mib); st.State != relay.Completed {
				t.Fatalf("write to %#x: %+v", base, st)
			}
		}
	}
	if !bytes.Equal(p.tgt[sessRail1][:4*mib], p.srcBytes[:4*mib]) || !bytes.Equal(buf2[:4*mib], p.srcBytes[4*mib:8*mib]) {
		t.Fatal("targets differ from the source")
	}
	wantRoutes(t, p.b, 2, 0)
	wantCalls(t, dir, hop, 2, 1)
}

func TestInvalidateTargetResolvesAgain(t *testing.T) {
	p, dir, hop := routedPair(t, 16*mib)
	write := func() {
		t.Helper()
		if st := p.write(t, 0, 8*mib, sessRail1, tgtBase); st.State != relay.Completed {
			t.Fatalf("write: %+v", st)
		}
	}
	write()
	wantRoutes(t, p.b, 1, 0)
	p.b.InvalidateTarget("no-such-session")
	write()
	wantRoutes(t, p.b, 1, 0)
	p.b.InvalidateTarget(sessRail1)
	write()
	wantRoutes(t, p.b, 2, 1)
	p.b.InvalidateTarget("")
	write()
	wantRoutes(t, p.b, 3, 2)
	wantCalls(t, dir, hop, 3, 3)
}

func TestLoopbackRoutesTheRelaysWrites(t *testing.T) {
	p := newPair(t, pairOpts{tgtSize: 16 * mib, srcSize: 16 * mib})
	for i := range 4 {
		if st := p.write(t, 0, 8*mib, sessRail1, tgtBase+uint64(i%2)*8*mib); st.State != relay.Completed {
			t.Fatalf("write %d: %+v", i, st)
		}
	}
	if s := p.hopB.Stats(); s.Resolves != 1 || s.Routes != 1 || s.Routed != 4 || s.Lookups != 0 {
		t.Fatalf("relay's hop stats %+v: want 1 resolve, 1 route, 4 routed ops, 0 lookups", s)
	}

	// The target goes away on the relay's side: the routed write fails
	// rather than landing anywhere, the route is dropped, and the next
	// Piece finds no target.
	if err := p.hopB.RemoveTarget(sessRail1); err != nil {
		t.Fatal(err)
	}
	if st := p.write(t, 0, 8*mib, sessRail1, tgtBase); st.State != relay.Failed || !strings.Contains(st.Err.Error(), "second hop") {
		t.Fatalf("write after the target was removed: %+v, want a second-hop failure", st)
	}
	if st := p.write(t, 0, 8*mib, sessRail1, tgtBase); st.State != relay.Failed || !strings.Contains(st.Err.Error(), "not resolvable") {
		t.Fatalf("next write: %+v, want an unresolved failure", st)
	}
	wantRoutes(t, p.b, 2, 1)

	// Registered again, and the host says so (the relay remembers for a
	// while that the session did not resolve): a new route, a new handle,
	// the bytes land.
	clear(p.tgt[sessRail1])
	if err := p.hopB.AddTarget(sessRail1, "rmlx5_1", p.tgt[sessRail1], tgtBase); err != nil {
		t.Fatal(err)
	}
	p.b.InvalidateTarget(sessRail1)
	if st := p.write(t, 0, 8*mib, sessRail1, tgtBase); st.State != relay.Completed {
		t.Fatalf("write after the target came back: %+v", st)
	}
	if !bytes.Equal(p.tgt[sessRail1][:8*mib], p.srcBytes[:8*mib]) {
		t.Fatal("target differs from the source")
	}
	wantRoutes(t, p.b, 3, 1)
	if s := p.hopB.Stats(); s.Routes != 2 || s.Lookups != 0 {
		t.Fatalf("relay's hop stats %+v: want 2 routes and 0 lookups", s)
	}
}

// A second-hop write that timed out reaches the sender as a timeout
// (relay.ErrTimedOut, through the relay's CompletionTimeout); any other
// second-hop failure does not.
func TestSecondHopTimeoutReachesTheSender(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		timeout bool
	}{
		{"timed out", fmt.Errorf("no ack from the peer: %w", relay.ErrTimedOut), true},
		{"failed", errors.New("link down"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _, _ := routedPair(t, 16*mib)
			p.hopB.FailSession(sessRail1, tc.err)
			st := p.write(t, 0, 8*mib, sessRail1, tgtBase)
			if st.State != relay.Failed || errors.Is(st.Err, relay.ErrTimedOut) != tc.timeout {
				t.Fatalf("write through a hop failing with %v: %+v; want failed, timeout %v", tc.err, st, tc.timeout)
			}
		})
	}
}
