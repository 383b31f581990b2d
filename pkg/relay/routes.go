// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
)

// maxRoutes bounds the relay's route cache; past it the cache starts over.
const maxRoutes = 1024

// route is a target session as the relay resolved it once: its registered
// ranges with their keys, sorted by address, and the hop's own handle for
// it. Later Pieces to the session only look their destinations up in the
// ranges. The relayer's only.
type route struct {
	session string
	ranges  []Range
	handle  any
	// last is the range the previous lookup found: a Piece's entries, and
	// consecutive Pieces, mostly land in the same one.
	last int
}

// find returns the index of the range that holds dst..dst+n, or -1.
func (r *route) find(dst, n uint64) int {
	if r.last < len(r.ranges) && inRange(r.ranges[r.last], dst, n) {
		return r.last
	}
	i, _ := slices.BinarySearchFunc(r.ranges, dst, func(rg Range, d uint64) int {
		if rg.Addr+rg.Len <= d {
			return -1
		}
		if rg.Addr > d {
			return 1
		}
		return 0
	})
	if i < len(r.ranges) && inRange(r.ranges[i], dst, n) {
		r.last = i
		return i
	}
	return -1
}

// inRange reports whether dst..dst+n lies inside rg, without overflow.
func inRange(rg Range, dst, n uint64) bool {
	return dst >= rg.Addr && dst-rg.Addr <= rg.Len && n <= rg.Len-(dst-rg.Addr)
}

// maxRouteRanges bounds the ranges one route holds; past it the route keeps
// only what the directory answered last.
const maxRouteRanges = 4096

// merge adds ranges to the route: a cached range that overlaps a new one
// is replaced by it.
func (r *route) merge(ranges []Range) {
	rs := r.ranges
	if len(rs)+len(ranges) > maxRouteRanges {
		rs = nil
	}
	for _, nr := range ranges {
		rs = slices.DeleteFunc(rs, func(c Range) bool {
			return c.Len > 0 && nr.Len > 0 && c.Addr <= nr.Addr+(nr.Len-1) && nr.Addr <= c.Addr+(c.Len-1)
		})
		rs = append(rs, nr)
	}
	slices.SortFunc(rs, func(a, b Range) int { return cmp.Compare(a.Addr, b.Addr) })
	r.ranges, r.last = rs, 0
}

const (
	// unresolvedFor is how long a lane remembers a session whose lookup
	// failed: until then the lane's Pieces that need another lookup of it
	// fail at once, without one.
	unresolvedFor = time.Second
	// maxUnresolved bounds the sessions a lane remembers; while that many
	// are remembered, the lane's Pieces that need a lookup of any other
	// session fail without one too.
	maxUnresolved = 64
	// lookupWait bounds how long a lane waits for its lookup: past it the
	// Piece fails as unresolved and the lane goes on. The lookup's answer
	// still fills the cache when it comes, and until then the lane asks
	// for no other.
	lookupWait = time.Second
)

// routeState is what routeFor found for a Piece.
type routeState int

const (
	routeReady routeState = iota
	routeWait
	routeFailed
)

// taken is a Piece the relayer took from an inbound lane and has not
// handed to the hop yet.
type taken struct {
	epoch, seq uint64
	seen       int64
	// tries counts the lookups the Piece asked for; since is when it began
	// waiting for the first.
	tries int
	since time.Time
}

// laneRoutes is the relayer's route state of one inbound lane: the Desc of
// the Piece it took last, that Piece while it waits for its lookup, the
// lane's lookup and the sessions whose lookups failed. The pump's only;
// look belongs to the lane's resolver from its hand-over until its done
// word is set.
type laneRoutes struct {
	vd    staging.ValidDesc
	held  bool
	piece taken
	// busy is set from a lookup's hand-over until the pump took its answer.
	busy bool
	look *lookup
	// failed holds when each session's lookup failed, for the lane's epoch
	// failEpoch.
	failed    map[string]time.Time
	failEpoch uint64
}

// refuses reports whether the lane may not look session up now: it failed
// within unresolvedFor, or the lane remembers as many failures as it may.
func (lr *laneRoutes) refuses(session []byte, epoch uint64, now time.Time) bool {
	if epoch != lr.failEpoch {
		return false
	}
	if at, ok := lr.failed[string(session)]; ok {
		return now.Sub(at) < unresolvedFor
	}
	if len(lr.failed) < maxUnresolved {
		return false
	}
	lr.expire(now)
	return len(lr.failed) >= maxUnresolved
}

