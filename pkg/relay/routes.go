// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"slices"
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
