// SPDX-License-Identifier: Apache-2.0

package cpucopy

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
)

const benchPiece = 8 << 20

// waitBell waits, like the pump, until the doorbell shows at least seq.
func waitBell(bell *uint64, seq uint64) {
	for int64(atomic.LoadUint64(bell)-seq) < 0 {
		time.Sleep(50 * time.Microsecond)
	}
}

func gbps(bytes uint64, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e9 }

// BenchmarkHostCopier8MiB runs b.N 8 MiB copies through a lane, pipelined up
// to the lane depth, then b.N plain copy() calls of the same buffers, and
// reports both rates and their ratio.
func BenchmarkHostCopier8MiB(b *testing.B) {
	src, dst := mapped(b, benchPiece), mapped(b, benchPiece)
	fill(src, 1)
	c := NewHostCopier(HostCopierOptions{})
	defer c.Close()
	var bell uint64
	entries := []relay.CopyEntry{{Src: addr(src), Dst: addr(dst), Len: benchPiece}}
	// Start the lane outside the measurement.
	if err := c.Copy(0, 0, entries, &bell, 1); err != nil {
		b.Fatal(err)
	}
	waitBell(&bell, 1)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		seq := uint64(i) + 2
		waitBell(&bell, seq-LaneQueueDepth)
		if err := c.Copy(0, 0, entries, &bell, seq); err != nil {
			b.Fatal(err)
		}
	}
	waitBell(&bell, uint64(b.N)+1)
	copier := time.Since(start)
	start = time.Now()
	for range b.N {
		copy(dst, src)
	}
	plain := time.Since(start)
	b.StopTimer()
	total := uint64(b.N) * benchPiece
	b.ReportMetric(gbps(total, copier), "copier-GB/s")
	b.ReportMetric(gbps(total, plain), "copy-GB/s")
	b.ReportMetric(plain.Seconds()/copier.Seconds(), "copier/copy")
}

// BenchmarkHostCopierCallerPath is what the caller's thread does per Piece:
// classify the source, record its ready event; then the pump queries and
// releases it. It must not allocate.
func BenchmarkHostCopierCallerPath(b *testing.B) {
	c := NewHostCopier(HostCopierOptions{})
	defer c.Close()
	for i := range 16 {
		if err := c.RegisterDevice(uintptr(1<<40+i<<32), 1<<30); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if c.Classify(1<<40+7<<32+4096, benchPiece) != relay.Device {
			b.Fatal("not device")
		}
		ev, err := c.RecordReady(0)
		if err != nil {
			b.Fatal(err)
		}
		if done, err := c.Query(ev); !done || err != nil {
			b.Fatal(done, err)
		}
		c.Release(ev)
	}
}

// BenchmarkHostCopierHeldPath runs the held cycle of one Piece: record
// a held event, enqueue a copy behind it, release it, forget it and wait for
// the doorbell.
func BenchmarkHostCopierHeldPath(b *testing.B) {
	c := newSimCopier(true)
	defer c.Close()
	src, dst := mapped(b, 64), mapped(b, 64)
	entries := []relay.CopyEntry{{Src: addr(src), Dst: addr(dst), Len: 64}}
	var bell uint64
	seq := uint64(0)
	cycle := func() {
		seq++
		ev, err := c.RecordReady(0)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Copy(0, ev, entries, &bell, seq); err != nil {
			b.Fatal(err)
		}
		if err := c.ReleaseReady(ev); err != nil {
			b.Fatal(err)
		}
		c.Release(ev)
		for atomic.LoadUint64(&bell) != seq {
			runtime.Gosched()
		}
	}
	for range 2 * LaneQueueDepth {
		cycle()
	}
	b.ReportAllocs()
	for b.Loop() {
		cycle()
	}
}
