// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/fakecuda"
	"github.com/pxn-project/pxn/internal/sanitize"
)

const fakeLibEnv = fakecuda.LibEnv

// buildFake compiles testdata/fakecuda.c into dir with flags.
func buildFake(t *testing.T, dir string, flags ...string) string {
	t.Helper()
	return fakecuda.Build(t, dir, flags...)
}

func fakeDriverLib(t *testing.T) string {
	t.Helper()
	if lib := os.Getenv(fakeLibEnv); lib != "" {
		return lib
	}
	return buildFake(t, t.TempDir(), "-O2")
}

// openFake is openGPU on the fake driver's device 0.
func openFake(t *testing.T, lib string) *gpu {
	t.Helper()
	d, err := LoadLibrary(lib)
	if err != nil {
		t.Fatalf("LoadLibrary(%s): %v", lib, err)
	}
	t.Cleanup(d.Close)
	ctx, err := d.PrimaryCtxRetain(0)
	if err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	if err := d.CtxSetCurrent(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.CtxSetCurrent(0)
		runtime.UnlockOSThread()
	})
	return &gpu{d: d, dev: 0, ctx: ctx, n: 2}
}

// fakeLacks are the entry points the fake driver does not have (the
// virtual-memory calls): each must load as missing, which is what a driver
// without them gives.
var fakeLacks = map[string]bool{
	"cuMemGetAllocationGranularity": true, "cuMemCreate": true, "cuMemRelease": true,
	"cuMemAddressReserve": true, "cuMemAddressFree": true, "cuMemMap": true, "cuMemUnmap": true,
	"cuMemSetAccess": true, "cuMemExportToShareableHandle": true, "cuMemImportFromShareableHandle": true,
	"cuMemGetAllocationPropertiesFromHandle": true,
}

