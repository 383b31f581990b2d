// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"sort"
	"strings"
)

const (
	targetBase = 0x7e0000000000
	railPrefix = "rail"
)

// transfer is what one rank writes to one target: Len bytes from its source
// offset Src to the target's offset Dst, cut into requests of Block bytes.
type transfer struct {
	Rank   int    `json:"rank"`
	Target int    `json:"target"`
	Src    uint64 `json:"src"`
	Dst    uint64 `json:"dst"`
	Len    uint64 `json:"len"`
	Block  uint64 `json:"block"`
	Seed   uint64 `json:"seed"`
	Remote string `json:"remote"`
}

// layout is a whole benchmark's traffic: who writes what where.
type layout struct {
	Ranks       int        `json:"ranks"`
	Transfers   []transfer `json:"transfers"`
	TargetBytes []uint64   `json:"targetBytes"`
	// KV, when set, makes the transfers KV-cache-shaped requests (kv.go).
	KV *kvLayout `json:"kv,omitempty"`
	kv *kvPlan
	// HCAs and Rails are each rank's local HCA and its rail (nodeRails).
	HCAs  []string `json:"hcas"`
	Rails []string `json:"rails"`
}

// nodeRails gives ranks HCAs and rails: by default rank k's HCA is mlx5_k
// on railk; with a rail map (a node's MC_PXN_RAIL_MAP, HCA to rail), rank k
// is on the map's k-th rail (in natural order: rail2 before rail10) and uses
// the first HCA of that rail, so that the ranks' names are the node's.
func nodeRails(ranks int, m map[string]string) (hcas, rails []string, err error) {
	if len(m) == 0 {
		for k := 0; k < ranks; k++ {
			hcas, rails = append(hcas, rankHCA(k)), append(rails, railName(k))
		}
		return hcas, rails, nil
	}
	first := map[string]string{}
	for hca, r := range m {
		if h, ok := first[r]; !ok || hca < h {
			first[r] = hca
		}
	}
	for r := range first {
		rails = append(rails, r)
	}
	sort.Slice(rails, func(i, j int) bool {
		if len(rails[i]) != len(rails[j]) {
			return len(rails[i]) < len(rails[j])
		}
		return rails[i] < rails[j]
	})
	if len(rails) < ranks {
		return nil, nil, fmt.Errorf("--rail-map has %d rails (%s), want one for each of the %d ranks", len(rails), strings.Join(rails, ", "), ranks)
	}
	rails = rails[:ranks]
	for _, r := range rails {
		hcas = append(hcas, first[r])
	}
	return hcas, rails, nil
}

func rankHCA(r int) string     { return fmt.Sprintf("mlx5_%d", r) }
func remoteHCA(k int) string   { return fmt.Sprintf("rmlx5_%d", k) }
func railName(k int) string    { return fmt.Sprintf("%s%d", railPrefix, k) }
func sessionName(k int) string { return fmt.Sprintf("decode-node/%s", railName(k)) }
func rankSeed(r int) uint64    { return uint64(r) + 1 }

// railMap is MC_PXN_RAIL_MAP for n simulated rails: local and remote HCAs of
// rail k share the canonical name railk.
func railMap(n int) map[string]string {
	m := map[string]string{}
	for k := 0; k < n; k++ {
		m[rankHCA(k)] = railName(k)
		m[remoteHCA(k)] = railName(k)
	}
	return m
}

// railMap is the ranks' MC_PXN_RAIL_MAP: each rank's HCA and the remote
// HCA of its rail's target on the rank's rail.
func (l *layout) railMap() map[string]string {
	m := map[string]string{}
	for k := range l.Rails {
		m[l.HCAs[k]] = l.Rails[k]
		m[remoteHCA(k)] = l.Rails[k]
	}
	return m
}

// Patterns are run's traffic patterns; kv's requests are KV-cache-shaped
// (kv.go), the others move --bytes per rank.
var Patterns = []string{"cross-rail", "fan-in", "same-rail", "all-to-all", "kv"}

func patternError(pattern string) error {
	return fmt.Errorf("--pattern %q: want %s or %s", pattern, strings.Join(Patterns[:len(Patterns)-1], ", "), Patterns[len(Patterns)-1])
}

// newLayout places every rank's transfers. Each target k is a remote buffer
// on rail k; writes into it are packed one after another.
func newLayout(pattern string, ranks int, bytes, block uint64) (*layout, error) {
	if ranks < 2 || ranks > 8 {
		return nil, fmt.Errorf("--ranks %d: want 2..8 (one rank per GPU of a node)", ranks)
	}
	if bytes == 0 {
		return nil, fmt.Errorf("--bytes must be > 0")
	}
	if block == 0 || block > bytes {
		block = bytes
	}
	l := &layout{Ranks: ranks, TargetBytes: make([]uint64, ranks)}
	add := func(r, k int, src, n uint64) {
		l.Transfers = append(l.Transfers, transfer{Rank: r, Target: k, Src: src, Dst: l.TargetBytes[k], Len: n, Block: block, Seed: rankSeed(r), Remote: sessionName(k)})
		l.TargetBytes[k] += n
	}
	switch pattern {
	case "cross-rail":
		for r := 0; r < ranks; r++ {
			add(r, (r+1)%ranks, 0, bytes)
		}
	case "fan-in":
		// Every other rank writes to rail 0's target: rank 0 relays for
		// all of them on its seven inbound lanes and sends nothing itself.
		for r := 1; r < ranks; r++ {
			add(r, 0, 0, bytes)
		}
	case "same-rail":
		for r := 0; r < ranks; r++ {
			add(r, r, 0, bytes)
		}
	case "all-to-all":
		per := bytes / uint64(ranks-1)
		if per == 0 {
			return nil, fmt.Errorf("--bytes %d too small for all-to-all over %d ranks", bytes, ranks)
		}
		for r := 0; r < ranks; r++ {
			src := uint64(0)
			for k := 0; k < ranks; k++ {
				if k == r {
					continue
				}
				add(r, k, src, per)
				src += per
			}
		}
	default:
		return nil, patternError(pattern)
	}
	sort.SliceStable(l.Transfers, func(i, j int) bool { return l.Transfers[i].Rank < l.Transfers[j].Rank })
	return l, nil
}

func (l *layout) ofRank(r int) []transfer {
	var out []transfer
	for _, t := range l.Transfers {
		if t.Rank == r {
			out = append(out, t)
		}
	}
	return out
}

func (l *layout) ofTarget(k int) []transfer {
	var out []transfer
	for _, t := range l.Transfers {
		if t.Target == k {
			out = append(out, t)
		}
	}
	return out
}

func (l *layout) sourceBytes(r int) uint64 {
	if l.KV != nil {
		return l.kvSourceBytes(r)
	}
	var n uint64
	for _, t := range l.ofRank(r) {
		n = max(n, t.Src+t.Len)
	}
	return n
}
