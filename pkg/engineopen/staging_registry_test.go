// SPDX-License-Identifier: Apache-2.0

package engineopen_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// stagingGroup registers n ranks of one new group in this process, in the
// real registry under /dev/shm; rank i is on rail i. Nobody beats: the
// heartbeat timeout is long.
func stagingGroup(tb testing.TB, n int) []*registry.Rank {
	tb.Helper()
	root, err := os.MkdirTemp("/dev/shm", "pxn-staging-registry-")
	if err != nil {
		tb.Skipf("no /dev/shm: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(root) })
	var ranks []*registry.Rank
	for i := 0; i < n; i++ {
		r, err := registry.Register(context.Background(), registry.Options{
			Root: root, Group: "g", UID: os.Geteuid(),
			Rail: fmt.Sprintf("rail%d", i), HCA: fmt.Sprintf("hca%d", i),
			HeartbeatTimeout: time.Hour,
		})
		if err != nil {
			tb.Fatalf("register rank %d: %v", i, err)
		}
		tb.Cleanup(func() { r.Close(context.Background()) })
		ranks = append(ranks, r)
	}
	return ranks
}

// wantPeers checks ps against ranks, in any order.
func wantPeers(t *testing.T, ps []relay.Peer, ranks []*registry.Rank) {
	t.Helper()
	var want, got []string
	for i, r := range ranks {
		want = append(want, fmt.Sprintf("%d/%x/rail%d/hca%d", r.Identity().Pid, r.Identity().Epoch, i+1, i+1))
	}
	for _, p := range ps {
		got = append(got, fmt.Sprintf("%d/%x/%s/%s", p.Pid, p.Epoch, p.Rail, p.HCA))
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("Peers = %v, want %v", got, want)
	}
}

func TestStagingRegistryPeersSteadyAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	ranks := stagingGroup(t, 4)
	s := engineopen.NewStagingRegistry(ranks[0])
	var ps []relay.Peer
	var err error
	call := func() {
		if ps, err = s.Peers(); err != nil {
			t.Fatalf("Peers: %v", err)
		}
	}
	call()
	wantPeers(t, ps, ranks[1:])
	if a := testing.AllocsPerRun(200, call); a != 0 {
		t.Errorf("Peers of an unchanged group: %v allocations per call, want 0", a)
	}
	wantPeers(t, ps, ranks[1:])
}

func TestStagingRegistryAttachLeavesPeersAlone(t *testing.T) {
	ranks := stagingGroup(t, 3)
	s := engineopen.NewStagingRegistry(ranks[0])
	ps, err := s.Peers()
	if err != nil {
		t.Fatal(err)
	}
	before := slices.Clone(ps)
	// The pump attaches while it ranges over what Peers returned. An
	// attach that waits for the relay's arena descriptor is busy, and the
	// pump calls again at a later refresh.
	for _, p := range ps {
		var l relay.Link
		deadline := time.Now().Add(10 * time.Second) // generous: the relay answers from a goroutine of its own
		for {
			if l, err = s.Attach(p); !errors.Is(err, relay.ErrRegistryBusy) || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil {
			t.Fatalf("Attach(%+v): %v", p, err)
		}
		defer l.Close()
	}
	if !slices.Equal(ps, before) {
		t.Errorf("Attach changed the slice of Peers: %+v, was %+v", ps, before)
	}
}

func TestStagingRegistryTooManyPeers(t *testing.T) {
	ranks := stagingGroup(t, staging.LaneCount+2)
	s := engineopen.NewStagingRegistry(ranks[0])
	_, err := s.Peers()
	if !errors.Is(err, relay.ErrTooManyPeers) || !errors.Is(err, registry.ErrTooManyPeers) {
		t.Fatalf("Peers = %v, want %v wrapping %v", err, relay.ErrTooManyPeers, registry.ErrTooManyPeers)
	}
	ps, again := s.Peers()
	if ps != nil || again != err {
		t.Errorf("Peers again = %v, %v; want the same error", ps, again)
	}
	if !raceEnabled {
		if a := testing.AllocsPerRun(100, func() { s.Peers() }); a != 0 {
			t.Errorf("Peers with PXN off: %v allocations per call, want 0", a)
		}
	}
}

// BenchmarkPeersSteady is the pump's peer refresh in a full group (seven
// peers) that does not change.
func BenchmarkPeersSteady(b *testing.B) {
	ranks := stagingGroup(b, staging.LaneCount+1)
	s := engineopen.NewStagingRegistry(ranks[0])
	if ps, err := s.Peers(); err != nil || len(ps) != staging.LaneCount {
		b.Fatalf("Peers = %d peers, %v; want %d", len(ps), err, staging.LaneCount)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Peers(); err != nil {
			b.Fatal(err)
		}
	}
}
