// SPDX-License-Identifier: Apache-2.0

package gpu_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/sim/ringcheck"
	"github.com/pxn-project/pxn/internal/testkernel"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

// requireEnv makes a missing driver or GPU a failure instead of a skip.
const requireEnv = "PXN_REQUIRE_GPU"

const childEnv = "PXN_GPU_TEST_CHILD"

func TestMain(m *testing.M) {
	if ringcheck.IsRelay() {
		if err := ringcheck.RelayMain(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if role := os.Getenv(childEnv); role != "" {
		if err := arenaChild(role); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func loadDriver(t testing.TB) (*cuda.Driver, int) {
	t.Helper()
	d, err := cuda.Load()
	if err != nil {
		if os.Getenv(requireEnv) != "1" && (errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrorNoDevice)) {
			t.Skipf("skipping: %v", err)
		}
		t.Fatalf("Load: %v", err)
	}
	n, err := d.DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		if os.Getenv(requireEnv) == "1" {
			t.Fatal("no CUDA device")
		}
		t.Skip("skipping: no CUDA device")
	}
	return d, n
}

// openGPU opens device 0 with its context current on the test's locked
// thread.
func openGPU(t testing.TB) *gpu.GPU {
	t.Helper()
	d, _ := loadDriver(t)
	return openCurrent(t, d)
}

// openCurrent opens device 0 of d with its context current on the test's
// locked thread, closed at the test's end.
func openCurrent(t testing.TB, d *cuda.Driver) *gpu.GPU {
	t.Helper()
	g, err := gpu.Open(d, 0)
	if err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	if err := d.CtxSetCurrent(g.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.CtxSetCurrent(0)
		runtime.UnlockOSThread()
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return g
}

// ptxEnv names a PTX file that replaces the embedded gather kernel in the
// tests (for a kernel built on the GPU machine before it is committed).
const ptxEnv = "PXN_TEST_GATHER_PTX"

func withPTX(t testing.TB, opts gpu.CopierOptions) gpu.CopierOptions {
	t.Helper()
	if p := os.Getenv(ptxEnv); p != "" && opts.GatherPTX == nil {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		opts.GatherPTX = b
	}
	return opts
}

func newCopier(t testing.TB, g *gpu.GPU, opts gpu.CopierOptions) *gpu.Copier {
	t.Helper()
	c, err := gpu.NewCopier(g, withPTX(t, opts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("copier close: %v", err)
		}
	})
	if err := c.BindThread(); err != nil {
		t.Fatal(err)
	}
	return c
}

func alloc(t testing.TB, g *gpu.GPU, n uint64) cuda.DevicePtr {
	t.Helper()
	p, err := g.Driver().MemAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Driver().MemFree(p) })
	return p
}

// shmDir is a fresh folder on tmpfs for control blocks.
func shmDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "pxn-gpu-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func fill(t testing.TB, g *gpu.GPU, p cuda.DevicePtr, v uint32, n uint64) {
	t.Helper()
	if err := g.Driver().MemsetD32Async(p, v, n/4, 0); err != nil {
		t.Fatal(err)
	}
	if err := g.Driver().StreamSynchronize(0); err != nil {
		t.Fatal(err)
	}
}

func expectWords(t testing.TB, g *gpu.GPU, p cuda.DevicePtr, v uint32, n int) {
	t.Helper()
	got := make([]byte, n)
	if err := g.Driver().MemcpyDtoH(got, p); err != nil {
		t.Fatal(err)
	}
	for off := 0; off < n; off += 4 {
		if w := *(*uint32)(unsafe.Pointer(&got[off])); w != v {
			t.Fatalf("word at %d is %#x, want %#x", off, w, v)
		}
	}
}

// A rank whose arena is on a GPU names that GPU in its counters block.
func TestRegistryRecordsTheGPU(t *testing.T) {
	g := openGPU(t)
	p := gpu.NewArenas(g)
	root := t.TempDir()
	r, err := registry.Register(context.Background(), registry.Options{Root: root, Group: "gpu", UID: os.Geteuid(), Rail: "rail0", HCA: "mlx5_0", Arenas: p})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	groups, err := inspect.Root(root, time.Minute)
	if err != nil || len(groups) != 1 || len(groups[0].Ranks) != 1 {
		t.Fatalf("inspect: %+v, %v", groups, err)
	}
	rr := groups[0].Ranks[0]
	if rr.Stats == nil || rr.Stats.Device != p.Device() || rr.Arena != "cuda" {
		t.Fatalf("rank arena %s, stats %+v (%s); want device %s", rr.Arena, rr.Stats, rr.StatsError, p.Device())
	}
	t.Logf("device %s", rr.Stats.Device)
}

