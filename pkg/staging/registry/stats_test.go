// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// inspectRank returns the report of rank r under root.
func inspectedRank(t *testing.T, root string, r *Rank) inspect.RankReport {
	t.Helper()
	groups, err := inspect.Root(root, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		for _, rr := range g.Ranks {
			if rr.File == r.Name() {
				return rr
			}
		}
	}
	t.Fatalf("inspect does not list rank %s: %+v", r.Name(), groups)
	return inspect.RankReport{}
}

func TestPublishedStatsAreInspected(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "stats", "rail0"))
	o := regOptions(root, "stats", "rail1")
	o.Device = "0000:18:00.0"
	sender := mustRegister(t, o)

	rr := inspectedRank(t, root, relay)
	if rr.Stats == nil || rr.StatsError != "" {
		t.Fatalf("stats %+v, error %q", rr.Stats, rr.StatsError)
	}
	if rr.Stats.Device != "host" || rr.Stats.Published {
		t.Errorf("before any publish: device %q, published %v; want host and not yet", rr.Stats.Device, rr.Stats.Published)
	}
	if d := inspectedRank(t, root, sender).Stats.Device; d != "0000:18:00.0" {
		t.Errorf("sender device %q, want the one it registered with", d)
	}

	peers, err := sender.Peers(context.Background())
	if err != nil || len(peers) != 1 {
		t.Fatalf("Peers = %v, %v", peers, err)
	}
	if _, err := sender.Attach(context.Background(), peers[0]); err != nil {
		t.Fatal(err)
	}
	st := staging.RankStats{ForwardedBytes: 3 << 20, ForwardedPieces: 3, DirectBytes: 12, InvalidDescs: 1, PumpCPUNanos: 2_500_000, OutboundLanes: 2, InboundLanes: 6}
	st.FallbackBytes[staging.FallbackRelayStale], st.FallbackPieces[staging.FallbackRelayStale] = 64<<10, 1
	now := staging.MonoNanos()
	relay.PublishStats(&st, now)

	rr = inspectedRank(t, root, relay)
	s := rr.Stats
	if s == nil {
		t.Fatalf("no stats after a publish: %q", rr.StatsError)
	}
	if !s.Published || s.ForwardedBytes != 3<<20 || s.ForwardedPieces != 3 || s.DirectBytes != 12 || s.InvalidDescs != 1 ||
		s.PumpCPU != 2500*time.Microsecond || s.OutboundLanes != 2 {
		t.Errorf("inspected %+v after publishing %+v", s, st)
	}
	if s.InboundLanes != 1 {
		t.Errorf("inbound lanes %d, want the one the sender holds (the registry counts them, not the caller)", s.InboundLanes)
	}
	if s.FallbackPieces[staging.FallbackRelayStale] != 1 || s.FallbackBytes.Total() != 64<<10 {
		t.Errorf("fallbacks %v / %v", s.FallbackPieces, s.FallbackBytes)
	}
	if s.Age < 0 || s.Age > time.Minute {
		t.Errorf("age %v of a publish made just now", s.Age)
	}
	b, err := json.Marshal(rr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"relay_stale":1`) || !strings.Contains(string(b), `"device":"host"`) {
		t.Errorf("JSON report %s lacks the fallback split or the device", b)
	}
}

func TestRegisterRefusesALongDeviceName(t *testing.T) {
	o := regOptions(regTestRoot(t), "stats", "rail0")
	o.Device = strings.Repeat("g", 49)
	if _, err := Register(context.Background(), o); err == nil || !strings.Contains(err.Error(), o.Device) {
		t.Fatalf("Register with a 49-byte device: %v, want an error naming it", err)
	}
}

// A counters block whose generation stays odd (a writer that died in the
// middle, or a hostile one) is given up after a bounded wait; a corrupt
// device name is reported. Neither hides the rest of the report.
func TestStatsOfAHostileBlock(t *testing.T) {
	root := regTestRoot(t)
	r := mustRegister(t, regOptions(root, "stats", "rail0"))
	atomic.StoreUint64(&r.ctl.Stats.Gen, 7)
	r.flushControl()
	start := time.Now()
	rr := inspectedRank(t, root, r)
	if rr.Stats != nil || !strings.Contains(rr.StatsError, folder.ErrStatsBusy.Error()) {
		t.Errorf("odd generation: stats %+v error %q, want %v", rr.Stats, rr.StatsError, folder.ErrStatsBusy)
	}
	// Bounded: statsNaps naps; a minute means the reader never gave up.
	if took := time.Since(start); took > time.Minute {
		t.Errorf("reading an odd generation took %v", took)
	}
	if rr.Rail != "rail0" || len(rr.Lanes) != staging.LaneCount {
		t.Errorf("the rest of the report is missing: %+v", rr)
	}
	atomic.StoreUint64(&r.ctl.Stats.Gen, 8)
	r.ctl.Stats.DeviceLen = 200
	r.flushControl()
	rr = inspectedRank(t, root, r)
	if rr.Stats != nil || !strings.Contains(rr.StatsError, "device name length 200") {
		t.Errorf("corrupt device: stats %+v error %q", rr.Stats, rr.StatsError)
	}
}

// Every read of a block under concurrent publishes is one publish whole:
// the publisher writes every counter with the same value, so a copy that
// mixes two publishes shows two values.
func TestStatsReadsAreNeverTorn(t *testing.T) {
	root := regTestRoot(t)
	r := mustRegister(t, regOptions(root, "stats", "rail0"))
	fd, err := unix.Open(r.Dir()+"/"+r.Name(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var st staging.RankStats
		for v := uint64(1); ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			st = staging.RankStats{RelayedBytes: v, RelayedPieces: v, ForwardedBytes: v, ForwardedPieces: v, DirectBytes: v,
				FailedPieces: v, SecondHopFailures: v, InvalidDescs: v, CreditWaits: v, LaneQuarantines: v, PumpCPUNanos: v,
				OutboundLanes: uint32(v)}
			for i := range st.FallbackBytes {
				st.FallbackBytes[i], st.FallbackPieces[i] = v, v
			}
			r.ctl.Stats.Publish(&st)
			runtime.Gosched()
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	var busy int
	for range 2000 {
		st, err := folder.ReadStats(fd)
		if errors.Is(err, folder.ErrStatsBusy) {
			busy++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		v := st.RelayedBytes
		all := []uint64{st.RelayedPieces, st.ForwardedBytes, st.ForwardedPieces, st.DirectBytes, st.FailedPieces, st.SecondHopFailures,
			st.InvalidDescs, st.CreditWaits, st.LaneQuarantines, st.PumpCPUNanos, uint64(st.OutboundLanes)}
		all = append(append(all, st.FallbackBytes[:]...), st.FallbackPieces[:]...)
		for i, x := range all {
			if x != v && !(i == 10 && x == uint64(uint32(v))) {
				t.Fatalf("a torn read: relayed bytes %d, word %d holds %d (%+v)", v, i, x, st)
			}
		}
	}
	if busy == 2000 {
		t.Fatal("no read got through a busy publisher")
	}
}
