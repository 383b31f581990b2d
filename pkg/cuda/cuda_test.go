// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/testkernel"
)

// requireEnv makes a missing driver or GPU a failure instead of a skip: set
// it where the tests are meant to run on a GPU.
const requireEnv = "PXN_REQUIRE_GPU"

const childEnv = "PXN_CUDA_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		if err := runChild(role); err != nil {
			fmt.Fprintf(os.Stderr, "child %s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// gpu is a test's driver and a context current on the test's locked thread.
type gpu struct {
	d   *Driver
	dev Device
	ctx Context
	n   int
}

func loadDriver(t testing.TB) *Driver {
	t.Helper()
	d, err := Load()
	if err != nil {
		if os.Getenv(requireEnv) != "1" && (errors.Is(err, ErrNoDriver) || errors.Is(err, ErrorNoDevice)) {
			t.Skipf("skipping: %v", err)
		}
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(d.Close)
	return d
}

// openGPU loads the driver and binds device ordinal's primary context to
// the test goroutine's thread.
func openGPU(t testing.TB, ordinal int) *gpu {
	t.Helper()
	d := loadDriver(t)
	n, err := d.DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	if n <= ordinal {
		if ordinal == 0 && os.Getenv(requireEnv) == "1" {
			t.Fatalf("no CUDA device")
		}
		t.Skipf("skipping: needs %d CUDA devices, found %d", ordinal+1, n)
	}
	dev, err := d.DeviceGet(ordinal)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := d.PrimaryCtxRetain(dev)
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
		if err := d.PrimaryCtxRelease(dev); err != nil {
			t.Errorf("release: %v", err)
		}
	})
	return &gpu{d: d, dev: dev, ctx: ctx, n: n}
}

// bind makes the context current on a subtest's own goroutine: t.Run runs
// it on another goroutine, so another OS thread.
func (g *gpu) bind(t testing.TB) {
	t.Helper()
	runtime.LockOSThread()
	if err := g.d.CtxSetCurrent(g.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.d.CtxSetCurrent(0)
		runtime.UnlockOSThread()
	})
}

func (g *gpu) alloc(t testing.TB, n uint64) DevicePtr {
	t.Helper()
	p, err := g.d.MemAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.d.MemFree(p); err != nil {
			t.Errorf("free: %v", err)
		}
	})
	return p
}

func (g *gpu) stream(t testing.TB) Stream {
	t.Helper()
	s, err := g.d.StreamCreate(StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.d.StreamDestroy(s); err != nil {
			t.Errorf("stream destroy: %v", err)
		}
	})
	return s
}

func (g *gpu) event(t testing.TB) Event {
	t.Helper()
	e, err := g.d.EventCreate(EventDisableTiming)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.d.EventDestroy(e); err != nil {
			t.Errorf("event destroy: %v", err)
		}
	})
	return e
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	return b
}

func TestLoadMissingLibrary(t *testing.T) {
	_, err := LoadLibrary("libpxn-no-such-cuda.so.1")
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("err = %v, want ErrNoDriver", err)
	}
	if !strings.Contains(err.Error(), "libpxn-no-such-cuda.so.1 was not found") {
		t.Fatalf("error %q does not name the library", err)
	}
}

