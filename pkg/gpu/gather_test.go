// SPDX-License-Identifier: Apache-2.0

package gpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/testkernel"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

func TestParseGatherMode(t *testing.T) {
	tests := []struct {
		in   string
		want gpu.GatherMode
		bad  bool
	}{
		{"", gpu.GatherAuto, false},
		{"auto", gpu.GatherAuto, false},
		{"ce", gpu.GatherCE, false},
		{" sm ", gpu.GatherSM, false},
		{"SM", gpu.GatherAuto, true},
		{"kernel", gpu.GatherAuto, true},
	}
	for _, tt := range tests {
		got, err := gpu.ParseGatherMode(tt.in)
		if got != tt.want || (err != nil) != tt.bad {
			t.Errorf("ParseGatherMode(%q) = %v, %v", tt.in, got, err)
		}
	}
}

// gatherLayout is a Piece's entries as offsets: len bytes from src offset
// to dst offset.
type gatherLayout struct {
	name string
	ents [][3]uint64
}

func gatherLayouts() []gatherLayout {
	var out []gatherLayout
	reversed := func(name string, n int, size uint64) gatherLayout {
		l := gatherLayout{name: name}
		for i := 0; i < n; i++ {
			l.ents = append(l.ents, [3]uint64{uint64(n-1-i) * size, uint64(i) * size, size})
		}
		return l
	}
	out = append(out, reversed("4096 x 2KiB", 4096, 2<<10), reversed("512 x 16KiB", 512, 16<<10),
		reversed("8 x 1MiB", 8, 1<<20), reversed("one 8MiB", 1, 8<<20), reversed("one 16B", 1, 16))
	rng := rand.New(rand.NewPCG(7, 11))
	for _, c := range []struct {
		name    string
		n       int
		maxLen  int
		aligned bool
		zeros   bool
	}{
		{"odd lengths, co-aligned", 700, 20000, true, false},
		{"odd lengths, misaligned", 300, 9000, false, false},
		{"with empty entries", 1000, 3000, true, true},
		{"tiny entries", 4096, 40, false, false},
	} {
		l := gatherLayout{name: c.name}
		var dst uint64
		for i := 0; i < c.n; i++ {
			n := uint64(rng.IntN(c.maxLen) + 1)
			if c.zeros && i%3 == 1 {
				n = 0
			}
			src := uint64(rng.IntN(4<<20)) &^ 15
			if c.aligned {
				src += dst % 16
			} else {
				src += uint64(rng.IntN(16))
			}
			l.ents = append(l.ents, [3]uint64{src, dst, n})
			dst += n
		}
		out = append(out, l)
	}
	return out
}