// TestCopierRing runs the two-process ring: the relay checks each Piece's
// bytes after its doorbell, so a doorbell that overtakes its copies, a
// misplaced entry or a copy that ignores its ready event fails the run.
func TestCopierRing(t *testing.T) {
	_, devices := loadDriver(t)
	tests := []struct {
		name     string
		relayDev int
		copy     gpu.CopyPolicy
		bell     gpu.DoorbellMode
		entries  int
		gather   gpu.GatherMode
	}{
		{"same-gpu/auto/auto-doorbell", 0, gpu.CopyAuto, gpu.DoorbellAuto, 4, gpu.GatherAuto},
		{"same-gpu/per-entry/auto-doorbell", 0, gpu.CopyPerEntry, gpu.DoorbellAuto, 16, gpu.GatherAuto},
		{"same-gpu/batch-12.8/auto-doorbell", 0, gpu.CopyBatch12, gpu.DoorbellAuto, 64, gpu.GatherAuto},
		{"same-gpu/batch-13.0/auto-doorbell/4096-entries", 0, gpu.CopyBatch13, gpu.DoorbellAuto, 4096, gpu.GatherAuto},
		{"same-gpu/auto/cpu-doorbell", 0, gpu.CopyAuto, gpu.DoorbellCPU, 4, gpu.GatherAuto},
		{"same-gpu/per-entry/cpu-doorbell", 0, gpu.CopyPerEntry, gpu.DoorbellCPU, 8, gpu.GatherAuto},
		{"cross-gpu/auto/auto-doorbell", 1, gpu.CopyAuto, gpu.DoorbellAuto, 4, gpu.GatherAuto},
		{"cross-gpu/auto/cpu-doorbell", 1, gpu.CopyAuto, gpu.DoorbellCPU, 4, gpu.GatherAuto},
		{"same-gpu/sm/auto-doorbell/4096-entries", 0, gpu.CopyAuto, gpu.DoorbellAuto, 4096, gpu.GatherSM},
		{"cross-gpu/sm/auto-doorbell/4096-entries", 1, gpu.CopyAuto, gpu.DoorbellAuto, 4096, gpu.GatherSM},
		{"cross-gpu/sm/cpu-doorbell/512-entries", 1, gpu.CopyAuto, gpu.DoorbellCPU, 512, gpu.GatherSM},
		{"cross-gpu/sm/one-entry", 1, gpu.CopyAuto, gpu.DoorbellAuto, 1, gpu.GatherSM},
		{"cross-gpu/auto-chooses-sm/64-entries", 1, gpu.CopyAuto, gpu.DoorbellAuto, 64, gpu.GatherAuto},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.relayDev >= devices {
				t.Skipf("skipping: needs %d CUDA devices, found %d", tt.relayDev+1, devices)
			}
			d, _ := loadDriver(t)
			if (tt.copy == gpu.CopyBatch12 && !d.Supports(cuda.CopyBatchV12080)) || (tt.copy == gpu.CopyBatch13 && !d.Supports(cuda.CopyBatchV13000)) {
				t.Skipf("skipping: driver %d lacks this batch form", d.Version())
			}
			cfg := ringcheck.Config{
				RelayDevice: tt.relayDev,
				ControlPath: shmDir(t) + "/control",
				Lane:        2,
				Pieces:      3 * staging.SlotsPerLane,
				PieceLen:    staging.SlotSize,
				Entries:     tt.entries,
				Verify:      true,
				Timeout:     60 * time.Second,
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			rp, err := ringcheck.StartRelay(os.Args[0], []string{"-test.run=^$"}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			s, err := ringcheck.NewSender(d, cfg, rp.Handle, withPTX(t, gpu.CopierOptions{Copy: tt.copy, Doorbell: tt.bell, Gather: tt.gather}))
			if err != nil {
				rp.Kill()
				t.Fatal(err)
			}
			c := s.Copier()
			if tt.bell == gpu.DoorbellCPU && c.GPUDoorbell() {
				t.Error("forced CPU doorbell, got the GPU one")
			}
			elapsed, runErr := s.Run(cfg.Pieces)
			st := c.Stats()
			closeErr := s.Close()
			var relayErr error
			if runErr != nil {
				rp.Kill()
			} else {
				relayErr = rp.Wait()
			}
			if err := errors.Join(runErr, closeErr, relayErr); err != nil {
				t.Fatal(err)
			}
			if st.Copies != uint64(cfg.Pieces) || st.Bytes != uint64(cfg.Pieces*cfg.PieceLen) || st.LiveReadyEvents != 0 {
				t.Errorf("stats %+v after %d Pieces", st, cfg.Pieces)
			}
			if tt.gather == gpu.GatherSM && st.SMPieces != st.Copies {
				t.Errorf("forced SM gather moved %d of %d Pieces", st.SMPieces, st.Copies)
			}
			if tt.copy != gpu.CopyAuto && st.SMPieces != 0 {
				t.Errorf("forced copy form %v, yet %d Pieces went to the SM kernel", tt.copy, st.SMPieces)
			}
			if tt.name == "cross-gpu/auto-chooses-sm/64-entries" && st.SMPieces != st.Copies {
				t.Errorf("auto moved %d of %d Pieces of 128 KiB entries with the SM kernel", st.SMPieces, st.Copies)
			}
			t.Logf("%d Pieces of %d entries in %v (copy %v, doorbell %s)", cfg.Pieces, cfg.Entries, elapsed, c.CopyMode(), c.Doorbell())
		})
	}
}