func TestErrorText(t *testing.T) {
	tests := []struct {
		err  *Error
		want string
		is   error
	}{
		{&Error{Call: "cuMemAlloc(64)", Code: ErrorOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY", Desc: "out of memory"},
			"cuda: cuMemAlloc(64): CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", ErrorOutOfMemory},
		{&Error{Call: "cuStreamWriteValue64", Code: NotAvailable}, "cuda: cuStreamWriteValue64: " + ErrNotAvailable.Error(), ErrNotAvailable},
		{&Error{Call: "cuInit(0)", Code: 999}, "cuda: cuInit(0): CUresult 999", Result(999)},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
		if !errors.Is(tt.err, tt.is) {
			t.Errorf("errors.Is(%v, %v) = false", tt.err, tt.is)
		}
	}
}

func TestLoad(t *testing.T) {
	d := loadDriver(t)
	if d.Version() < 11030 {
		t.Fatalf("driver version %d", d.Version())
	}
	missing := 0
	for _, s := range d.Symbols() {
		if !s.Loaded {
			missing++
		}
		t.Logf("%-28s %5d loaded=%v", s.Name, s.Version, s.Loaded)
	}
	for _, name := range []string{"cuMemAlloc", "cuMemcpyAsync", "cuIpcOpenMemHandle", "cuEventQuery", "cuStreamWaitEvent", "cuMemHostRegister"} {
		found := false
		for _, s := range d.Symbols() {
			if s.Name == name && s.Loaded {
				found = true
			}
		}
		if !found {
			t.Errorf("%s not loaded", name)
		}
	}
	if d.Version() >= 13000 && !d.HasBatchV13000() {
		t.Errorf("driver %d lacks the 13.0 cuMemcpyBatchAsync", d.Version())
	}
	if d.Version() >= 12080 && !d.HasBatchV12080() {
		t.Errorf("driver %d lacks the 12.8 cuMemcpyBatchAsync", d.Version())
	}
	t.Logf("driver %d, cuGetProcAddress_v2=%v, %d entry points missing, best copy mode %v", d.Version(), d.ProcAddressV2(), missing, d.BestCopyMode())
}

func TestMissingEntryPoint(t *testing.T) {
	g := openGPU(t, 0)
	old := g.d.withoutEntryPoint("cuMemAlloc")
	defer old.Close()
	_, err := old.MemAlloc(4096)
	if !errors.Is(err, ErrNotAvailable) {
		t.Fatalf("MemAlloc without cuMemAlloc: err = %v, want ErrNotAvailable", err)
	}
	if !strings.Contains(err.Error(), "cuMemAlloc") {
		t.Fatalf("error %q does not name the call", err)
	}
	nb := g.d.withoutEntryPoint("cuMemcpyBatchAsync")
	defer nb.Close()
	if nb.BestCopyMode() != CopyPerEntry {
		t.Fatalf("without batch entry points BestCopyMode = %v", nb.BestCopyMode())
	}
}

func TestDeviceInfo(t *testing.T) {
	g := openGPU(t, 0)
	name, err := g.d.DeviceName(g.dev)
	if err != nil {
		t.Fatal(err)
	}
	bus, err := g.d.DevicePCIBusID(g.dev)
	if err != nil {
		t.Fatal(err)
	}
	ua, err := g.d.DeviceAttribute(AttrUnifiedAddressing, g.dev)
	if err != nil {
		t.Fatal(err)
	}
	if ua != 1 {
		t.Fatalf("unified addressing = %d", ua)
	}
	memops, _ := g.d.DeviceAttribute(AttrCanUseStreamMemOpsV1, g.dev)
	memops64, _ := g.d.DeviceAttribute(AttrCanUse64BitStreamMemOpsV1, g.dev)
	hostPtr, _ := g.d.DeviceAttribute(AttrCanUseHostPointerForRegistered, g.dev)
	t.Logf("device %d: %s at %s, %d devices, CAN_USE_STREAM_MEM_OPS_V1=%d 64BIT=%d CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM=%d",
		g.dev, name, bus, g.n, memops, memops64, hostPtr)
	cur, err := g.d.CtxGetCurrent()
	if err != nil || cur != g.ctx {
		t.Fatalf("current context %#x, %v; want %#x", cur, err, g.ctx)
	}
}

func TestAllocCopyEvents(t *testing.T) {
	g := openGPU(t, 0)
	const n = 64 << 20
	a, b := g.alloc(t, n), g.alloc(t, n)
	want := randomBytes(1, n)
	if err := g.d.MemcpyHtoD(a, want); err != nil {
		t.Fatal(err)
	}
	s := g.stream(t)
	ev := g.event(t)
	if err := g.d.MemcpyDtoDAsync(b, a, n/2, s); err != nil {
		t.Fatal(err)
	}
	if err := g.d.MemcpyAsync(b+n/2, a+n/2, n/2, s); err != nil {
		t.Fatal(err)
	}
	if err := g.d.RecordEvent(g.ctx, ev, s); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		done, err := g.d.QueryEvent(g.ctx, ev)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("copy event did not complete in 10 s")
		}
	}
	got := make([]byte, n)
	if err := g.d.MemcpyDtoH(got, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("device copy differs from the source")
	}
	if err := g.d.MemsetD32Async(b, 0xa5a5a5a5, n/4, s); err != nil {
		t.Fatal(err)
	}
	if err := g.d.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	if err := g.d.MemcpyDtoH(got[:4096], b+n-4096); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:4096], bytes.Repeat([]byte{0xa5}, 4096)) {
		t.Fatal("memset did not land")
	}
}