// TestShimOnFakeDriver runs shim.c, every path a machine without a GPU
// otherwise never reaches, against testdata/fakecuda.c: loading by
// cuGetProcAddress_v2 at pinned versions, the trampolines, the copy modes
// of a Piece with its doorbell and events, the gather plan and the kernel
// launch, classification, and the failures they report.
func TestShimOnFakeDriver(t *testing.T) {
	lib := fakeDriverLib(t)

	t.Run("load", func(t *testing.T) {
		for _, tc := range []struct {
			version            int
			best               CopyMode
			v13, v12, writeV64 bool
		}{
			{13000, CopyBatchV13000, true, true, true},
			{12080, CopyBatchV12080, false, true, true},
			{11040, CopyPerEntry, false, false, false},
		} {
			t.Setenv("PXN_FAKECUDA_VERSION", strconv.Itoa(tc.version))
			d, err := LoadLibrary(lib)
			if err != nil {
				t.Fatalf("driver %d: %v", tc.version, err)
			}
			if d.Version() != tc.version || !d.ProcAddressV2() || d.BestCopyMode() != tc.best ||
				d.HasBatchV13000() != tc.v13 || d.HasBatchV12080() != tc.v12 || d.HasStreamWriteValue64() != tc.writeV64 {
				t.Errorf("driver %d: version %d, v2 %v, best %v, batch 13.0 %v, batch 12.8 %v, writeValue64 %v",
					tc.version, d.Version(), d.ProcAddressV2(), d.BestCopyMode(), d.HasBatchV13000(), d.HasBatchV12080(), d.HasStreamWriteValue64())
			}
			for _, s := range d.Symbols() {
				if want := s.MinDriver <= tc.version && !fakeLacks[s.Name] && (s.Name != "cuStreamWriteValue64" || tc.writeV64); s.Loaded != want {
					t.Errorf("driver %d: %s loaded %v, want %v", tc.version, s.Name, s.Loaded, want)
				}
			}
			d.Close()
		}
	})

	t.Run("init fails", func(t *testing.T) {
		t.Setenv("PXN_FAKECUDA_INIT", "100")
		_, err := LoadLibrary(lib)
		if !errors.Is(err, ErrorNoDevice) || !strings.Contains(err.Error(), "CUDA_ERROR_NO_DEVICE") {
			t.Fatalf("err = %v, want ErrorNoDevice named by cuGetErrorName", err)
		}
	})

	g := openFake(t, lib)
	d := g.d

	t.Run("device", func(t *testing.T) {
		g.bind(t)
		n, err := d.DeviceCount()
		if err != nil || n != 2 {
			t.Fatalf("DeviceCount = %d, %v", n, err)
		}
		name, err := d.DeviceName(1)
		if err != nil || name != "Fake GPU" {
			t.Errorf("DeviceName = %q, %v", name, err)
		}
		bus, err := d.DevicePCIBusID(1)
		if err != nil || bus != "0000:19:00.0" {
			t.Errorf("DevicePCIBusID = %q, %v", bus, err)
		}
		if sms, err := d.DeviceAttribute(AttrMultiprocessorCount, 0); err != nil || sms != 132 {
			t.Errorf("SMs = %d, %v", sms, err)
		}
		if can, err := d.DeviceCanAccessPeer(0, 1); err != nil || !can {
			t.Errorf("DeviceCanAccessPeer = %v, %v", can, err)
		}
		if dev, err := d.CtxGetDevice(); err != nil || dev != 0 {
			t.Errorf("CtxGetDevice = %d, %v", dev, err)
		}
		if free, total, err := d.MemGetInfo(); err != nil || free == 0 || total < free {
			t.Errorf("MemGetInfo = %d, %d, %v", free, total, err)
		}
		if name := d.ErrorName(ErrorOutOfMemory); name != "CUDA_ERROR_OUT_OF_MEMORY" {
			t.Errorf("ErrorName(%d) = %q", ErrorOutOfMemory, name)
		}
		old := d.withoutEntryPoint("cuMemAlloc")
		defer old.Close()
		if _, err := old.MemAlloc(64); !errors.Is(err, ErrNotAvailable) || !strings.Contains(err.Error(), "cuMemAlloc") {
			t.Errorf("MemAlloc without cuMemAlloc: %v, want ErrNotAvailable naming the call", err)
		}
		nb := d.withoutEntryPoint("cuMemcpyBatchAsync")
		defer nb.Close()
		if d.BestCopyMode() == CopyPerEntry || nb.BestCopyMode() != CopyPerEntry {
			t.Errorf("best copy mode %v, without the batch entry points %v; want a batch form, then per entry", d.BestCopyMode(), nb.BestCopyMode())
		}
	})

	const size = 1 << 20
	src, dst := g.alloc(t, size), g.alloc(t, size)
	want := randomBytes(5, size)
	if err := d.MemcpyHtoD(src, want); err != nil {
		t.Fatal(err)
	}

	// ClassifyRange reads the three attributes in one
	// cuPointerGetAttributes, or one cuPointerGetAttribute each on a
	// driver without it; the answers are the same.
	t.Run("classify", func(t *testing.T) {
		mid := src + 4096
		old := d.withoutEntryPoint("cuPointerGetAttributes")
		defer old.Close()
		for _, drv := range []struct {
			name string
			d    *Driver
		}{{"cuPointerGetAttributes", d}, {"cuPointerGetAttribute", old}} {
			for _, tc := range []struct {
				p    DevicePtr
				n    uint64
				want MemoryType
			}{
				{mid, 100, MemoryDevice},
				{src, size, MemoryDevice},
				{src + size - 1, 2, MemoryHost},
				{0, 1, MemoryHost},
				{DevicePtr(uintptr(0x10)), 1, MemoryHost},
			} {
				kind, start, n := drv.d.ClassifyRange(g.ctx, tc.p, tc.n)
				if kind != tc.want || (kind == MemoryDevice && (start != src || n != size)) || (kind != MemoryDevice && (start != 0 || n != 0)) {
					t.Errorf("through %s: ClassifyRange(%#x, %d) = %v [%#x, +%d), want %v", drv.name, uint64(tc.p), tc.n, kind, uint64(start), n, tc.want)
				}
			}
		}
		if allocs := testing.AllocsPerRun(100, func() { d.ClassifyRange(g.ctx, mid, 100) }); allocs != 0 {
			t.Errorf("ClassifyRange allocates %v times a call", allocs)
		}
		if ord, err := d.PointerDeviceOrdinal(mid); err != nil || ord != 0 {
			t.Errorf("PointerDeviceOrdinal = %d, %v", ord, err)
		}
	})

	t.Run("ipc", func(t *testing.T) {
		h, err := d.IPCGetMemHandle(src)
		if err != nil {
			t.Fatal(err)
		}
		p, err := d.IPCOpenMemHandle(h, IPCLazyEnablePeerAccess)
		if err != nil || p != src {
			t.Fatalf("IPCOpenMemHandle = %#x, %v; want %#x", uint64(p), err, uint64(src))
		}
		if err := d.IPCCloseMemHandle(p); err != nil {
			t.Fatal(err)
		}
	})

	// Scattered entries, some empty, none overlapping in dst.
	var entries []BatchEntry
	var off uint64
	for i := uint64(0); i < 48; i++ {
		n := (i * 977) % 4099
		if i%7 == 3 {
			n = 0
		}
		entries = append(entries, BatchEntry{Src: uint64(src) + (i*7919)%(size/2), Dst: uint64(dst) + off, Len: n})
		off += n + 13
	}
	live := 0
	for _, e := range entries {
		if e.Len > 0 {
			live++
		}
	}
	mod, err := d.ModuleLoadData([]byte("// the fake driver runs pxn_gather without code"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.ModuleUnload(mod) })
	gatherFn, err := d.ModuleGetFunction(mod, "pxn_gather")
	if err != nil {
		t.Fatal(err)
	}
	planHost, planDev := g.alloc(t, PlanBytes(live)), g.alloc(t, PlanBytes(live))
	bell := g.alloc(t, 8)
	stream, upload := g.stream(t), g.stream(t)
	wait, done, planUp, planBusy := g.event(t), g.event(t), g.event(t), g.event(t)
	if err := d.EventRecord(wait, stream); err != nil {
		t.Fatal(err)
	}
	gather := Gather{Kernel: gatherFn, Grid: 4, Block: 256, PlanHost: uintptr(planHost), PlanDev: planDev, PlanCap: live,
		Upload: upload, PlanUp: planUp, PlanBusy: planBusy}

	for i, mode := range []CopyMode{CopyPerEntry, CopyBatchV13000, CopyBatchV12080, CopyGather} {
		t.Run(mode.String(), func(t *testing.T) {
			g.bind(t)
			if err := d.MemsetD32Async(dst, 0, size/4, stream); err != nil {
				t.Fatal(err)
			}
			op, err := d.NewCopyOp(len(entries))
			if err != nil {
				t.Fatal(err)
			}
			defer op.Free()
			seq := uint64(100 + i)
			p := &Piece{Ctx: g.ctx, Stream: stream, Wait: wait, Mode: mode, Entries: entries, Doorbell: bell, Seq: seq, Done: done}
			if mode == CopyGather {
				p.Gather = gather
			}
			if err := op.Enqueue(p); err != nil {
				t.Fatalf("Enqueue: %v", err)
			}
			if err := d.StreamSynchronize(stream); err != nil {
				t.Fatal(err)
			}
			if ok, err := d.QueryEvent(g.ctx, done); !ok || err != nil {
				t.Fatalf("QueryEvent(done) = %v, %v", ok, err)
			}
			got := make([]byte, size)
			if err := d.MemcpyDtoH(got, dst); err != nil {
				t.Fatal(err)
			}
			exp := make([]byte, size)
			for _, e := range entries {
				s := e.Src - uint64(src)
				copy(exp[e.Dst-uint64(dst):], want[s:s+e.Len])
			}
			if !bytes.Equal(got, exp) {
				t.Fatalf("%v: the destination differs from the entries' sources", mode)
			}
			b := make([]byte, 8)
			if err := d.MemcpyDtoH(b, bell); err != nil {
				t.Fatal(err)
			}
			if v := binary.LittleEndian.Uint64(b); v != seq {
				t.Fatalf("doorbell %d, want %d", v, seq)
			}
		})
	}

	// A Piece in parts, by the kernel that takes an uploaded plan and by
	// the one that takes it as its parameter: every byte lands, each part
	// word but the last's holds the seq, and cuts that do not fall between
	// entries, do not grow or do not end with the Piece are refused.
	inlineFn, err := d.ModuleGetFunction(mod, "pxn_gather_inline")
	if err != nil {
		t.Fatal(err)
	}
	var nonEmpty []BatchEntry
	var cuts []uint64
	var total uint64
	for _, e := range entries {
		if e.Len == 0 {
			continue
		}
		nonEmpty = append(nonEmpty, e)
		total += e.Len
		if len(nonEmpty)%10 == 0 {
			cuts = append(cuts, total)
		}
	}
	if cuts[len(cuts)-1] != total {
		cuts = append(cuts, total)
	}
	for _, inline := range []bool{false, true} {
		t.Run(fmt.Sprintf("parts, inline %v", inline), func(t *testing.T) {
			g.bind(t)
			if err := d.MemsetD32Async(dst, 0, size/4, stream); err != nil {
				t.Fatal(err)
			}
			op, err := d.NewCopyOp(len(nonEmpty))
			if err != nil {
				t.Fatal(err)
			}
			defer op.Free()
			words, arrived := g.alloc(t, 8*(MaxParts-1)), g.alloc(t, 4*MaxParts)
			pg := gather
			pg.Cuts, pg.PartWords, pg.Arrived = cuts, words, arrived
			if inline {
				// No staging at all: only the inline path can launch it.
				pg.Inline = inlineFn
				pg.PlanHost, pg.PlanDev, pg.Upload, pg.PlanUp, pg.PlanBusy = 0, 0, 0, 0, 0
			}
			const seq = 77
			p := &Piece{Ctx: g.ctx, Stream: stream, Mode: CopyGather, Entries: nonEmpty, Doorbell: bell, Seq: seq, Gather: pg}
			if err := op.Enqueue(p); err != nil {
				t.Fatalf("Enqueue: %v", err)
			}
			if err := d.StreamSynchronize(stream); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if err := d.MemcpyDtoH(got, dst); err != nil {
				t.Fatal(err)
			}
			for i, e := range nonEmpty {
				s := e.Src - uint64(src)
				if !bytes.Equal(got[e.Dst-uint64(dst):][:e.Len], want[s:s+e.Len]) {
					t.Fatalf("entry %d differs at the destination", i)
				}
			}
			w := make([]byte, 8*(MaxParts-1))
			if err := d.MemcpyDtoH(w, words); err != nil {
				t.Fatal(err)
			}
			for k := range MaxParts - 1 {
				want := uint64(0)
				if k < len(cuts)-1 {
					want = seq
				}
				if v := binary.LittleEndian.Uint64(w[8*k:]); v != want {
					t.Fatalf("part word %d = %d, want %d", k, v, want)
				}
			}
			// With arrival counters the kernel rings the doorbell itself
			// and no stream write follows: a driver whose stream memory
			// operations fail still rings it.
			t.Setenv("PXN_FAKECUDA_NO_MEMOPS", "1")
			if err := op.Enqueue(&Piece{Ctx: g.ctx, Stream: stream, Mode: CopyGather, Entries: nonEmpty, Doorbell: bell, Seq: seq + 1, Gather: pg}); err != nil {
				t.Fatalf("Enqueue with stream writes failing: %v", err)
			}
			b := make([]byte, 8)
			if err := d.MemcpyDtoH(b, bell); err != nil {
				t.Fatal(err)
			}
			if v := binary.LittleEndian.Uint64(b); v != seq+1 {
				t.Fatalf("doorbell = %d after the kernel, want %d", v, seq+1)
			}
			var pe *PieceError
			if err := op.Enqueue(&Piece{Ctx: g.ctx, Stream: stream, Mode: CopyPerEntry, Entries: nonEmpty, Doorbell: bell, Seq: seq + 2}); !errors.As(err, &pe) || !strings.HasPrefix(pe.Step, "cuStreamWriteValue64") {
				t.Fatalf("a copy-engine Piece with stream writes failing: %v, want a PieceError at the doorbell's stream write", err)
			}
			os.Unsetenv("PXN_FAKECUDA_NO_MEMOPS")
			// Cuts that grow and end with the Piece but fall inside an
			// entry pass the shim; the kernel's contract refuses them.
			for _, bad := range [][]uint64{{total - 1, total}, {cuts[1], cuts[0], total}, {cuts[0], cuts[1]}, {0, total}} {
				bg := pg
				bg.Cuts = bad
				var pe *PieceError
				err := op.Enqueue(&Piece{Ctx: g.ctx, Stream: stream, Mode: CopyGather, Entries: nonEmpty, Seq: seq, Gather: bg})
				if !errors.As(err, &pe) {
					t.Errorf("cuts %v: %v, want a PieceError", bad, err)
				}
			}
		})
	}

	t.Run("failures", func(t *testing.T) {
		g.bind(t)
		op, err := d.NewCopyOp(4)
		if err != nil {
			t.Fatal(err)
		}
		defer op.Free()
		err = op.Enqueue(&Piece{Stream: stream, Mode: CopyBatchV13000, Entries: entries})
		var pe *PieceError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), "the op holds 4") {
			t.Errorf("batch of %d entries on an op of 4: %v", len(entries), err)
		}
		var four []BatchEntry
		for _, e := range entries {
			if e.Len > 0 && len(four) < 4 {
				four = append(four, e)
			}
		}
		small := gather
		small.PlanCap = 3
		pe = nil
		err = op.Enqueue(&Piece{Stream: stream, Mode: CopyGather, Entries: four, Gather: small})
		if !errors.As(err, &pe) || pe.Index != 3 || !errors.Is(err, ErrorInvalidValue) || !strings.Contains(pe.Step, "gather kernel of 4 entries") {
			t.Errorf("gather of 4 live entries into a plan of 3: %v (%+v)", err, pe)
		}
		bad := []BatchEntry{{Src: uint64(src), Dst: uint64(dst), Len: 8}, {Src: 0, Dst: uint64(dst), Len: 8}}
		pe = nil
		err = op.Enqueue(&Piece{Stream: stream, Mode: CopyPerEntry, Entries: bad})
		if !errors.As(err, &pe) || pe.Index != 1 {
			t.Errorf("per-entry copy from NULL: %v", err)
		}
		pe = nil
		err = op.Enqueue(&Piece{Stream: stream, Mode: CopyBatchV12080, Entries: bad})
		if !errors.As(err, &pe) || pe.Index != 1 {
			t.Errorf("12.8 batch copy from NULL: %v", err)
		}
		zero := g.alloc(t, 8)
		if err := d.LaunchKernel(gatherFn, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, stream, uint64(planDev), uint64(zero), 0, uint64(zero), 1, 0, 0, 0, 0); err != nil {
			t.Errorf("gather of 0 entries: %v", err)
		}
		if err := d.LaunchKernel(gatherFn, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, stream, make([]uint64, MaxKernelArgs+1)...); err == nil {
			t.Errorf("a launch of %d arguments succeeded", MaxKernelArgs+1)
		}
		if _, err := d.ModuleGetFunction(mod, "no_such_kernel"); !errors.Is(err, ErrorNotFound) {
			t.Errorf("ModuleGetFunction(no_such_kernel): %v, want ErrorNotFound", err)
		}
	})
}

