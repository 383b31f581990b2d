// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"os"
	"runtime"
	"testing"

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
	gp := &gpuPair{calls: fakecuda.CountCalls(tb), srcLen: o.srcSize}
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
	c, err := gpu.NewCopier(gp.g, gpu.CopierOptions{Logger: funcr.New(func(string, string) {}, funcr.Options{})})
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
