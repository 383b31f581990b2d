// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"cmp"
	"slices"

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

// routeOf returns the cached route of session, resolving it on a miss; nil
// when the session cannot be served from this rail.
func (rl *relayer) routeOf(session []byte, dst uint64) *route {
	if rt := rl.routes[string(session)]; rt != nil {
		return rt
	}
	rt := &route{session: string(session)}
	if !rl.extendRoute(rt, dst) {
		return nil
	}
	if r, ok := rl.s.hop.(Router); ok {
		h, err := r.Route(rt.session)
		if err != nil {
			rl.s.log.V(2).Info("hop has no route to the target", "session", rt.session, "err", err)
			return nil
		}
		rt.handle = h
	}
	if len(rl.routes) >= maxRoutes {
		clear(rl.routes)
	}
	rl.routes[rt.session] = rt
	return rt
}

// extendRoute asks the directory for the session's ranges around dst and
// merges them into rt: a directory may answer with only the range that
// holds dst, and a Piece's entries may reach into ranges not seen yet. A
// cached range that overlaps a new one is replaced by it. It reports false
// when the directory does not place dst on this rail; failures are not
// cached, as a Piece for a target this relay cannot serve is a sender's
// mistake or a race with a registration, and either is rare.
func (rl *relayer) extendRoute(rt *route, dst uint64) bool {
	s := rl.s
	s.counters.routeResolves.Add(1)
	t, err := s.dir.Resolve(rt.session, dst)
	if err != nil || len(t.HCAs) != 1 || staging.CanonicalRail(s.cfg.RailMap, t.HCAs[0]) != s.localRail {
		s.log.V(2).Info("target not served from this rail", "session", rt.session, "dst", dst, "err", err)
		return false
	}
	rs := rt.ranges
	if len(rs)+len(t.Ranges) > maxRouteRanges {
		rs = nil
	}
	for _, nr := range t.Ranges {
		rs = slices.DeleteFunc(rs, func(r Range) bool {
			return r.Len > 0 && nr.Len > 0 && r.Addr <= nr.Addr+(nr.Len-1) && nr.Addr <= r.Addr+(r.Len-1)
		})
		rs = append(rs, nr)
	}
	slices.SortFunc(rs, func(a, b Range) int { return cmp.Compare(a.Addr, b.Addr) })
	rt.ranges, rt.last = rs, 0
	return true
}

// dropRoute removes rt from the cache if it is still there.
func (rl *relayer) dropRoute(rt *route) {
	if rt != nil && rl.routes[rt.session] == rt {
		delete(rl.routes, rt.session)
		rl.s.counters.routeDrops.Add(1)
	}
}

// applyInvalidations drops the routes InvalidateTarget named.
func (rl *relayer) applyInvalidations() {
	names := rl.s.invals.swap(rl.invalBuf)
	if names == nil {
		return
	}
	for _, s := range names {
		if s == "" {
			rl.s.counters.routeDrops.Add(uint64(len(rl.routes)))
			clear(rl.routes)
			continue
		}
		rl.dropRoute(rl.routes[s])
	}
	clear(names)
	rl.invalBuf = names[:0]
}