// entryCase builds scattered entries over a source and a destination of n
// bytes: varied lengths, some empty, none overlapping in the destination.
func entryCase(seed uint64, n, count int) []BatchEntry {
	r := rand.New(rand.NewPCG(seed, 7))
	var out []BatchEntry
	slot := n / count
	for i := 0; i < count; i++ {
		l := r.IntN(slot)
		if i%9 == 4 {
			l = 0
		}
		out = append(out, BatchEntry{
			Src: uint64(r.IntN(n - l + 1)),
			Dst: uint64(i*slot + r.IntN(slot-l+1)),
			Len: uint64(l),
		})
	}
	return out
}

func TestCopyModes(t *testing.T) {
	g := openGPU(t, 0)
	const n = 8 << 20
	src, dst := g.alloc(t, n), g.alloc(t, n)
	srcBytes := randomBytes(2, n)
	if err := g.d.MemcpyHtoD(src, srcBytes); err != nil {
		t.Fatal(err)
	}
	s := g.stream(t)
	done := g.event(t)
	op, err := g.d.NewCopyOp(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Free()
	for _, mode := range []CopyMode{CopyPerEntry, CopyBatchV13000, CopyBatchV12080} {
		for _, count := range []int{1, 3, 64, 4096} {
			t.Run(fmt.Sprintf("%v/%d", mode, count), func(t *testing.T) {
				if !g.d.Supports(mode) {
					t.Skipf("skipping: driver %d lacks %v", g.d.Version(), mode)
				}
				g.bind(t)
				zero := make([]byte, n)
				if err := g.d.MemcpyHtoD(dst, zero); err != nil {
					t.Fatal(err)
				}
				rel := entryCase(uint64(count)*31+uint64(mode), n, count)
				ents := make([]BatchEntry, len(rel))
				want := make([]byte, n)
				for i, e := range rel {
					ents[i] = BatchEntry{Src: uint64(src) + e.Src, Dst: uint64(dst) + e.Dst, Len: e.Len}
					copy(want[e.Dst:e.Dst+e.Len], srcBytes[e.Src:e.Src+e.Len])
				}
				if err := op.Enqueue(&Piece{Ctx: g.ctx, Stream: s, Mode: mode, Entries: ents, Done: done}); err != nil {
					t.Fatal(err)
				}
				if err := g.d.eventSynchronize(done); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, n)
				if err := g.d.MemcpyDtoH(got, dst); err != nil {
					t.Fatal(err)
				}
				if i := firstDiff(got, want); i >= 0 {
					t.Fatalf("byte %d differs: got %#x want %#x", i, got[i], want[i])
				}
			})
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// hostPage maps one anonymous page and registers it for the device.
func hostPage(t testing.TB, g *gpu) ([]byte, DevicePtr) {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	base := uintptr(unsafe.Pointer(&mem[0]))
	if err := g.d.MemHostRegister(base, 4096, HostRegisterDeviceMap|HostRegisterPortable); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.d.MemHostUnregister(base); err != nil {
			t.Errorf("unregister: %v", err)
		}
		unix.Munmap(mem)
	})
	dp, err := g.d.MemHostGetDevicePointer(base)
	if err != nil {
		t.Fatal(err)
	}
	return mem, dp
}

func TestStreamWriteValue64(t *testing.T) {
	g := openGPU(t, 0)
	mem, dp := hostPage(t, g)
	word := (*uint64)(unsafe.Pointer(&mem[64]))
	s := g.stream(t)
	const v = 0x0123456789abcdef
	if err := g.d.StreamWriteValue64(s, dp+64, v, StreamWriteValueDefault); err != nil {
		t.Fatal(err)
	}
	if err := g.d.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	if got := atomic.LoadUint64(word); got != v {
		t.Fatalf("host word = %#x, want %#x", got, v)
	}
}

func TestClassify(t *testing.T) {
	g := openGPU(t, 0)
	p := g.alloc(t, 1<<20)
	mem, _ := hostPage(t, g)
	heap := make([]byte, 4096)
	tests := []struct {
		name string
		p    DevicePtr
		n    uint64
		want MemoryType
	}{
		{"device", p, 1 << 20, MemoryDevice},
		{"device interior", p + 4096, 8192, MemoryDevice},
		{"device past its allocation", p + 4096, 1 << 20, MemoryHost},
		{"registered host", DevicePtr(uintptr(unsafe.Pointer(&mem[0]))), 64, MemoryHost},
		{"unregistered host", DevicePtr(uintptr(unsafe.Pointer(&heap[0]))), 64, MemoryHost},
		{"null", 0, 8, MemoryHost},
	}
	for _, tt := range tests {
		if got := g.d.Classify(0, tt.p, tt.n); got != tt.want {
			t.Errorf("%s: Classify = %d, want %d", tt.name, got, tt.want)
		}
		// The allocation holds the range, and is the one made above.
		got, start, size := g.d.ClassifyRange(0, tt.p, tt.n)
		held := start <= tt.p && uint64(tt.p-start)+tt.n <= size
		if got != tt.want || (got == MemoryDevice && (start != p || !held)) || (got != MemoryDevice && (start != 0 || size != 0)) {
			t.Errorf("%s: ClassifyRange = %d, %#x+%d, want %d (allocation %#x)", tt.name, got, start, size, tt.want, p)
		}
	}
	if mt, err := g.d.PointerMemoryType(p); err != nil || mt != MemoryDevice {
		t.Errorf("PointerMemoryType(device) = %d, %v", mt, err)
	}
	if mt, err := g.d.PointerMemoryType(DevicePtr(uintptr(unsafe.Pointer(&mem[0])))); err != nil || mt != MemoryHost {
		t.Errorf("PointerMemoryType(registered host) = %d, %v", mt, err)
	}
	if _, err := g.d.PointerMemoryType(DevicePtr(uintptr(unsafe.Pointer(&heap[0])))); err == nil {
		t.Errorf("PointerMemoryType(unregistered host) succeeded")
	}
	runtime.KeepAlive(heap)
}

// TestSpinKernelHoldsStream launches the spin kernel and proves that work
// ordered behind it waits for the host's flag.
func TestSpinKernelHoldsStream(t *testing.T) {
	g := openGPU(t, 0)
	mod, err := g.d.ModuleLoadData([]byte(testkernel.SpinKernelPTX))
	if err != nil {
		t.Fatal(err)
	}
	defer g.d.ModuleUnload(mod)
	fn, err := g.d.ModuleGetFunction(mod, testkernel.SpinKernelName)
	if err != nil {
		t.Fatal(err)
	}
	mem, dp := hostPage(t, g)
	flag := (*uint32)(unsafe.Pointer(&mem[0]))
	defer atomic.StoreUint32(flag, 1)
	a, b := g.stream(t), g.stream(t)
	held, after := g.event(t), g.event(t)
	if err := g.d.LaunchKernel(fn, Dim3{1, 1, 1}, Dim3{1, 1, 1}, 0, a, uint64(dp)); err != nil {
		t.Fatal(err)
	}
	if err := g.d.EventRecord(held, a); err != nil {
		t.Fatal(err)
	}
	if err := g.d.StreamWaitEvent(b, held); err != nil {
		t.Fatal(err)
	}
	if err := g.d.EventRecord(after, b); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
		if done, err := g.d.EventQuery(after); err != nil || done {
			t.Fatalf("event behind the spinning kernel: done=%v err=%v", done, err)
		}
	}
	atomic.StoreUint32(flag, 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		done, err := g.d.EventQuery(after)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("kernel did not see the flag in 10 s")
		}
	}
}

