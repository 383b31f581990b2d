// SPDX-License-Identifier: Apache-2.0

package gpunic_test

import (
	"errors"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/sim/gpunic"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// BenchmarkNICWrite10KiB times one 10 KiB write from Submit to its
// completion, polled without sleeping, into another process's buffer (on
// GPU 0, or the GPU PXN_GPUNIC_TARGET_GPU names), alone and with a
// neighbour process keeping the GPU busy, beside a plain cuMemcpyAsync
// into this process's own memory with its event polled.
func BenchmarkNICWrite10KiB(b *testing.B) {
	g := openGPU(b)
	d := g.Driver()
	maps, _ := startTarget(b, g)
	src := alloc(b, g, 1<<20)
	own := alloc(b, g, 1<<20)
	report := func(b *testing.B, lat []float64) {
		slices.Sort(lat)
		b.ReportMetric(lat[len(lat)/2], "p50-µs")
		b.ReportMetric(lat[len(lat)*99/100], "p99-µs")
	}
	timeWrites := func(b *testing.B, nic *gpunic.NIC) {
		var out [4]relay.HopCompletion
		lat := make([]float64, 0, b.N)
		for i := 0; b.Loop(); i++ {
			t0 := time.Now()
			if err := nic.Submit([]relay.WriteOp{{Src: uintptr(src), Len: 10 << 10, Target: "t0", Dst: base, Token: uint64(i)}}); err != nil {
				b.Fatal(err)
			}
			for nic.Poll(out[:]) == 0 {
			}
			lat = append(lat, float64(time.Since(t0).Nanoseconds())/1e3)
			if out[0].Err != nil {
				b.Fatal(out[0].Err)
			}
		}
		report(b, lat)
	}
	for _, c := range []struct {
		name string
		opts gpunic.Options
	}{
		{"emulated NIC uncapped", gpunic.Options{}},
		{"emulated NIC at 50 GB/s", gpunic.Options{RateGBps: 50}},
	} {
		b.Run(c.name, func(b *testing.B) {
			nic, err := gpunic.New(g, maps, c.opts)
			if err != nil {
				b.Fatal(err)
			}
			defer nic.Close()
			timeWrites(b, nic)
		})
	}
	b.Run("emulated NIC uncapped, a busy neighbour process", func(b *testing.B) {
		startTarget(b, g, busyEnv+"=1")
		nic, err := gpunic.New(g, maps, gpunic.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer nic.Close()
		timeWrites(b, nic)
	})
	b.Run("cuMemcpyAsync within this process", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := d.CtxSetCurrent(g.Context()); err != nil {
			b.Fatal(err)
		}
		st, err := d.StreamCreate(cuda.StreamNonBlocking)
		if err != nil {
			b.Fatal(err)
		}
		defer d.StreamDestroy(st)
		ev, err := d.EventCreate(cuda.EventDisableTiming)
		if err != nil {
			b.Fatal(err)
		}
		defer d.EventDestroy(ev)
		lat := make([]float64, 0, b.N)
		for b.Loop() {
			t0 := time.Now()
			if err := d.MemcpyAsync(own, src, 10<<10, st); err != nil {
				b.Fatal(err)
			}
			if err := d.EventRecord(ev, st); err != nil {
				b.Fatal(err)
			}
			for {
				done, err := d.EventQuery(ev)
				if err != nil {
					b.Fatal(err)
				}
				if done {
					break
				}
			}
			lat = append(lat, float64(time.Since(t0).Nanoseconds())/1e3)
		}
		report(b, lat)
	})
}

// BenchmarkNICSmallOps sends scattered writes of one size through a NIC at
// R = 50 GB/s the way the engine does (Submits of 32 ops, as its direct
// path and pxn-bench's direct baseline post, or of one op of 8 MiB, or
// whole Pieces of up to 8 MiB and 4096 writes, a Poll after each) and
// reports the rate, its fraction of R and the writes per GPU operation.
// The sizes are every P14 block size (1 to 64 KiB, 18 KiB the one that is
// not a power of two), whose rows measure the engine only where the NIC
// alone reaches 0.95 of R, and 128 KiB and 8 MiB.
func BenchmarkNICSmallOps(b *testing.B) {
	g := openGPU(b)
	const targetLen = 64 << 20
	maps, _ := startTarget(b, g, targetLenEnv+"="+strconv.Itoa(targetLen))
	src := alloc(b, g, targetLen)
	for _, c := range []struct {
		name string
		size uint64
		opts gpunic.Options
		// piece, when set, sends Pieces through SubmitPiece: the writes
		// of one 8 MiB slot, at most staging.MaxPlans of them.
		piece bool
	}{
		{"1KiB auto", 1 << 10, gpunic.Options{}, false},
		{"1KiB Pieces of 4096", 1 << 10, gpunic.Options{}, true},
		{"2KiB auto", 2 << 10, gpunic.Options{}, false},
		{"2KiB Pieces of 4096", 2 << 10, gpunic.Options{}, true},
		{"4KiB auto", 4 << 10, gpunic.Options{}, false},
		{"8KiB auto", 8 << 10, gpunic.Options{}, false},
		{"16KiB auto", 16 << 10, gpunic.Options{}, false},
		{"16KiB Pieces of 512", 16 << 10, gpunic.Options{}, true},
		{"16KiB copy engines", 16 << 10, gpunic.Options{Copy: gpu.GatherCE}, false},
		{"18KiB auto", 18 << 10, gpunic.Options{}, false},
		{"18KiB Pieces of 455", 18 << 10, gpunic.Options{}, true},
		{"64KiB auto", 64 << 10, gpunic.Options{}, false},
		{"128KiB auto", 128 << 10, gpunic.Options{}, false},
		{"8MiB auto", 8 << 20, gpunic.Options{}, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			c.opts.RateGBps = 50
			nic, err := gpunic.New(g, maps, c.opts)
			if err != nil {
				b.Fatal(err)
			}
			defer nic.Close()
			ops, per := 32, uint64(1)
			switch {
			case c.piece:
				n := min(8<<20/c.size, staging.MaxPlans)
				ops, per = int(n), n
			case c.size >= 1<<20:
				ops = 1
			}
			slots := targetLen / c.size
			batch := make([]relay.WriteOp, ops)
			var out [256]relay.HopCompletion
			var sent, done uint64
			submit := func() error {
				for j := range batch {
					k := (sent + uint64(j)) * 7919 % slots
					batch[j] = relay.WriteOp{Src: uintptr(src) + uintptr(k*c.size), Len: c.size, Target: "t0", Dst: base + (slots-1-k)*c.size, Token: sent + uint64(j)}
				}
				if c.piece {
					return nic.SubmitPiece(batch, sent)
				}
				return nic.Submit(batch)
			}
			poll := func() {
				n := nic.Poll(out[:])
				for _, c := range out[:n] {
					if c.Err != nil {
						b.Fatal(c.Err)
					}
				}
				done += uint64(n) * per
			}
			start := time.Now()
			for b.Loop() {
				for {
					err := submit()
					if err == nil {
						sent += uint64(ops)
						break
					}
					if !errors.Is(err, relay.ErrHopBusy) {
						b.Fatal(err)
					}
					poll()
				}
				poll()
			}
			for done < sent {
				poll()
			}
			gbps := float64(sent*c.size) / time.Since(start).Seconds() / 1e9
			b.ReportMetric(gbps, "GB/s")
			b.ReportMetric(gbps/50, "of-R")
			b.ReportMetric(float64(sent)/float64(max(gpunic.Launches(nic), 1)), "writes/GPU-op")
		})
	}
}