// hostWord maps a page for a doorbell and registers it with c.
func hostWord(t testing.TB, c *gpu.Copier) *uint64 { return (*uint64)(hostBytes(t, c, 128)) }

// hostBytes is a cache line at off in a page of host memory that the
// copier may write (RegisterHost), unmapped when the test ends.
func hostBytes(t testing.TB, c *gpu.Copier, off int) unsafe.Pointer {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	unreg, err := c.RegisterHost(uintptr(unsafe.Pointer(&mem[off])), 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unreg(); err != nil {
			t.Error(err)
		}
		unix.Munmap(mem)
	})
	return unsafe.Pointer(&mem[off])
}

// TestCopierWaitsForReady holds the source stream with a spinning kernel:
// neither the copy nor the doorbell may happen before the ready event.
func TestCopierWaitsForReady(t *testing.T) {
	for _, tc := range []struct {
		bell   gpu.DoorbellMode
		gather gpu.GatherMode
	}{{gpu.DoorbellAuto, gpu.GatherCE}, {gpu.DoorbellCPU, gpu.GatherCE}, {gpu.DoorbellAuto, gpu.GatherSM}, {gpu.DoorbellCPU, gpu.GatherSM}} {
		bell := tc.bell
		t.Run(fmt.Sprintf("doorbell-mode-%d/%v", bell, tc.gather), func(t *testing.T) {
			g := openGPU(t)
			d := g.Driver()
			c := newCopier(t, g, gpu.CopierOptions{Doorbell: bell, Gather: tc.gather})
			mod, err := d.ModuleLoadData([]byte(testkernel.SpinKernelPTX))
			if err != nil {
				t.Fatal(err)
			}
			defer d.ModuleUnload(mod)
			spin, err := d.ModuleGetFunction(mod, testkernel.SpinKernelName)
			if err != nil {
				t.Fatal(err)
			}
			flagMem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(flagMem)
			flagHost := uintptr(unsafe.Pointer(&flagMem[0]))
			if err := d.MemHostRegister(flagHost, 4096, cuda.HostRegisterDeviceMap|cuda.HostRegisterPortable); err != nil {
				t.Fatal(err)
			}
			defer d.MemHostUnregister(flagHost)
			flagDev, err := d.MemHostGetDevicePointer(flagHost)
			if err != nil {
				t.Fatal(err)
			}
			flag := (*uint32)(unsafe.Pointer(&flagMem[0]))
			defer atomic.StoreUint32(flag, 1)

			const n = 4 << 20
			src, dst := alloc(t, g, n), alloc(t, g, n)
			fill(t, g, dst, 0, n)
			word := hostWord(t, c)
			caller, err := d.StreamCreate(cuda.StreamNonBlocking)
			if err != nil {
				t.Fatal(err)
			}
			defer d.StreamDestroy(caller)
			if err := d.LaunchKernel(spin, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 1, Y: 1, Z: 1}, 0, caller, uint64(flagDev)); err != nil {
				t.Fatal(err)
			}
			if err := d.MemsetD32Async(src, 0x0badcafe, n/4, caller); err != nil {
				t.Fatal(err)
			}
			ready, err := c.RecordReady(uintptr(caller))
			if err != nil {
				t.Fatal(err)
			}
			ents := []relay.CopyEntry{{Src: uintptr(src), Dst: uintptr(dst), Len: n / 2}, {Src: uintptr(src) + n/2, Dst: uintptr(dst) + n/2, Len: n / 2}}
			if err := c.Copy(4, ready, ents, word, 7); err != nil {
				t.Fatal(err)
			}
			for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
				if _, err := c.Poll(); err != nil {
					t.Fatal(err)
				}
				if v := atomic.LoadUint64(word); v != 0 {
					t.Fatalf("doorbell rang (%d) before the ready event", v)
				}
				if done, err := c.Query(ready); err != nil || done {
					t.Fatalf("ready event done=%v err=%v while the kernel spins", done, err)
				}
			}
			atomic.StoreUint32(flag, 1)
			deadline := time.Now().Add(10 * time.Second)
			for atomic.LoadUint64(word) != 7 {
				if _, err := c.Poll(); err != nil {
					t.Fatal(err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("doorbell is %d 10 s after the ready event", atomic.LoadUint64(word))
				}
			}
			expectWords(t, g, dst, 0x0badcafe, n)
			c.Release(ready)
			if _, err := c.Query(ready); !errors.Is(err, gpu.ErrUnknownEvent) {
				t.Fatalf("Query of a released event: %v", err)
			}
		})
	}
}

