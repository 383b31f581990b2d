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
// control block, arena and each claim's blocks are anonymous shared
// mappings, laid out exactly as the real registry lays them out, and each
// claim has its eventfd, so two engines in one test process run the real
// sender and relay pipelines against each other. Multi-process behaviour is
// tested with the real registry elsewhere.
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
	waiter  *staging.EventWaiter
	// words are each lane's current claim's blocks, for tests that look
	// at them.
	words [staging.LaneCount]atomic.Pointer[staging.LaneWords]
	// peers is reused by Peers, as the real registry's adapter does: the
	// engine reads the slice only until its next call.
	peers []relay.Peer
	// beats counts the pump's Heartbeat calls.
	beats atomic.Uint64
	// onRelease, when set, runs after a holder released its claim of one
	// of r's lanes and unmapped its blocks.
	onRelease func()
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
	for i := range r.claims {
		r.claims[i].Store(-1)
		r.in[i] = staging.NewRelayLane()
	}
	w, err := staging.NewEventWaiter(&r.in)
	if err != nil {
		g.t.Fatal(err)
	}
	r.waiter = w
	g.t.Cleanup(func() { w.Close() })
	g.ranks = append(g.ranks, r)
	return r
}

func (r *memRank) ctl() *staging.ControlBlock {
	return (*staging.ControlBlock)(unsafe.Pointer(&r.ctlMem[0]))
}

// memLaneView is a lane's current claim as the test sees it: the words
// of both blocks, and the summary.
type memLaneView struct {
	*staging.LaneSenderBlock
	*staging.LaneRelayBlock
	summary *staging.LaneSummary
}

// State is the summary with the claim's progress copied in, as the
// relay's heartbeat does.
func (v memLaneView) State() staging.LaneState {
	v.summary.CopyProgress(v.LaneSenderBlock, v.LaneRelayBlock)
	return v.summary.State()
}

func (r *memRank) lane(i int) memLaneView {
	w := r.words[i].Load()
	if w == nil {
		return memLaneView{LaneSenderBlock: new(staging.LaneSenderBlock), LaneRelayBlock: new(staging.LaneRelayBlock), summary: &r.ctl().Lanes[i]}
	}
	return memLaneView{LaneSenderBlock: w.Sender, LaneRelayBlock: w.Relay, summary: &r.ctl().Lanes[i]}
}

// claim gives lane i of r to owner under epoch, with new blocks and a new
// eventfd, as the registry does; it returns the holder's endpoint, its
// wake of r and what undoes the holder's side. Relay and holder map the
// blocks apart, as two processes do: each side's mapping lives as long
// as that side needs it (the relay's until its endpoint frees the words).
func (r *memRank) claim(i int, owner staging.Identity, epoch uint64) (*staging.SenderLane, *staging.LaneWaker, func()) {
	t := r.g.t
	mapTwice := func(name string, size int) (relayMem, holderMem []byte) {
		fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			t.Fatal(err)
		}
		for _, m := range []*[]byte{&relayMem, &holderMem} {
			if *m, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
				t.Fatal(err)
			}
		}
		return relayMem, holderMem
	}
	sb, hsb := mapTwice("sender-block", int(staging.SenderBlockSize))
	rb, hrb := mapTwice("relay-block", int(staging.RelayBlockSize))
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	held, err := unix.Dup(ev)
	if err != nil {
		t.Fatal(err)
	}
	w := &staging.LaneWords{
		Epoch:  epoch,
		Sender: (*staging.LaneSenderBlock)(unsafe.Pointer(&sb[0])),
		Relay:  (*staging.LaneRelayBlock)(unsafe.Pointer(&rb[0])),
		WakeFD: ev,
		Free: func() {
			unix.Close(ev)
			unix.Munmap(sb)
			unix.Munmap(rb)
		},
	}
	w.Relay.Wake.Sleeping = 1
	r.ctl().Lanes[i].Claim(owner, staging.PidNS{}, epoch, 0)
	r.words[i].Store(w)
	r.in[i].Offer(w)
	r.waiter.WakeAlways()
	tx, err := staging.NewSenderLane((*staging.LaneSenderBlock)(unsafe.Pointer(&hsb[0])), (*staging.LaneRelayBlock)(unsafe.Pointer(&hrb[0])), epoch)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return tx, staging.NewLaneWaker(tx, held), func() {
		once.Do(func() {
			unix.Close(held)
			unix.Munmap(hsb)
			unix.Munmap(hrb)
		})
	}
}

// free ends lane i's claim, as the end of its lease does.
func (r *memRank) free(i int) {
	r.ctl().Lanes[i].Free()
	r.in[i].Withdraw()
}

func (r *memRank) Inbound(i int) *staging.RelayLane { return r.in[i] }

func (r *memRank) ArenaBase() uintptr { return uintptr(unsafe.Pointer(&r.arena[0])) }

func (r *memRank) Heartbeat(time.Time) { r.beats.Add(1) }

func (r *memRank) stats() *staging.RankStats { return &r.ctl().Stats }

// PublishStats writes the counters block of the rank's control block, as
// the real registry does.
func (r *memRank) PublishStats(st *staging.RankStats) { r.stats().Publish(st) }

// published reads what the pump last published.
func (r *memRank) published() (staging.RankStats, bool) {
	var st staging.RankStats
	return st, r.stats().Load(&st)
}

func (r *memRank) Wake() relay.Waiter { return r.waiter }

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
			tx, waker, closeWake := relayRank.claim(i, staging.Identity{Pid: r.pid, Epoch: r.epoch}, laneEpochs.Add(1))
			return &memLink{relay: relayRank, index: i, tx: tx, waker: waker, closeWake: closeWake}, nil
		}
	}
	return nil, errors.New("no free lane")
}

func (r *memRank) BeginClose() { r.closing.Store(true) }

// Leased is false: the in-memory group's tests that close a relay under
// load run in real processes, over the real registry.
func (r *memRank) Leased() bool { return false }

// Close frees the lanes' blocks; the engine has stopped its pump.
func (r *memRank) Close(context.Context) error {
	for _, l := range r.in {
		l.Release()
	}
	return nil
}

type memLink struct {
	relay     *memRank
	index     int
	tx        *staging.SenderLane
	waker     *staging.LaneWaker
	closeWake func()
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

func (l *memLink) Wake() relay.Waker { return l.waker }

func (l *memLink) Close() error {
	l.relay.free(l.index)
	l.closeWake()
	l.relay.claims[l.index].Store(-1)
	if l.relay.onRelease != nil {
		l.relay.onRelease()
	}
	return nil
}
