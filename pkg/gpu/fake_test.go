// SPDX-License-Identifier: Apache-2.0

package gpu_test

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/fakecuda"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// The copier's bookkeeping on the stand-in driver of pkg/cuda's tests,
// which runs on any machine: device memory is host memory and every call
// has completed when it returns. These tests judge what the copier counts,
// chooses, rings and refuses; when a GPU does the work, and in which order,
// the GPU tests beside them judge on a GPU.

func fakeLib(t testing.TB) string {
	t.Helper()
	if lib := os.Getenv(fakecuda.LibEnv); lib != "" {
		return lib
	}
	return fakecuda.Build(t, t.TempDir(), "-O2")
}

// openFake opens device 0 of the fake driver reporting version, with its
// context current on the test's locked thread.
func openFake(t testing.TB, lib string, version int) *gpu.GPU {
	t.Helper()
	t.Setenv(fakecuda.VersionEnv, strconv.Itoa(version))
	d, err := cuda.LoadLibrary(lib)
	if err != nil {
		t.Fatalf("LoadLibrary(%s): %v", lib, err)
	}
	t.Cleanup(d.Close)
	if d.Version() != version {
		t.Fatalf("fake driver reports version %d, want %d", d.Version(), version)
	}
	return openCurrent(t, d)
}

// piece is n entries of size bytes each, entry i from src+2*i*size to
// dst+i*size: a gather of every other block.
func piece(src, dst cuda.DevicePtr, n int, size uint64) []relay.CopyEntry {
	ents := make([]relay.CopyEntry, n)
	for i := range ents {
		ents[i] = relay.CopyEntry{Src: uintptr(src) + uintptr(2*uint64(i)*size), Dst: uintptr(dst) + uintptr(uint64(i)*size), Len: size}
	}
	return ents
}

// checkGathered fails unless dst holds, block by block, the src blocks piece
// names, and zero after them.
func checkGathered(t *testing.T, g *gpu.GPU, src, dst cuda.DevicePtr, n int, size uint64) {
	t.Helper()
	d := g.Driver()
	s := make([]byte, 2*uint64(n)*size)
	got := make([]byte, uint64(n+1)*size)
	if err := d.MemcpyDtoH(s, src); err != nil {
		t.Fatal(err)
	}
	if err := d.MemcpyDtoH(got, dst); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		want := s[2*uint64(i)*size : (2*uint64(i)+1)*size]
		if b := got[uint64(i)*size : uint64(i+1)*size]; string(b) != string(want) {
			t.Fatalf("block %d of the destination differs from block %d of the source", i, 2*i)
		}
	}
	for i, b := range got[uint64(n)*size:] {
		if b != 0 {
			t.Fatalf("byte %d after the gathered blocks is %#x, want 0", uint64(n)*size+uint64(i), b)
		}
	}
}

// pattern fills p with bytes that differ from block to block.
func pattern(t *testing.T, g *gpu.GPU, p cuda.DevicePtr, n int) {
	t.Helper()
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i/97 + i)
	}
	if err := g.Driver().MemcpyHtoD(p, b); err != nil {
		t.Fatal(err)
	}
}