// remember records that session's lookup failed at now, for the lane's
// epoch epoch.
func (lr *laneRoutes) remember(session string, epoch uint64, now time.Time) {
	if epoch != lr.failEpoch || lr.failed == nil {
		lr.failed = make(map[string]time.Time)
		lr.failEpoch = epoch
	}
	if len(lr.failed) >= maxUnresolved {
		lr.expire(now)
	}
	if len(lr.failed) < maxUnresolved {
		lr.failed[session] = now
	}
}

// expire forgets the failures older than unresolvedFor.
func (lr *laneRoutes) expire(now time.Time) {
	maps.DeleteFunc(lr.failed, func(_ string, at time.Time) bool { return now.Sub(at) >= unresolvedFor })
}

// lookup is one directory lookup of a lane, run off the pump by the lane's
// resolver. The pump writes the question and hands it over on req; the
// resolver writes the answer and then sets done, after which the pump
// reads it.
type lookup struct {
	session string
	dst, n  uint64
	// handle asks the hop for its handle of the session too (a new route).
	handle bool
	// epoch is the lane's epoch and gen the relayer's invalidation count
	// when the lookup was asked for.
	epoch, gen uint64

	ranges []Range
	route  any
	err    error

	done atomic.Bool
	req  chan struct{}
}

// run answers the lookup: the session's ranges, which must hold dst..dst+n
// and be served from the local rail by exactly one HCA, and the hop's
// handle when asked. The directory and the hop are the host's: a panic in
// them fails the lookup.
func (lk *lookup) run(s *shared) {
	lk.ranges, lk.route, lk.err = lk.ranges[:0], nil, nil
	defer func() {
		if r := recover(); r != nil {
			lk.err = fmt.Errorf("lookup of target %q panicked: %v", lk.session, r)
		}
	}()
	t, err := s.dir.Resolve(lk.session, lk.dst)
	switch {
	case err != nil:
		lk.err = err
	case len(t.HCAs) != 1:
		lk.err = fmt.Errorf("target %q is served by %d HCAs %q, not one", lk.session, len(t.HCAs), t.HCAs)
	case staging.CanonicalRail(s.cfg.RailMap, t.HCAs[0]) != s.localRail:
		lk.err = fmt.Errorf("target %q is served by HCA %q, not from rail %q", lk.session, t.HCAs[0], s.localRail)
	case !slices.ContainsFunc(t.Ranges, func(r Range) bool { return inRange(r, lk.dst, lk.n) }):
		lk.err = fmt.Errorf("no range of target %q holds %d bytes at %#x", lk.session, lk.n, lk.dst)
	}
	if lk.err != nil {
		return
	}
	lk.ranges = append(lk.ranges, t.Ranges...)
	if r, ok := s.hop.(Router); ok && lk.handle {
		if lk.route, err = r.Route(lk.session); err != nil {
			lk.err = fmt.Errorf("hop has no route to target %q: %w", lk.session, err)
		}
	}
}

// routeFor fills rec's writes for the Piece p that lane i holds, from the
// session's cached route. A session not in the cache, or a destination
// outside its ranges, needs a lookup: the Piece waits for it (routeWait),
// or fails (routeFailed) when the lane may not ask for one now, or when it
// has asked for more lookups than it has plan entries (a directory whose
// answers keep replacing each other).
func (rl *relayer) routeFor(i int, p *taken, rec *inflightRec, src uintptr) (*route, routeState) {
	lr := &rl.lk[i]
	rl.answer(i)
	session, plans := lr.vd.Session(), lr.vd.Plans()
	rt := rl.routes[string(session)]
	miss := 0
	if rt != nil {
		if miss = rec.fill(rt, plans, src); miss < 0 {
			return rt, routeReady
		}
	}
	if p.tries > len(plans) || lr.busy || lr.refuses(session, p.epoch, rl.now) {
		return nil, routeFailed
	}
	lk := rl.resolverOf(i)
	if lk.session != string(session) {
		lk.session = string(session)
	}
	lk.dst, lk.n, lk.handle = plans[miss].Dst, plans[miss].Len, rt == nil
	lk.epoch, lk.gen = p.epoch, rl.invalGen
	lr.busy = true
	rl.s.counters.routeResolves.Add(1)
	lk.req <- struct{}{}
	p.tries++
	return nil, routeWait
}