// TestGatherCopy moves Pieces of many shapes with the SM kernel and checks
// every byte of the destination, including those no entry covers.
func TestGatherCopy(t *testing.T) {
	g := openGPU(t)
	d := g.Driver()
	const n = 16 << 20
	src, dst := alloc(t, g, n), alloc(t, g, n)
	srcHost := make([]byte, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range srcHost {
		srcHost[i] = byte(rng.Uint32())
	}
	if err := d.MemcpyHtoD(src, srcHost); err != nil {
		t.Fatal(err)
	}
	for _, shape := range [][3]int{{0, 0, 0}, {1, 32, 2}, {16, 512, 1}, {8, 1024, 2}} {
		t.Run(fmt.Sprintf("grid-%d-block-%d-streams-%d", shape[0], shape[1], shape[2]), func(t *testing.T) {
			// A subtest runs on its own goroutine: bind the context there.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := d.CtxSetCurrent(g.Context()); err != nil {
				t.Fatal(err)
			}
			c := newCopier(t, g, gpu.CopierOptions{Gather: gpu.GatherSM, GatherBlocks: shape[0], GatherThreads: shape[1], GatherStreams: shape[2]})
			word := hostWord(t, c)
			got := make([]byte, n)
			seq := uint64(0)
			for _, l := range gatherLayouts() {
				fill(t, g, dst, 0xeeeeeeee, n)
				want := bytes.Repeat([]byte{0xee}, n)
				ents := make([]relay.CopyEntry, len(l.ents))
				for i, e := range l.ents {
					ents[i] = relay.CopyEntry{Src: uintptr(src) + uintptr(e[0]), Dst: uintptr(dst) + uintptr(e[1]), Len: e[2]}
					copy(want[e[1]:e[1]+e[2]], srcHost[e[0]:e[0]+e[2]])
				}
				seq++
				if err := c.Copy(3, 0, ents, word, seq); err != nil {
					t.Fatalf("%s: %v", l.name, err)
				}
				waitWord(t, c, word, seq)
				if err := d.MemcpyDtoH(got, dst); err != nil {
					t.Fatal(err)
				}
				if i := firstDiff(got, want); i >= 0 {
					t.Fatalf("%s: byte %d is %#x, want %#x", l.name, i, got[i], want[i])
				}
			}
			if st := c.Stats(); st.SMPieces != seq {
				t.Fatalf("%d of %d Pieces by the SM kernel", st.SMPieces, seq)
			}
		})
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

func waitWord(t testing.TB, c *gpu.Copier, word *uint64, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for atomic.LoadUint64(word) != seq {
		if _, err := c.Poll(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("doorbell is %d, want %d", atomic.LoadUint64(word), seq)
		}
	}
}

// TestGatherAuto: the automatic choice follows the mean entry length, a
// forced copy-engine form never uses the kernel, and ce never does.
func TestGatherAuto(t *testing.T) {
	g := openGPU(t)
	src, dst := alloc(t, g, 8<<20), alloc(t, g, 8<<20)
	piece := func(n int) []relay.CopyEntry {
		size := uint64(8<<20) / uint64(n)
		ents := make([]relay.CopyEntry, n)
		for i := range ents {
			ents[i] = relay.CopyEntry{Src: uintptr(src) + uintptr(uint64(i)*size), Dst: uintptr(dst) + uintptr(uint64(i)*size), Len: size}
		}
		return ents
	}
	tests := []struct {
		name    string
		opts    gpu.CopierOptions
		entries int
		sm      bool
	}{
		{"auto, 4096 x 2KiB", gpu.CopierOptions{}, 4096, true},
		{"auto, 64 x 128KiB", gpu.CopierOptions{}, 64, true},
		{"auto, 8 x 1MiB", gpu.CopierOptions{}, 8, false},
		{"auto, one 8MiB", gpu.CopierOptions{}, 1, false},
		{"auto, threshold 64KiB, 64 x 128KiB", gpu.CopierOptions{GatherThreshold: 64 << 10}, 64, false},
		{"ce, 4096 x 2KiB", gpu.CopierOptions{Gather: gpu.GatherCE}, 4096, false},
		{"auto with a forced batch form, 4096 x 2KiB", gpu.CopierOptions{Copy: gpu.CopyPerEntry}, 4096, false},
		{"sm, one 8MiB", gpu.CopierOptions{Gather: gpu.GatherSM}, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCopier(t, g, tt.opts)
			if tt.sm && c.Gather().Mode == gpu.GatherCE {
				t.Fatalf("kernel not loaded: %s", c.Gather().Reason)
			}
			word := hostWord(t, c)
			if err := c.Copy(0, 0, piece(tt.entries), word, 1); err != nil {
				t.Fatal(err)
			}
			waitWord(t, c, word, 1)
			if got := c.Stats().SMPieces == 1; got != tt.sm {
				t.Fatalf("SM kernel used: %v, want %v (%+v)", got, tt.sm, c.Gather())
			}
		})
	}
}

// TestGatherPlanBusy: a Piece whose ring slot still holds a plan that has
// not been uploaded (its predecessor waits for its source) is refused with
// nothing enqueued, and both complete once the source is ready. Plans small
// enough to go inline have no staging to guard, so the copier here uploads
// every plan.
func TestGatherPlanBusy(t *testing.T) {
	g := openGPU(t)
	d := g.Driver()
	c := newCopier(t, g, gpu.CopierOptions{Gather: gpu.GatherSM, NoInlinePlan: true})
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
	caller, err := d.StreamCreate(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer d.StreamDestroy(caller)
	if err := d.LaunchKernel(spin, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 1, Y: 1, Z: 1}, 0, caller, uint64(flagDev)); err != nil {
		t.Fatal(err)
	}
	ready, err := c.RecordReady(uintptr(caller))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(ready)
	src, dst := alloc(t, g, 1<<20), alloc(t, g, 1<<20)
	ents := []relay.CopyEntry{{Src: uintptr(src), Dst: uintptr(dst), Len: 4096}, {Src: uintptr(src) + 8192, Dst: uintptr(dst) + 4096, Len: 4096}}
	word, word2 := hostWord(t, c), hostWord(t, c)
	if err := c.Copy(5, ready, ents, word, 1); err != nil {
		t.Fatal(err)
	}
	next := uint64(1 + staging.SlotsPerLane)
	if err := c.Copy(5, 0, ents, word2, next); !errors.Is(err, gpu.ErrLaneFull) {
		t.Fatalf("Copy into a slot whose plan is pending: %v", err)
	}
	atomic.StoreUint32(flag, 1)
	waitWord(t, c, word, 1)
	if err := c.Copy(5, 0, ents, word2, next); err != nil {
		t.Fatal(err)
	}
	waitWord(t, c, word2, next)
	runtime.KeepAlive(flagMem)
}

// hostLine is a ready line (doorbell and part words) in host memory the
// copier may write.
func hostLine(t testing.TB, c *gpu.Copier) *staging.ReadyWord {
	return (*staging.ReadyWord)(hostBytes(t, c, 256))
}

// TestGatherParts: the SM kernel copies a Piece part after part and stores
// the seq into each part's word, the last part being the doorbell's. The
// test reads each part of the destination as soon as its word shows the
// seq, while the kernel may still copy the later ones, and finds it whole.
// A Piece the copy engines move signals its doorbell only.
func TestGatherParts(t *testing.T) {
	g := openGPU(t)
	d := g.Driver()
	const block, n = 2 << 10, 4096
	src, dst := alloc(t, g, n*block), alloc(t, g, n*block)
	srcHost := make([]byte, n*block)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range srcHost {
		srcHost[i] = byte(rng.Uint32())
	}
	if err := d.MemcpyHtoD(src, srcHost); err != nil {
		t.Fatal(err)
	}
	ents := make([]relay.CopyEntry, n)
	plans := make([]staging.PlanEntry, n)
	want := make([]byte, n*block)
	for i := range ents {
		s := uint64(n-1-i) * block
		ents[i] = relay.CopyEntry{Src: uintptr(src) + uintptr(s), Dst: uintptr(dst) + uintptr(i*block), Len: block}
		plans[i] = staging.PlanEntry{Dst: uint64(i * block), Len: block}
		copy(want[i*block:(i+1)*block], srcHost[s:s+block])
	}
	ends := staging.CutParts(nil, plans, n*block, staging.MaxParts)
	if len(ends) != staging.MaxParts-1 {
		t.Fatalf("cut in %d parts, want %d", len(ends)+1, staging.MaxParts)
	}
	t.Run("sm", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := d.CtxSetCurrent(g.Context()); err != nil {
			t.Fatal(err)
		}
		// One warp copies the 8 MiB, so the kernel runs long enough for
		// the part words to be seen while it still copies (logged; the
		// order itself is the kernel's, not a matter of timing).
		c := newCopier(t, g, gpu.CopierOptions{Gather: gpu.GatherSM, GatherBlocks: 1, GatherThreads: 32})
		if !c.GPUDoorbell() {
			t.Skip("no GPU doorbell here: part words are GPU stores")
		}
		for rep := uint64(1); rep <= 3; rep++ {
			fill(t, g, dst, 0xeeeeeeee, n*block)
			line := hostLine(t, c)
			seq := 7 * rep
			if err := c.CopyParts(2, 0, ents, ends, &line.Seq, &line.Parts, seq); err != nil {
				t.Fatal(err)
			}
			early := 0
			got := make([]byte, block*int(ends[0]))
			for p := range ends {
				deadline := time.Now().Add(20 * time.Second)
				for atomic.LoadUint64(&line.Parts[p]) != seq {
					if time.Now().After(deadline) {
						t.Fatalf("part word %d is %d, want %d", p, atomic.LoadUint64(&line.Parts[p]), seq)
					}
				}
				if atomic.LoadUint64(&line.Seq) != seq {
					early++
				}
				from, to := uint64(0), uint64(ends[p])*block
				if p > 0 {
					from = uint64(ends[p-1]) * block
				}
				part := got[:to-from]
				if err := d.MemcpyDtoH(part, dst+cuda.DevicePtr(from)); err != nil {
					t.Fatal(err)
				}
				if i := firstDiff(part, want[from:to]); i >= 0 {
					t.Fatalf("part %d read once its word showed the seq: byte %d is %#x, want %#x", p, int(from)+i, part[i], want[int(from)+i])
				}
			}
			waitWord(t, c, &line.Seq, seq)
			whole := make([]byte, n*block)
			if err := d.MemcpyDtoH(whole, dst); err != nil {
				t.Fatal(err)
			}
			if i := firstDiff(whole, want); i >= 0 {
				t.Fatalf("byte %d is %#x, want %#x", i, whole[i], want[i])
			}
			t.Logf("round %d: %d of %d part words seen before the doorbell", rep, early, len(ends))
		}
		if st := c.Stats(); st.PartPieces != 3 || st.SMPieces != 3 {
			t.Fatalf("%d Pieces in parts, %d by the kernel; want 3 and 3", st.PartPieces, st.SMPieces)
		}
	})
	t.Run("ce", func(t *testing.T) {
		c := newCopier(t, g, gpu.CopierOptions{Gather: gpu.GatherCE})
		line := hostLine(t, c)
		if err := c.CopyParts(2, 0, ents, ends, &line.Seq, &line.Parts, 9); err != nil {
			t.Fatal(err)
		}
		waitWord(t, c, &line.Seq, 9)
		for p := range line.Parts {
			if atomic.LoadUint64(&line.Parts[p]) != 0 {
				t.Fatalf("copy engines wrote part word %d", p)
			}
		}
		if st := c.Stats(); st.PartPieces != 0 {
			t.Fatalf("%d Pieces in parts by the copy engines", st.PartPieces)
		}
	})
	t.Run("bad ends", func(t *testing.T) {
		c := newCopier(t, g, gpu.CopierOptions{Gather: gpu.GatherSM})
		if !c.GPUDoorbell() {
			t.Skip("no GPU doorbell here: part ends are checked where the kernel signals them")
		}
		line := hostLine(t, c)
		for _, bad := range [][]uint32{{0}, {n}, {5, 5}, {1, 2, 3, 4, 5, 6, 7, 8}} {
			if err := c.CopyParts(2, 0, ents, bad, &line.Seq, &line.Parts, 11); err == nil {
				t.Fatalf("part ends %v accepted", bad)
			}
		}
	})
}