func TestCopierErrors(t *testing.T) {
	g := openGPU(t)
	c := newCopier(t, g, gpu.CopierOptions{})
	src, dst := alloc(t, g, 4096), alloc(t, g, 4096)
	word := hostWord(t, c)
	ents := []relay.CopyEntry{{Src: uintptr(src), Dst: uintptr(dst), Len: 4096}}
	var unregistered uint64
	var misaligned [2]uint64
	tests := []struct {
		name  string
		lane  int
		ready relay.Event
		ents  []relay.CopyEntry
		bell  *uint64
		is    error
	}{
		{"lane -1", -1, 0, ents, word, nil},
		{"lane 7", staging.LaneCount, 0, ents, word, nil},
		{"nil doorbell", 0, 0, ents, nil, nil},
		{"misaligned doorbell", 0, 0, ents, (*uint64)(unsafe.Add(unsafe.Pointer(&misaligned[0]), 4)), nil},
		{"unknown ready event", 0, 12345, ents, word, gpu.ErrUnknownEvent},
		{"too many entries", 0, 0, make([]relay.CopyEntry, staging.MaxPlans+1), word, nil},
	}
	if c.GPUDoorbell() {
		tests = append(tests, struct {
			name  string
			lane  int
			ready relay.Event
			ents  []relay.CopyEntry
			bell  *uint64
			is    error
		}{"unregistered doorbell", 0, 0, ents, &unregistered, nil})
	}
	for _, tt := range tests {
		err := c.Copy(tt.lane, tt.ready, tt.ents, tt.bell, 1)
		if err == nil || (tt.is != nil && !errors.Is(err, tt.is)) {
			t.Errorf("%s: err = %v", tt.name, err)
		}
	}
	if c.Stats().Copies != 0 {
		t.Fatalf("a failed Copy counted: %+v", c.Stats())
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Copy(0, 0, ents, word, 1); !errors.Is(err, gpu.ErrClosed) {
		t.Fatalf("Copy after Close: %v", err)
	}
}

func TestCopierEvents(t *testing.T) {
	g := openGPU(t)
	c := newCopier(t, g, gpu.CopierOptions{})
	var evs []relay.Event
	for i := 0; i < 300; i++ {
		stream := uintptr(0)
		if i%2 == 1 {
			stream = uintptr(cuda.StreamPerThread)
		}
		ev, err := c.RecordReady(stream)
		if err != nil {
			t.Fatalf("RecordReady %d: %v", i, err)
		}
		evs = append(evs, ev)
	}
	if got := c.Stats().LiveReadyEvents; got != 300 {
		t.Fatalf("live events %d, want 300", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, ev := range evs {
		for {
			done, err := c.Query(ev)
			if err != nil {
				t.Fatal(err)
			}
			if done {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("ready events on idle streams did not complete")
			}
		}
		c.Release(ev)
	}
	if got := c.Stats().LiveReadyEvents; got != 0 {
		t.Fatalf("live events %d after release", got)
	}
	again, err := c.RecordReady(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Query(evs[len(evs)-1]); !errors.Is(err, gpu.ErrUnknownEvent) {
		t.Fatalf("Query of a released event whose slot was reused: %v", err)
	}
	c.Release(again)
	if done, err := c.Query(0); !done || err != nil {
		t.Fatalf("Query(0) = %v, %v", done, err)
	}
}

func TestCopierClassify(t *testing.T) {
	g := openGPU(t)
	c := newCopier(t, g, gpu.CopierOptions{})
	dev := alloc(t, g, 1<<20)
	heap := make([]byte, 4096)
	pinned := hostWord(t, c)
	tests := []struct {
		name string
		addr uintptr
		n    uint64
		want relay.Kind
	}{
		{"device", uintptr(dev), 1 << 20, relay.Device},
		{"device tail", uintptr(dev) + 4096, 1<<20 - 4096, relay.Device},
		{"device overrun", uintptr(dev) + 4096, 1 << 20, relay.Host},
		{"go heap", uintptr(unsafe.Pointer(&heap[0])), 4096, relay.Host},
		{"registered host", uintptr(unsafe.Pointer(pinned)), 8, relay.Host},
	}
	for _, tt := range tests {
		if got := c.Classify(tt.addr, tt.n); got != tt.want {
			t.Errorf("%s: Classify = %v, want %v", tt.name, got, tt.want)
		}
	}
	runtime.KeepAlive(heap)
}

// TestCopyAllocationFree: the steady-state path (Copy, then Poll until the
// doorbell rings) allocates nothing.
func TestCopyAllocationFree(t *testing.T) {
	for _, tc := range []struct {
		bell   gpu.DoorbellMode
		gather gpu.GatherMode
	}{{gpu.DoorbellAuto, gpu.GatherCE}, {gpu.DoorbellCPU, gpu.GatherCE}, {gpu.DoorbellAuto, gpu.GatherSM}, {gpu.DoorbellCPU, gpu.GatherSM}} {
		bell := tc.bell
		t.Run(fmt.Sprintf("doorbell-mode-%d/%v", bell, tc.gather), func(t *testing.T) {
			g := openGPU(t)
			c := newCopier(t, g, gpu.CopierOptions{Doorbell: bell, Gather: tc.gather})
			src, dst := alloc(t, g, 1<<20), alloc(t, g, 1<<20)
			word := hostWord(t, c)
			ents := make([]relay.CopyEntry, 16)
			for i := range ents {
				ents[i] = relay.CopyEntry{Src: uintptr(src) + uintptr(i)<<16, Dst: uintptr(dst) + uintptr(15-i)<<16, Len: 1 << 16}
			}
			seq := uint64(0)
			var failed error
			allocs := testing.AllocsPerRun(200, func() {
				seq++
				if err := c.Copy(1, 0, ents, word, seq); err != nil {
					failed = err
					return
				}
				for atomic.LoadUint64(word) != seq {
					if _, err := c.Poll(); err != nil {
						failed = err
						return
					}
				}
			})
			if failed != nil {
				t.Fatal(failed)
			}
			if allocs != 0 {
				t.Fatalf("%v allocations per Piece (copy %v, doorbell %s)", allocs, c.CopyMode(), c.Doorbell())
			}
		})
	}
}