// answer takes lane i's finished lookup: its ranges go into the session's
// route (a new one when the lookup asked for the hop's handle), or, when
// it failed, the lane remembers the session. An answer asked for before an
// invalidation is dropped. It reports false while the lookup runs.
func (rl *relayer) answer(i int) bool {
	lr := &rl.lk[i]
	if !lr.busy {
		return true
	}
	lk := lr.look
	if !lk.done.Load() {
		return false
	}
	lk.done.Store(false)
	lr.busy = false
	if lk.gen != rl.invalGen {
		return true
	}
	if lk.err != nil {
		rl.s.log.V(2).Info("target not served from this rail", "session", lk.session, "dst", lk.dst, "err", lk.err)
		lr.remember(lk.session, lk.epoch, rl.now)
		return true
	}
	rt := rl.routes[lk.session]
	if rt == nil {
		if !lk.handle {
			return true
		}
		rt = &route{session: lk.session, handle: lk.route}
		if len(rl.routes) >= maxRoutes {
			clear(rl.routes)
		}
		rl.routes[rt.session] = rt
	}
	rt.merge(lk.ranges)
	return true
}

// park keeps p on lane i until its lookup answers: the lane takes no
// other Piece meanwhile, and the other lanes go on.
func (rl *relayer) park(i int, p taken) {
	if p.since.IsZero() {
		p.since = rl.now
	}
	rl.lk[i].held, rl.lk[i].piece = true, p
	rl.parked++
}

// resume goes on with the Piece lane i holds once its lookup answered, or
// fails it once it has waited lookupWait. A lane claimed anew meanwhile
// gets the completion of the Piece, which its endpoint drops, and nothing
// is forwarded from a slot that is another sender's now.
func (rl *relayer) resume(i int) bool {
	lr := &rl.lk[i]
	p := lr.piece
	answered := rl.answer(i)
	if !answered && rl.now.Sub(p.since) < lookupWait {
		return false
	}
	lr.held = false
	rl.parked--
	rx := rl.in[i].rx
	if !answered || !rx.Current() || rx.Epoch() != p.epoch {
		rl.complete(i, p.epoch, p.seq, staging.CompletionUnresolved)
		return true
	}
	return rl.forward(i, p)
}

// failParked completes every Piece still waiting for a lookup with status
// (the relay is closing).
func (rl *relayer) failParked(status int32) {
	for i := range rl.lk {
		if lr := &rl.lk[i]; lr.held {
			lr.held = false
			rl.parked--
			rl.complete(i, lr.piece.epoch, lr.piece.seq, status)
		}
	}
}

// forgetUnresolved forgets every lane's failed lookups of session ("" for
// all) and makes lookups in flight answer nothing.
func (rl *relayer) forgetUnresolved(session string) {
	rl.invalGen++
	for i := range rl.lk {
		if session == "" {
			clear(rl.lk[i].failed)
		} else {
			delete(rl.lk[i].failed, session)
		}
	}
}

// resolverOf returns lane i's lookup, starting the lane's resolver the
// first time: a goroutine that answers the lane's lookups one at a time,
// so that a slow lookup holds up no other lane's.
func (rl *relayer) resolverOf(i int) *lookup {
	lr := &rl.lk[i]
	if lr.look != nil {
		return lr.look
	}
	lk := &lookup{req: make(chan struct{}, 1)}
	lr.look = lk
	s := rl.s
	if h := s.hooks; h != nil && h.goStarted != nil {
		h.goStarted()
	}
	rl.resolvers.Add(1)
	go func() {
		defer rl.resolvers.Done()
		for range lk.req {
			lk.run(s)
			lk.done.Store(true)
			s.wake()
		}
	}()
	return lk
}

// stopResolvers ends the lanes' resolvers once the pump has stopped,
// waiting for the lookups they run: the directory and the hop are the
// host's, and nothing calls them once the engine is closed.
func (rl *relayer) stopResolvers() {
	for i := range rl.lk {
		if lk := rl.lk[i].look; lk != nil {
			close(lk.req)
		}
	}
	rl.resolvers.Wait()
}