func TestCopierOnFakeDriver(t *testing.T) {
	lib := fakeLib(t)
	const size = 4096

	t.Run("cpu doorbells ring on Poll", func(t *testing.T) {
		g := openFake(t, lib, 13000)
		c := newCopier(t, g, gpu.CopierOptions{Doorbell: gpu.DoorbellCPU, Copy: gpu.CopyPerEntry})
		if c.GPUDoorbell() || c.CopyMode() != cuda.CopyPerEntry || c.Gather().Mode != gpu.GatherCE {
			t.Fatalf("doorbell %q, copy %v, gather %v; want the CPU doorbell, per-entry copies and the copy engines as forced",
				c.Doorbell(), c.CopyMode(), c.Gather().Mode)
		}
		src, dst := alloc(t, g, 64*size), alloc(t, g, 64*size)
		pattern(t, g, src, 64*size)
		fill(t, g, dst, 0, 64*size)
		words := make([]uint64, 4)
		for i := range words {
			ents := piece(src+cuda.DevicePtr(8*i*size), dst+cuda.DevicePtr(4*i*size), 4, size)
			if err := c.Copy(2, 0, ents, &words[i], uint64(i+1)); err != nil {
				t.Fatalf("Copy seq %d: %v", i+1, err)
			}
		}
		st := c.Stats()
		if st.Copies != 4 || st.Bytes != 16*size || st.PendingDoorbells != 4 {
			t.Fatalf("after 4 Pieces of 4 entries: %+v, want 4 copies, %d bytes, 4 doorbells pending", st, 16*size)
		}
		for i, w := range words {
			if w != 0 {
				t.Fatalf("doorbell %d reads %d before Poll; the CPU path rings only in Poll", i, w)
			}
		}
		checkGathered(t, g, src, dst, 16, size)
		// The lane drains when Poll has rung its last doorbell, whatever
		// the words read.
		words[3] = 4
		if c.Drained(2) || !c.Drained(0) {
			t.Fatalf("Drained(2), Drained(0) = %v, %v before Poll; want false, true", c.Drained(2), c.Drained(0))
		}
		if rung, err := c.Poll(); rung != 4 || err != nil {
			t.Fatalf("Poll rang %d (%v), want 4", rung, err)
		}
		if !c.Drained(2) {
			t.Fatal("lane 2 not drained after Poll rang its doorbells")
		}
		for i, w := range words {
			if w != uint64(i+1) {
				t.Errorf("doorbell %d reads %d after Poll, want seq %d", i, w, i+1)
			}
		}
		if rung, err := c.Poll(); rung != 0 || err != nil || c.Stats().PendingDoorbells != 0 {
			t.Errorf("second Poll rang %d (%v), %d pending; want none", rung, err, c.Stats().PendingDoorbells)
		}
	})

	// Each lane stream holds PendingDepth doorbells and a lane's Pieces
	// alternate over its streams: a lane takes 2*PendingDepth Pieces before
	// Poll, other lanes are not held by it, and Poll frees them all.
	t.Run("a lane holds PendingDepth doorbells a stream", func(t *testing.T) {
		g := openFake(t, lib, 13000)
		c := newCopier(t, g, gpu.CopierOptions{Doorbell: gpu.DoorbellCPU, Copy: gpu.CopyPerEntry})
		src, dst := alloc(t, g, 2*size), alloc(t, g, 2*size)
		full := gpu.StreamsPerLane * gpu.PendingDepth
		words := make([]uint64, full+2)
		ents := piece(src, dst, 1, size)
		for seq := 1; seq <= full; seq++ {
			if err := c.Copy(0, 0, ents, &words[seq-1], uint64(seq)); err != nil {
				t.Fatalf("Copy seq %d of %d: %v", seq, full, err)
			}
		}
		err := c.Copy(0, 0, ents, &words[full], uint64(full+1))
		if !errors.Is(err, gpu.ErrLaneFull) {
			t.Fatalf("Copy %d on a lane holding %d doorbells: %v, want ErrLaneFull", full+1, full, err)
		}
		if err := c.Copy(1, 0, ents, &words[full+1], 1); err != nil {
			t.Fatalf("lane 1 refused while lane 0 was full: %v", err)
		}
		if st := c.Stats(); st.Copies != uint64(full+1) || st.PendingDoorbells != full+1 {
			t.Fatalf("%+v, want %d copies and %d doorbells pending (the refused Piece not counted)", st, full+1, full+1)
		}
		if words[full] != 0 {
			t.Fatalf("the refused Piece's doorbell reads %d", words[full])
		}
		if rung, err := c.Poll(); rung != full+1 || err != nil {
			t.Fatalf("Poll rang %d (%v), want %d", rung, err, full+1)
		}
		for seq := 1; seq <= full; seq++ {
			if words[seq-1] != uint64(seq) {
				t.Fatalf("doorbell of seq %d reads %d", seq, words[seq-1])
			}
		}
		if words[full] != 0 || words[full+1] != 1 {
			t.Fatalf("refused doorbell %d, lane 1's %d; want 0 and 1", words[full], words[full+1])
		}
		if err := c.Copy(0, 0, ents, &words[full], uint64(full+1)); err != nil {
			t.Fatalf("Copy after Poll emptied the lane: %v", err)
		}
	})

	// SM Pieces go to the gather kernel through a lane's plan slots; with
	// one gather stream they all take the lane's first stream, so the lane
	// fills at PendingDepth, with two at twice that, and the grid is halved.
	for _, tc := range []struct {
		streams, grid, full int
	}{
		{1, gpu.GatherMaxBlocks, gpu.PendingDepth},
		{2, gpu.GatherMaxBlocks / 2, 2 * gpu.PendingDepth},
	} {
		t.Run("gather on "+strconv.Itoa(tc.streams)+" streams", func(t *testing.T) {
			g := openFake(t, lib, 13000)
			c := newCopier(t, g, gpu.CopierOptions{Doorbell: gpu.DoorbellCPU, Gather: gpu.GatherSM, GatherStreams: tc.streams})
			info := c.Gather()
			if info.Mode != gpu.GatherSM || info.Streams != tc.streams || info.Grid != tc.grid || info.Block != gpu.GatherThreads {
				t.Fatalf("gather %+v, want SM on %d streams, a grid of %d blocks of %d threads", info, tc.streams, tc.grid, gpu.GatherThreads)
			}
			src, dst := alloc(t, g, 16*size), alloc(t, g, 16*size)
			pattern(t, g, src, 16*size)
			fill(t, g, dst, 0, 16*size)
			words := make([]uint64, tc.full+1)
			for seq := 1; seq <= tc.full; seq++ {
				if err := c.Copy(4, 0, piece(src, dst, 3, size), &words[seq-1], uint64(seq)); err != nil {
					t.Fatalf("Copy seq %d: %v", seq, err)
				}
			}
			if err := c.Copy(4, 0, piece(src, dst, 3, size), &words[tc.full], uint64(tc.full+1)); !errors.Is(err, gpu.ErrLaneFull) {
				t.Fatalf("Copy %d on %d gather streams: %v, want ErrLaneFull", tc.full+1, tc.streams, err)
			}
			if st := c.Stats(); st.SMPieces != uint64(tc.full) || st.Copies != uint64(tc.full) || st.Bytes != uint64(3*tc.full*size) {
				t.Fatalf("%+v, want %d SM Pieces of %d bytes", st, tc.full, 3*size)
			}
			checkGathered(t, g, src, dst, 3, size)
			if rung, err := c.Poll(); rung != tc.full || err != nil {
				t.Fatalf("Poll rang %d (%v), want %d", rung, err, tc.full)
			}
		})
	}

	t.Run("gpu doorbells need a registered range", func(t *testing.T) {
		g := openFake(t, lib, 13000)
		c := newCopier(t, g, gpu.CopierOptions{Doorbell: gpu.DoorbellGPU, Copy: gpu.CopyPerEntry})
		if !c.GPUDoorbell() {
			t.Fatalf("doorbell %q, want the GPU path as required", c.Doorbell())
		}
		src, dst := alloc(t, g, 2*size), alloc(t, g, 2*size)
		mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(mem)
		word := (*uint64)(unsafe.Pointer(&mem[128]))
		ents := piece(src, dst, 1, size)
		if err := c.Copy(3, 0, ents, word, 7); err == nil || !strings.Contains(err.Error(), "no registered host range") {
			t.Fatalf("Copy into an unregistered doorbell: %v", err)
		}
		unreg, err := c.RegisterHost(uintptr(unsafe.Pointer(&mem[128])), 64)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.RegisterHost(uintptr(unsafe.Pointer(&mem[256])), 8); err == nil {
			t.Errorf("a second registration of the same page succeeded")
		}
		if n := c.Stats().HostRanges; n != 1 {
			t.Fatalf("%d host ranges registered, want 1", n)
		}
		if !c.Drained(3) {
			t.Fatal("a lane that never copied has not drained")
		}
		if err := c.Copy(3, 0, ents, word, 7); err != nil {
			t.Fatal(err)
		}
		// The GPU rings the doorbell itself: the first look after a Piece
		// fences the lane's streams, and a later one sees the fence pass.
		if c.Drained(3) {
			t.Fatal("Drained(3) before a fence behind the Piece")
		}
		if !c.Drained(3) {
			t.Fatal("lane 3 not drained once its fence passed")
		}
		if *word != 7 {
			t.Fatalf("doorbell reads %d after the Piece completed, want 7 (rung by the stream, not Poll)", *word)
		}
		if st := c.Stats(); st.PendingDoorbells != 0 || st.Copies != 1 {
			t.Fatalf("%+v, want 1 copy and no doorbell left for Poll", st)
		}
		if rung, err := c.Poll(); rung != 0 || err != nil {
			t.Fatalf("Poll on the GPU path rang %d (%v)", rung, err)
		}
		for range 2 {
			if err := unreg(); err != nil {
				t.Fatalf("unregister: %v", err)
			}
			if n := c.Stats().HostRanges; n != 0 {
				t.Fatalf("%d host ranges after unregister, want 0", n)
			}
		}
		if err := c.Copy(3, 0, ents, word, 8); err == nil {
			t.Fatalf("Copy into an unregistered doorbell succeeded")
		}
		if _, err := c.RegisterHost(0, 8); err == nil {
			t.Errorf("RegisterHost(0, 8) succeeded")
		}
		runtime.KeepAlive(mem)
	})

	// The driver's version decides the copy form and the doorbell path
	// when nothing is forced, and a forced one the driver lacks is an error.
	t.Run("choices follow the driver", func(t *testing.T) {
		for _, tc := range []struct {
			version int
			mode    cuda.CopyMode
			gpuBell bool
		}{
			{13000, cuda.CopyBatchV13000, true},
			{12080, cuda.CopyBatchV12080, true},
			{11040, cuda.CopyPerEntry, false},
		} {
			g := openFake(t, lib, tc.version)
			c, err := gpu.NewCopier(g, gpu.CopierOptions{Gather: gpu.GatherCE})
			if err != nil {
				t.Fatalf("driver %d: %v", tc.version, err)
			}
			if c.CopyMode() != tc.mode || c.GPUDoorbell() != tc.gpuBell {
				t.Errorf("driver %d: copy %v, doorbell %q; want %v, GPU doorbell %v", tc.version, c.CopyMode(), c.Doorbell(), tc.mode, tc.gpuBell)
			}
			src, dst := alloc(t, g, 8*size), alloc(t, g, 8*size)
			pattern(t, g, src, 8*size)
			fill(t, g, dst, 0, 8*size)
			var word uint64
			unreg := func() error { return nil }
			if tc.gpuBell {
				if unreg, err = c.RegisterHost(uintptr(unsafe.Pointer(&word)), 8); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.Copy(0, 0, piece(src, dst, 3, size), &word, 1); err != nil {
				t.Fatalf("driver %d: Copy: %v", tc.version, err)
			}
			c.Poll()
			if word != 1 {
				t.Errorf("driver %d: doorbell reads %d, want 1", tc.version, word)
			}
			checkGathered(t, g, src, dst, 3, size)
			if err := unreg(); err != nil {
				t.Errorf("driver %d: unregister: %v", tc.version, err)
			}
			if err := c.Close(); err != nil {
				t.Errorf("driver %d: Close: %v", tc.version, err)
			}
		}
		g := openFake(t, lib, 12080)
		if c, err := gpu.NewCopier(g, gpu.CopierOptions{Copy: gpu.CopyBatch13}); err == nil || !strings.Contains(err.Error(), "lacks") {
			if c != nil {
				c.Close()
			}
			t.Errorf("the 13.0 batch form forced on driver 12080: %v, want an error saying the driver lacks it", err)
		}
		g = openFake(t, lib, 11040)
		if c, err := gpu.NewCopier(g, gpu.CopierOptions{Doorbell: gpu.DoorbellGPU}); err == nil || !errors.Is(err, cuda.ErrNotAvailable) {
			if c != nil {
				c.Close()
			}
			t.Errorf("the GPU doorbell required on driver 11040 (no cuStreamWriteValue64): %v, want ErrNotAvailable", err)
		}
	})

	// A refused Piece enqueues nothing: no copy, no bytes, no doorbell.
	t.Run("refused Pieces leave nothing behind", func(t *testing.T) {
		g := openFake(t, lib, 13000)
		c := newCopier(t, g, gpu.CopierOptions{Doorbell: gpu.DoorbellCPU, Copy: gpu.CopyPerEntry})
		src, dst := alloc(t, g, 2*size), alloc(t, g, 2*size)
		ents := piece(src, dst, 1, size)
		words := make([]uint64, 2)
		odd := (*uint64)(unsafe.Add(unsafe.Pointer(&words[0]), 4))
		for _, tc := range []struct {
			name    string
			lane    int
			ready   relay.Event
			ents    []relay.CopyEntry
			word    *uint64
			is      error
			message string
		}{
			{"lane -1", -1, 0, ents, &words[1], nil, "lane -1 out of range"},
			{"lane past the last", staging.LaneCount, 0, ents, &words[1], nil, "out of range"},
			{"nil doorbell", 0, 0, ents, nil, nil, "nil doorbell"},
			{"unaligned doorbell", 0, 0, ents, odd, nil, "not 8-byte aligned"},
			{"too many entries", 0, 0, make([]relay.CopyEntry, staging.MaxPlans+1), &words[1], nil, "entries, at most"},
			{"unknown ready event", 0, relay.Event(1<<32 | 77), ents, &words[1], gpu.ErrUnknownEvent, ""},
			{"driver refuses the copy", 0, 0, []relay.CopyEntry{{Src: 0, Dst: uintptr(dst), Len: size}}, &words[1], nil, "lane 0 seq 9"},
		} {
			err := c.Copy(tc.lane, tc.ready, tc.ents, tc.word, 9)
			if err == nil || tc.is != nil && !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.message) {
				t.Errorf("%s: Copy: %v, want an error (%v) saying %q", tc.name, err, tc.is, tc.message)
			}
		}
		if st := c.Stats(); st.Copies != 0 || st.Bytes != 0 || st.PendingDoorbells != 0 {
			t.Fatalf("after refused Pieces only: %+v, want nothing counted", st)
		}
		if rung, err := c.Poll(); rung != 0 || err != nil || words[0] != 0 || words[1] != 0 {
			t.Fatalf("Poll rang %d (%v), words %v; want nothing rung", rung, err, words)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.Copy(0, 0, ents, &words[1], 10); !errors.Is(err, gpu.ErrClosed) {
			t.Fatalf("Copy after Close: %v, want ErrClosed", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})

	// Source-ready events: handed out live, refused once released (a
	// released handle is not taken for the event's next life), and the
	// pool grows past its first 256 without losing one.
	t.Run("ready events", func(t *testing.T) {
		g := openFake(t, lib, 13000)
		c := newCopier(t, g, gpu.CopierOptions{Doorbell: gpu.DoorbellCPU, Copy: gpu.CopyPerEntry})
		src, dst := alloc(t, g, 2*size), alloc(t, g, 2*size)
		var word uint64
		ev, err := c.RecordReady(0)
		if err != nil {
			t.Fatal(err)
		}
		if done, err := c.Query(ev); !done || err != nil {
			t.Fatalf("Query of a recorded event on the fake driver: %v, %v", done, err)
		}
		if err := c.Copy(6, ev, piece(src, dst, 1, size), &word, 1); err != nil {
			t.Fatalf("Copy waiting for a live event: %v", err)
		}
		c.Release(ev)
		if n := c.Stats().LiveReadyEvents; n != 0 {
			t.Fatalf("%d live events after Release, want 0", n)
		}
		if _, err := c.Query(ev); !errors.Is(err, gpu.ErrUnknownEvent) {
			t.Errorf("Query of a released event: %v, want ErrUnknownEvent", err)
		}
		again, err := c.RecordReady(0)
		if err != nil {
			t.Fatal(err)
		}
		if again == ev {
			t.Fatalf("the event's next life has the released handle %#x", uint64(ev))
		}
		if err := c.Copy(6, ev, piece(src, dst, 1, size), &word, 2); !errors.Is(err, gpu.ErrUnknownEvent) {
			t.Errorf("Copy waiting for a released event: %v, want ErrUnknownEvent", err)
		}
		c.Release(again)
		const n = 300
		seen := map[relay.Event]bool{}
		for range n {
			e, err := c.RecordReady(0)
			if err != nil {
				t.Fatal(err)
			}
			if seen[e] {
				t.Fatalf("event %#x handed out twice", uint64(e))
			}
			seen[e] = true
		}
		if live := c.Stats().LiveReadyEvents; live != n {
			t.Fatalf("%d live events, want %d", live, n)
		}
		for e := range seen {
			c.Release(e)
		}
		if live := c.Stats().LiveReadyEvents; live != 0 {
			t.Fatalf("%d live events after releasing all, want 0", live)
		}
		if done, err := c.Query(0); !done || err != nil {
			t.Errorf("Query(0): %v, %v; event 0 is always complete", done, err)
		}
	})
}