// TestShimOnFakeDriverSanitized runs TestShimOnFakeDriver in a test binary
// built with go build -asan, shim.c under ASan and UBSan, against the fake
// driver built with both: this package's tests otherwise run with -race,
// which cannot share a process with ASan.
func TestShimOnFakeDriverSanitized(t *testing.T) {
	if os.Getenv(fakeLibEnv) != "" {
		t.Skip("the sanitized run itself")
	}
	sanitize.Require(t, "gcc")
	dir := t.TempDir()
	lib := buildFake(t, dir, append(sanitize.CFlags(), sanitize.LDFlags()...)...)
	gocmd, err := sanitize.GoTool()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "cuda.test")
	build := exec.Command(gocmd, "test", "-c", "-o", bin, ".")
	build.Env = sanitize.GoEnv(os.Environ())
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c -asan: %v\n%s", err, out)
	}
	run := exec.Command(bin, "-test.run", "^TestShimOnFakeDriver$", "-test.count", "1", "-test.v")
	run.Env = sanitize.RunEnv(append(os.Environ(), fakeLibEnv+"="+lib))
	out, err := run.CombinedOutput()
	sanitize.Check(t, "cuda.test", string(out))
	if err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestShimOnFakeDriver ") {
		t.Fatalf("TestShimOnFakeDriver did not pass in the sanitized run:\n%s", out)
	}
}
