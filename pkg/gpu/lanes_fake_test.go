// SPDX-License-Identifier: Apache-2.0

package gpu_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/fakecuda"
	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// openFakeVMM is device 0 of the stand-in driver with cuMemCreate and the
// rest of the virtual memory calls.
func openFakeVMM(t testing.TB) *gpu.GPU {
	t.Helper()
	t.Setenv(fakecuda.VMMEnv, "1")
	g := openFake(t, fakeLib(t), 13000)
	if err := g.Driver().FDShareSupport(g.Device()); err != nil {
		t.Fatalf("the stand-in driver with %s=1 cannot share by descriptor: %v", fakecuda.VMMEnv, err)
	}
	return g
}

// On the stand-in driver a descriptor arena is one allocation a lane,
// side by side: each lane is inside one allocation and the arena is not;
// each lane exports on its own, and a peer maps exactly that lane, one
// lane long, and reads the owner's bytes of it. What is not one of the
// driver's exports, a lane out of range and an allocation shorter than a
// lane are refused, naming the lane, and counted.
func TestLaneArenasOnStandIn(t *testing.T) {
	g := openFakeVMM(t)
	d := g.Driver()
	p := gpu.NewArenasWith(g, gpu.ArenaOptions{Share: gpu.ShareDescriptor})
	a, err := p.Allocate(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if share, why := p.Share(); share != gpu.ShareDescriptor {
		t.Fatalf("shares by %v (%s), want by descriptor", share, why)
	}
	la, ok := a.(staging.LaneFDArena)
	if !ok {
		t.Fatal("a descriptor arena hands out no lane")
	}
	if d.Classify(0, cuda.DevicePtr(a.Base()), a.Size()) == cuda.MemoryDevice {
		t.Error("the arena is one allocation, want one a lane")
	}
	for lane := range staging.LaneCount {
		base := cuda.DevicePtr(a.Base()) + cuda.DevicePtr(staging.LaneOffset(lane))
		if d.Classify(0, base, staging.LaneBytes) != cuda.MemoryDevice {
			t.Fatalf("lane %d is not inside one allocation", lane)
		}
		fill(t, g, base, uint32(0x1000+lane), 4096)
		fill(t, g, base+staging.LaneBytes-4096, uint32(0x2000+lane), 4096)
	}
	for lane := range staging.LaneCount {
		fd, err := la.ExportLaneFD(lane)
		if err != nil {
			t.Fatal(err)
		}
		flags, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		pl, err := p.OpenLaneFD(fd, lane)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		if flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("lane %d's descriptor is not close-on-exec", lane)
		}
		if pl.Lane() != lane || testtools.MappingSize(t, pl.Base()) != staging.LaneBytes {
			t.Errorf("lane %d mapped as lane %d over %d bytes, want %d", lane, pl.Lane(), testtools.MappingSize(t, pl.Base()), uint64(staging.LaneBytes))
		}
		expectWords(t, g, cuda.DevicePtr(pl.Base()), uint32(0x1000+lane), 4096)
		expectWords(t, g, cuda.DevicePtr(pl.Base())+staging.LaneBytes-4096, uint32(0x2000+lane), 4096)
		if err := pl.Close(); err != nil {
			t.Fatal(err)
		}
	}

	plain, err := unix.MemfdCreate("not-an-export", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(plain)
	if err := unix.Ftruncate(plain, staging.LaneBytes); err != nil {
		t.Fatal(err)
	}
	prop := cuda.AllocationProp{Device: g.Device()}
	var short int
	err = g.Do(func() error {
		h, err := d.MemCreate(2<<20, prop)
		if err != nil {
			return err
		}
		short, err = d.MemExportFD(h)
		return errors.Join(err, d.MemRelease(h))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(short)
	before := p.Counts()
	for _, tc := range []struct {
		name     string
		fd, lane int
		step     string
		is       error
	}{
		{"a memfd the driver did not export", plain, 1, "cuMemImportFromShareableHandle", gpu.ErrPeerArenaUnusable},
		{"an allocation shorter than a lane", short, 2, "cuMemMap", gpu.ErrPeerArenaUnusable},
		{"a lane out of range", plain, staging.LaneCount, "out of range", registry.ErrCorruptEntry},
	} {
		pl, err := p.OpenLaneFD(tc.fd, tc.lane)
		if err == nil {
			pl.Close()
			t.Errorf("%s: mapped", tc.name)
			continue
		}
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.step) || !strings.Contains(err.Error(), "lane "+strconv.Itoa(tc.lane)) {
			t.Errorf("%s: %v, want %v at %s naming lane %d", tc.name, err, tc.is, tc.step, tc.lane)
		}
	}
	if c := p.Counts(); c.FD != before.FD || c.FailedFD-before.FailedFD != 3 {
		t.Errorf("counts %+v after three refusals, from %+v", c, before)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := la.ExportLaneFD(0); err == nil {
		t.Error("ExportLaneFD of a closed arena succeeded")
	}
}

// allocationAt is the inode of the stand-in's allocation (a memfd) that
// is mapped at p in this process, read from its maps.
func allocationAt(t testing.TB, p uintptr) uint64 {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || uint64(p) < start || uint64(p) >= end {
			continue
		}
		ino, err := strconv.ParseUint(f[4], 10, 64)
		if err != nil || ino == 0 || !strings.HasPrefix(f[5], "/memfd:") {
			t.Fatalf("%#x is mapped by %q, not an allocation of the stand-in", p, line)
		}
		return ino
	}
	t.Fatalf("nothing is mapped at %#x", p)
	return 0
}

// A descriptor arena gives a lane new memory for each claim after the
// lane's first: the second holder of lane 0 imports another allocation
// than the first did, which the relay maps at the lane's place when it
// opens the claim's ring, and not before; the first holder's allocation
// then is nowhere in the relay's view, and what the second holder writes
// is what the relay reads.
func TestLaneArenaRenewsALaneOnStandIn(t *testing.T) {
	g := openFakeVMM(t)
	p := gpu.NewArenasWith(g, gpu.ArenaOptions{Share: gpu.ShareDescriptor, Logger: logr.Discard()})
	root := t.TempDir()
	register := func(rail string) *registry.Rank { return registerGPURank(t, root, p, rail) }
	relay, first, second := register("rail0"), register("rail1"), register("rail2")
	ctx := context.Background()
	attach := func(r *registry.Rank) *registry.PeerLink {
		t.Helper()
		ps, err := r.Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, pr := range ps {
			if pr.Identity == relay.Identity() {
				l, err := r.Attach(ctx, pr)
				if err != nil {
					t.Fatal(err)
				}
				if l.LaneIndex() != 0 || l.ArenaShare() != staging.ShareLaneFD {
					t.Fatalf("attached to lane %d by share %d, want lane 0 by descriptor", l.LaneIndex(), l.ArenaShare())
				}
				return l
			}
		}
		t.Fatal("the relay is not among the peers")
		return nil
	}
	open := func() {
		t.Helper()
		relay.Inbound(0).Sync()
		if err := relay.Inbound(0).Open(); err != nil {
			t.Fatal(err)
		}
	}
	lane0 := relay.Arena().Base() + uintptr(staging.LaneOffset(0))
	l1 := attach(first)
	open()
	a1 := allocationAt(t, l1.StagingBase())
	if got := allocationAt(t, lane0); got != a1 {
		t.Fatalf("the first holder maps allocation %d, the relay's lane 0 is %d: want the lane's first memory", a1, got)
	}
	fill(t, g, cuda.DevicePtr(l1.StagingBase()), 0x1111, 4096)
	expectWords(t, g, cuda.DevicePtr(lane0), 0x1111, 4096)
	if err := l1.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(relay.Leases()) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the relay never saw the first holder's release")
		}
		time.Sleep(time.Millisecond)
	}

	l2 := attach(second)
	a2 := allocationAt(t, l2.StagingBase())
	if a2 == a1 {
		t.Fatalf("the second holder of lane 0 imported allocation %d, the first holder's", a2)
	}
	if got := allocationAt(t, lane0); got != a1 {
		t.Errorf("the relay's lane 0 is allocation %d before the claim's ring opened, want %d, the lane's memory before", got, a1)
	}
	open()
	if got := allocationAt(t, lane0); got != a2 {
		t.Errorf("the relay's lane 0 is allocation %d once the ring opened, want %d, the second holder's", got, a2)
	}
	fill(t, g, cuda.DevicePtr(l2.StagingBase()), 0x2222, 4096)
	expectWords(t, g, cuda.DevicePtr(lane0), 0x2222, 4096)
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkLeaseGPULaneStandIn is what one lease on a relay's descriptor
// arena costs on the stand-in driver: the claim (from the second on, the
// relay's new allocation for the lane and its export), the arena socket's
// round trip for the lane's descriptor, its import, reservation, mapping
// and access; the relay's renewal of the lane when it opens the claim's
// ring (unmap, release, map, access: renew-ns/op); a first write into
// each slot; and the release with its unmap, until the relay has seen it.
// The stand-in's calls are system calls on a memfd: the figure
// on a GPU, where import and map are driver work, is
// BenchmarkLeaseGPULane's, which needs a GPU.
func BenchmarkLeaseGPULaneStandIn(b *testing.B) { benchLease(b, openFakeVMM(b)) }

// BenchmarkLeaseGPULane is BenchmarkLeaseGPULaneStandIn on the GPU.
func BenchmarkLeaseGPULane(b *testing.B) {
	g := openGPU(b)
	if err := g.Driver().FDShareSupport(g.Device()); err != nil {
		b.Skipf("skipping: %v", err)
	}
	benchLease(b, g)
}

func benchLease(b *testing.B, g *gpu.GPU) {
	p := gpu.NewArenasWith(g, gpu.ArenaOptions{Share: gpu.ShareDescriptor, Logger: logr.Discard()})
	root := b.TempDir()
	register := func(rail string) *registry.Rank { return registerGPURank(b, root, p, rail) }
	relay, sender := register("rail0"), register("rail1")
	peers, err := sender.Peers(context.Background())
	if err != nil || len(peers) != 1 || peers[0].Identity != relay.Identity() {
		b.Fatalf("peers %+v, %v; want the relay", peers, err)
	}
	ctx := context.Background()
	var attach, renew, write, release, freed time.Duration
	b.ReportAllocs()
	for b.Loop() {
		ta := time.Now()
		l, err := sender.Attach(ctx, peers[0])
		if err != nil {
			b.Fatal(err)
		}
		attach += time.Since(ta)
		if l.ArenaShare() != staging.ShareLaneFD {
			b.Fatalf("attached by share %d", l.ArenaShare())
		}
		t0 := time.Now()
		rx := relay.Inbound(l.LaneIndex())
		rx.Sync()
		if err := rx.Open(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		renew += t1.Sub(t0)
		for s := range staging.SlotsPerLane {
			if err := g.Driver().MemsetD32Async(cuda.DevicePtr(l.StagingBase())+cuda.DevicePtr(s*staging.SlotSize), uint32(s), 1, 0); err != nil {
				b.Fatal(err)
			}
		}
		t2 := time.Now()
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		for deadline := t3.Add(10 * time.Second); len(relay.Leases()) > 0; {
			if time.Now().After(deadline) {
				b.Fatal("the relay never saw the release")
			}
			runtime.Gosched()
		}
		write, release, freed = write+t2.Sub(t1), release+t3.Sub(t2), freed+time.Since(t3)
	}
	n := float64(b.N)
	for _, m := range []struct {
		d    time.Duration
		unit string
	}{{attach, "attach-ns/op"}, {renew, "renew-ns/op"}, {write, "first-writes-ns/op"}, {release, "close-ns/op"}, {freed, "freed-ns/op"}} {
		b.ReportMetric(float64(m.d.Nanoseconds())/n, m.unit)
	}
}

// registerGPURank registers a rank of group "gpu" on rail in root, with
// the GPU arenas p, closed when the test ends.
func registerGPURank(tb testing.TB, root string, p staging.ArenaProvider, rail string) *registry.Rank {
	tb.Helper()
	r, err := registry.Register(context.Background(), registry.Options{Root: root, Group: "gpu", UID: os.Geteuid(), Rail: rail, HCA: "hca-" + rail,
		Arenas: p, HeartbeatTimeout: time.Minute, Logger: logr.Discard()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close(context.Background()) })
	return r
}
