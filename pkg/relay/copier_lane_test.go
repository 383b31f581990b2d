// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/sim/fabric"
	"github.com/pxn-project/pxn/pkg/staging"
)

// laneRecorder is a host copier that remembers, for each first-hop copy,
// the copier lane it was given and the relay lane's doorbell region it
// rings.
type laneRecorder struct {
	*cpucopy.HostCopier
	mu sync.Mutex
	// byBell maps each relay lane (the first doorbell address seen in it)
	// to the copier lanes its copies were given.
	byBell map[uintptr][]int
}

func (r *laneRecorder) Copy(lane int, ready relay.Event, entries []relay.CopyEntry, doorbell *uint64, seq uint64) error {
	r.mu.Lock()
	// A lane's ready words lie within a few hundred bytes of each other,
	// and different relays' control blocks are mappings of their own,
	// megabytes apart: a doorbell within a page of a known one rings the
	// same relay lane.
	bell := uintptr(unsafe.Pointer(doorbell))
	for k := range r.byBell {
		if bell-k < 4096 || k-bell < 4096 {
			bell = k
			break
		}
	}
	if !slices.Contains(r.byBell[bell], lane) {
		r.byBell[bell] = append(r.byBell[bell], lane)
	}
	r.mu.Unlock()
	return r.HostCopier.Copy(lane, ready, entries, doorbell, seq)
}

// TestOutboundLanesUseCopierLanesOfTheirOwn: a rank that sends through two
// relays, each of which gave it the same inbound lane index, copies into
// each on a copier lane of its own. On GPUs a copier lane is two streams
// and a gather plan per slot; two outbound lanes on one copier lane refused
// each other's Pieces ("gather plan still in use") and sent them direct.
func TestOutboundLanesUseCopierLanesOfTheirOwn(t *testing.T) {
	rails := map[string]string{
		"mlx5_0": "rail0", "mlx5_1": "rail1", "mlx5_2": "rail2",
		"rmlx5_1": "rail1", "rmlx5_2": "rail2",
	}
	cfg := enabledConfig()
	cfg.RailMap = rails
	g := newMemGroup(t)
	const size = 4 * staging.SlotSize
	tgt := map[string][]byte{"target-rail1": mapAnon(t, size), "target-rail2": mapAnon(t, size)}
	// Every engine closes before any rank's memory is unmapped (the
	// cleanups of mapAnon): each holds lanes in the others' control blocks.
	var engines []*relay.Engine
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, e := range engines {
			_ = e.Close(ctx)
		}
	}()
	open := func(rail, hca string, cop relay.Copier) *relay.Engine {
		hop := fabric.NewLoopback(fabric.LoopbackOptions{})
		for sess, thca := range map[string]string{"target-rail1": "rmlx5_1", "target-rail2": "rmlx5_2"} {
			if err := hop.AddTarget(sess, thca, tgt[sess], tgtBase); err != nil {
				t.Fatal(err)
			}
		}
		e, err := relay.Open(cfg, relay.Deps{Hop: hop, Directory: hop, Copier: cop, Registry: g.add(rail, hca), LocalHCA: hca})
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
		return e
	}
	// The two relays claim a lane on each other first, so the sender
	// that comes last is the second claimant on both: lane 1 at each.
	b := open("rail1", "mlx5_1", cpucopy.NewHostCopier(cpucopy.HostCopierOptions{}))
	c := open("rail2", "mlx5_2", cpucopy.NewHostCopier(cpucopy.HostCopierOptions{}))
	waitFor(t, "the relays' lanes on each other", func() bool { return b.HasRelay("rail2") && c.HasRelay("rail1") })

	src := mapAnon(t, size)
	fillPattern(src, 7)
	rec := &laneRecorder{HostCopier: cpucopy.NewHostCopier(cpucopy.HostCopierOptions{}), byBell: map[uintptr][]int{}}
	if err := rec.RegisterDevice(uintptr(unsafe.Pointer(&src[0])), size); err != nil {
		t.Fatal(err)
	}
	a := open("rail0", "mlx5_0", rec)
	waitFor(t, "routes to rail1 and rail2", func() bool { return a.HasRelay("rail1") && a.HasRelay("rail2") })

	// Several Pieces to each relay, interleaved, so both lanes have copies
	// in flight at once.
	const piece = staging.SlotSize
	var reqs []relay.Request
	for i := range 4 {
		for _, sess := range []string{"target-rail1", "target-rail2"} {
			off := uint64(i * piece)
			reqs = append(reqs, relay.Request{Op: relay.Write, Src: uintptr(unsafe.Pointer(&src[0])) + uintptr(off), Len: piece, Target: sess, Dst: tgtBase + off})
		}
	}
	bt, err := a.Submit(reqs)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the writes", bt.Done)
	for i := range reqs {
		if st, _ := bt.Status(i); st.State != relay.Completed || bt.Route(i) != relay.RoutePXN {
			t.Fatalf("request %d: %+v, route %v; want completed through a relay", i, st, bt.Route(i))
		}
	}
	for sess, buf := range tgt {
		if !slices.Equal(buf[:4*piece], src[:4*piece]) {
			t.Fatalf("%s: bytes differ from the source", sess)
		}
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.byBell) != 2 {
		t.Fatalf("copies rang %d relay lanes, want 2 (one a relay): %v", len(rec.byBell), rec.byBell)
	}
	seen := map[int]bool{}
	for bell, lanes := range rec.byBell {
		if len(lanes) != 1 {
			t.Errorf("relay lane at %#x: copies on copier lanes %v, want one", bell, lanes)
		}
		for _, l := range lanes {
			if seen[l] {
				t.Errorf("copier lane %d carries copies into both relays (%v)", l, rec.byBell)
			}
			seen[l] = true
		}
	}
}