// TestIPCAcrossProcesses exports an allocation and has another process,
// on the same GPU and on another, read it and write it back.
func TestIPCAcrossProcesses(t *testing.T) {
	for _, peer := range []int{0, 1} {
		t.Run(fmt.Sprintf("child-on-device-%d", peer), func(t *testing.T) {
			g := openGPU(t, 0)
			if peer >= g.n {
				t.Skipf("skipping: needs %d CUDA devices, found %d", peer+1, g.n)
			}
			const n = 32 << 20
			p := g.alloc(t, n)
			if err := g.d.MemcpyHtoD(p, randomBytes(3, n)); err != nil {
				t.Fatal(err)
			}
			h, err := g.d.IPCGetMemHandle(p)
			if err != nil {
				t.Fatal(err)
			}
			if own, err := g.d.IPCOpenMemHandle(h, IPCLazyEnablePeerAccess); err == nil {
				g.d.IPCCloseMemHandle(own)
				t.Fatal("opening our own IPC handle succeeded")
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=ipc",
				"PXN_CUDA_TEST_DEVICE="+strconv.Itoa(peer),
				"PXN_CUDA_TEST_HANDLE="+hex.EncodeToString(h[:]),
				"PXN_CUDA_TEST_SIZE="+strconv.Itoa(n))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			got := make([]byte, n)
			if err := g.d.MemcpyDtoH(got, p); err != nil {
				t.Fatal(err)
			}
			if i := firstDiff(got, randomBytes(4, n)); i >= 0 {
				t.Fatalf("byte %d written by the child differs", i)
			}
		})
	}
}

