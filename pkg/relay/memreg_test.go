// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// memGroup is an in-process stand-in for a registry group: each rank's
// control block and arena are anonymous shared mappings, laid out exactly as
// the real registry lays them out, so two engines in one test process run
// the real sender and relay pipelines against each other. Multi-process
// behaviour is tested with the real registry elsewhere.
type memGroup struct {
	t     testing.TB
	mu    sync.Mutex
	ranks []*memRank
	next  int
}

type memRank struct {
	g       *memGroup
	pid     int
	epoch   uint64
	rail    string
	hca     string
	ctlMem  []byte
	arena   []byte
	gone    atomic.Bool
	stale   atomic.Bool
	closing atomic.Bool
	claims  [staging.LaneCount]atomic.Int32
	in      [staging.LaneCount]*staging.RelayLane
	// peers is reused by Peers, as the real registry's adapter does: the
	// engine reads the slice only until its next call.
	peers []relay.Peer
	// beats counts the pump's Heartbeat calls.
	beats atomic.Uint64
}

func newMemGroup(t testing.TB) *memGroup { return &memGroup{t: t} }

func mapAnon(t testing.TB, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", n, err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

func (g *memGroup) add(rail, hca string) *memRank {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.next++
	r := &memRank{g: g, pid: 1000 + g.next, epoch: uint64(0x1000 + g.next), rail: rail, hca: hca}
	r.ctlMem = mapAnon(g.t, int(staging.ControlSize))
	r.arena = mapAnon(g.t, staging.ArenaSize)
	ctl := (*staging.ControlBlock)(unsafe.Pointer(&r.ctlMem[0]))
	for i := range r.claims {
		r.claims[i].Store(-1)
		r.in[i] = staging.NewRelayLane(&ctl.Lanes[i])
	}
	g.ranks = append(g.ranks, r)
	return r
}

func (r *memRank) lane(i int) *staging.Lane {
	return &(*staging.ControlBlock)(unsafe.Pointer(&r.ctlMem[0])).Lanes[i]
}

func (r *memRank) Inbound(i int) *staging.RelayLane { return r.in[i] }

func (r *memRank) ArenaBase() uintptr { return uintptr(unsafe.Pointer(&r.arena[0])) }

func (r *memRank) Heartbeat(time.Time) { r.beats.Add(1) }

func (r *memRank) stats() *staging.RankStats {
	return &(*staging.ControlBlock)(unsafe.Pointer(&r.ctlMem[0])).Stats
}

// PublishStats writes the counters block of the rank's control block, as
// the real registry does.
func (r *memRank) PublishStats(st *staging.RankStats) { r.stats().Publish(st) }

// published reads what the pump last published.
func (r *memRank) published() (staging.RankStats, bool) {
	var st staging.RankStats
	return st, r.stats().Load(&st)
}

func (r *memRank) Wake() *staging.WakeWord {
	return &(*staging.ControlBlock)(unsafe.Pointer(&r.ctlMem[0])).Header.Wake
}

func (r *memRank) Peers() ([]relay.Peer, error) {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	out := r.peers[:0]
	for _, o := range r.g.ranks {
		if o == r {
			continue
		}
		if o.gone.Load() || o.stale.Load() {
			continue
		}
		out = append(out, relay.Peer{Pid: o.pid, Epoch: o.epoch, Rail: o.rail, HCA: o.hca})
	}
	r.peers = out
	if len(out) > staging.LaneCount {
		return nil, relay.ErrTooManyPeers
	}
	return out, nil
}

var laneEpochs atomic.Uint64

func (r *memRank) Attach(p relay.Peer) (relay.Link, error) {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	var relayRank *memRank
	for _, o := range r.g.ranks {
		if o.pid == p.Pid && o.epoch == p.Epoch {
			relayRank = o
		}
	}
	if relayRank == nil || relayRank.gone.Load() {
		return nil, errors.New("relay not found")
	}
	for i := range relayRank.claims {
		if relayRank.claims[i].CompareAndSwap(-1, int32(r.pid)) {
			lane := relayRank.lane(i)
			epoch := laneEpochs.Add(1)
			lane.Claim(staging.Identity{Pid: r.pid, Epoch: r.epoch}, staging.PidNS{}, epoch, 0)
			tx, err := staging.NewSenderLane(lane, epoch)
			if err != nil {
				return nil, err
			}
			return &memLink{relay: relayRank, index: i, lane: lane, tx: tx}, nil
		}
	}
	return nil, errors.New("no free lane")
}

func (r *memRank) BeginClose() { r.closing.Store(true) }

// Leased is false: the in-memory group's tests that close a relay under
// load run in real processes, over the real registry.
func (r *memRank) Leased() bool { return false }

func (r *memRank) Close(context.Context) error { return nil }

type memLink struct {
	relay *memRank
	index int
	lane  *staging.Lane
	tx    *staging.SenderLane
}

func (l *memLink) Sender() *staging.SenderLane { return l.tx }
func (l *memLink) LaneIndex() int              { return l.index }
func (l *memLink) Staging() uintptr {
	return l.relay.ArenaBase() + uintptr(staging.LaneOffset(l.index))
}
func (l *memLink) Health(time.Time) relay.Health {
	switch {
	case l.relay.gone.Load():
		return relay.Gone
	case l.relay.stale.Load():
		return relay.Stale
	case l.relay.closing.Load():
		return relay.Closing
	}
	return relay.Live
}

func (l *memLink) Wake() *staging.WakeWord { return l.relay.Wake() }

func (l *memLink) Close() error {
	l.lane.Free()
	l.relay.claims[l.index].Store(-1)
	return nil
}
