// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/pxn-project/pxn/internal/fakecuda"
	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
)

// gpuPair is a pair whose sender (engine a) copies its first hop with the
// GPU copier on the stand-in CUDA driver (internal/fakecuda), from a
// source in the driver's device memory, and whose driver counts its
// calls. The test's thread has the GPU's context current, as a CUDA
// application's thread has.
type gpuPair struct {
	*pair
	g     *gpu.GPU
	calls *fakecuda.Calls
	// lib is the stand-in driver's library.
	lib string
	// srcDev is the source allocation, srcLen bytes.
	srcDev uintptr
	srcLen int
}

func newGPUPair(tb testing.TB, o pairOpts) *gpuPair {
	tb.Helper()
	lib := os.Getenv(fakecuda.LibEnv)
	if lib == "" {
		lib = fakecuda.Build(tb, tb.TempDir(), "-O2")
	}
	gp := &gpuPair{calls: fakecuda.CountCalls(tb), lib: lib, srcLen: o.srcSize}
	d, err := cuda.LoadLibrary(lib)
	if err != nil {
		tb.Fatalf("LoadLibrary(%s): %v", lib, err)
	}
	tb.Cleanup(d.Close)
	if gp.g, err = gpu.Open(d, 0); err != nil {
		tb.Fatal(err)
	}
	runtime.LockOSThread()
	if err := d.CtxSetCurrent(gp.g.Context()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = d.CtxSetCurrent(0)
		runtime.UnlockOSThread()
		if err := gp.g.Close(); err != nil {
			tb.Error(err)
		}
	})
	src, err := d.MemAlloc(uint64(o.srcSize))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = d.MemFree(src) })
	gp.srcDev = uintptr(src)
	c, err := gpu.NewCopier(gp.g, gpu.CopierOptions{Logger: funcr.New(func(string, string) {}, funcr.Options{}), DrainTimeout: o.gpuDrain})
	if err != nil {
		tb.Fatal(err)
	}
	// The engine closes its copier; one that never opened closes here.
	opened := false
	tb.Cleanup(func() {
		if !opened {
			_ = c.Close()
		}
	})
	o.copierA = func(*cpucopy.HostCopier) relay.Copier { opened = true; return c }
	gp.pair = newPairTB(tb, o)
	return gp
}

// devSrc is the device address off bytes into the source allocation.
func (gp *gpuPair) devSrc(off int) uintptr { return gp.srcDev + uintptr(off) }

// driverCalls is the driver's call counts now.
func (gp *gpuPair) driverCalls(tb testing.TB) map[string]uint64 { return gp.calls.Counts(tb) }

// What one Submit asks of the driver on the GPU path, counted by the
// stand-in driver with the pumps stopped (run by hand after the count):
// the source's allocation classified once (cuPointerGetAttributes, its
// context already current: one cuCtxGetCurrent) and one source-ready
// event recorded (cuEventRecord, with its cuCtxGetCurrent), however many
// requests and blocks the Submit has; a Submit that stages nothing records
// no event.
func TestSubmitDriverCallsOnStandIn(t *testing.T) {
	const block = 16 << 10
	gp := newGPUPair(t, pairOpts{tgtSize: 256 * block, srcSize: 256 * block, manual: true})
	for !gp.a.HasRelay("rail1") {
		gp.a.RunRound()
		gp.b.RunRound()
	}
	staged := map[string]uint64{"cuCtxGetCurrent": 2, "cuPointerGetAttributes": 1, "cuEventRecord": 1}
	// In the test's goroutine, whose thread has the context current (a
	// subtest's would not).
	for _, tc := range []struct {
		name  string
		reqs  []relay.Request
		route relay.Route
		want  map[string]uint64
	}{
		{"one request", gpuRequests(gp, 1, block, block), relay.RoutePXN, staged},
		{"16 requests", gpuRequests(gp, 16, block, block), relay.RoutePXN, staged},
		{"256 requests", gpuRequests(gp, 256, block, block), relay.RoutePXN, staged},
		{"same rail", []relay.Request{{Op: relay.Write, Src: gp.devSrc(0), Len: block, Target: sessRail0, Dst: tgtBase}}, relay.RouteDirect,
			map[string]uint64{"cuCtxGetCurrent": 1, "cuPointerGetAttributes": 1}},
	} {
		before := gp.driverCalls(t)
		b, err := gp.a.Submit(tc.reqs)
		got := fakecuda.Since(before, gp.driverCalls(t))
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, tc.want) {
			t.Errorf("%s: Submit called the driver %v, want %v", tc.name, got, tc.want)
		}
		for !b.Done() {
			gp.a.RunRound()
			gp.b.RunRound()
		}
		for i := range tc.reqs {
			if st, _ := b.Status(i); st.State != relay.Completed || b.Route(i) != tc.route {
				t.Fatalf("%s: request %d: %+v, route %v, want completed by route %v", tc.name, i, st, b.Route(i), tc.route)
			}
		}
		_ = b.Release()
	}
}

// A first hop that never finishes (the caller's stream, which its source
// waits for, is wedged) neither hangs the engine's Close nor lets it
// unmap what the GPU may still write: Close returns, saying the copier did
// not drain, and the relay's lane is never released, so the sender keeps
// its claim and mappings.
func TestCloseKeepsTheLanesOfAWedgedFirstHop(t *testing.T) {
	const block = 16 << 10
	gp := newGPUPair(t, pairOpts{tgtSize: 4 * block, srcSize: 4 * block, manual: true, gpuDrain: 50 * time.Millisecond})
	for !gp.a.HasRelay("rail1") {
		gp.a.RunRound()
		gp.b.RunRound()
	}
	st, err := gp.g.Driver().StreamCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	// Never let go while the test runs: an old Close would go on, after
	// the driver is gone, where it hangs now.
	fakecuda.Stall(t, gp.lib, uintptr(st))
	released := make(chan struct{}, 16)
	gp.rankB.onRelease = func() { released <- struct{}{} }
	reqs := gpuRequests(gp, 4, block, block)
	for i := range reqs {
		reqs[i].Stream = uintptr(st)
	}
	b, err := gp.a.Submit(reqs)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		gp.a.RunRound()
		gp.b.RunRound()
	}
	if b.Done() {
		t.Fatal("the batch finished behind a wedged stream")
	}
	done := make(chan error, 1)
	go func() { done <- gp.a.Close(context.Background()) }()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("engine Close has not returned 10s after it was called with a first hop that cannot finish")
	}
	if !errors.Is(err, gpu.ErrNotDrained) {
		t.Fatalf("Close = %v, want an error saying the copier did not drain", err)
	}
	select {
	case <-released:
		t.Fatal("the sender released its lane of the relay while its first hop could still write it")
	default:
	}
	for i := range reqs {
		if s, _ := b.Status(i); s.State == relay.Completed {
			t.Errorf("request %d completed behind a wedged stream", i)
		}
	}
}