func runChild(role string) error {
	switch role {
	case "ipc":
		return ipcChild()
	case "vmm":
		return vmmChild()
	}
	return fmt.Errorf("unknown role %q", role)
}

func ipcChild() error {
	ordinal, _ := strconv.Atoi(os.Getenv("PXN_CUDA_TEST_DEVICE"))
	n, _ := strconv.Atoi(os.Getenv("PXN_CUDA_TEST_SIZE"))
	raw, err := hex.DecodeString(os.Getenv("PXN_CUDA_TEST_HANDLE"))
	if err != nil || len(raw) != 64 {
		return fmt.Errorf("bad handle: %v", err)
	}
	var h IPCMemHandle
	copy(h[:], raw)
	d, err := Load()
	if err != nil {
		return err
	}
	dev, err := d.DeviceGet(ordinal)
	if err != nil {
		return err
	}
	ctx, err := d.PrimaryCtxRetain(dev)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	if err := d.CtxSetCurrent(ctx); err != nil {
		return err
	}
	p, err := d.IPCOpenMemHandle(h, IPCLazyEnablePeerAccess)
	if err != nil {
		return err
	}
	got := make([]byte, n)
	if err := d.MemcpyDtoH(got, p); err != nil {
		return err
	}
	if i := firstDiff(got, randomBytes(3, n)); i >= 0 {
		return fmt.Errorf("byte %d of the peer's allocation differs", i)
	}
	if err := d.MemcpyHtoD(p, randomBytes(4, n)); err != nil {
		return err
	}
	return d.IPCCloseMemHandle(p)
}

// TestMemInfoAndAsyncUpload: cuMemGetInfo, and cuMemcpyHtoDAsync from
// pinned host memory given as an address (how the gather plan travels).
func TestMemInfoAndAsyncUpload(t *testing.T) {
	g := openGPU(t, 0)
	d := g.d
	free, total, err := d.MemGetInfo()
	if err != nil {
		t.Fatal(err)
	}
	if free == 0 || free > total {
		t.Fatalf("cuMemGetInfo: free %d of %d", free, total)
	}
	const n = 1 << 20
	host, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(host)
	for i := range host {
		host[i] = byte(i * 13)
	}
	hp := uintptr(unsafe.Pointer(&host[0]))
	if err := d.MemHostRegister(hp, n, HostRegisterPortable); err != nil {
		t.Fatal(err)
	}
	defer d.MemHostUnregister(hp)
	p, err := d.MemAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.MemFree(p)
	s, err := d.StreamCreate(StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer d.StreamDestroy(s)
	if err := d.MemcpyHtoDAsync(p, hp, n, s); err != nil {
		t.Fatal(err)
	}
	if err := d.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := d.MemcpyDtoH(got, p); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, host) {
		t.Fatal("uploaded bytes differ")
	}
	if PlanBytes(4096) != 4096*24+4097*8 || PlanBytes(0) != 8 {
		t.Fatalf("PlanBytes(4096) = %d", PlanBytes(4096))
	}
}
