// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestAlignUp(t *testing.T) {
	for _, tc := range []struct{ n, g, want uint64 }{
		{0, 2 << 20, 0},
		{1, 2 << 20, 2 << 20},
		{1008 << 20, 2 << 20, 1008 << 20},
		{1008<<20 + 1, 2 << 20, 1010 << 20},
		{10, 3, 12},
		{^uint64(0) - 1, 1, ^uint64(0) - 1},
	} {
		got, err := AlignUp(tc.n, tc.g)
		if err != nil || got != tc.want {
			t.Errorf("AlignUp(%d, %d) = %d, %v; want %d", tc.n, tc.g, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ n, g uint64 }{{5, 0}, {^uint64(0) - 1, 1 << 21}} {
		if got, err := AlignUp(tc.n, tc.g); err == nil {
			t.Errorf("AlignUp(%d, %d) = %d, want an error", tc.n, tc.g, got)
		}
	}
}

// TestFDShareSupportMissingEntryPoint: a driver without the cuMem family
// is reported by name, as ErrNotAvailable, without calling anything.
func TestFDShareSupportMissingEntryPoint(t *testing.T) {
	g := openGPU(t, 0)
	for _, name := range []string{"cuMemCreate", "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle"} {
		err := g.d.withoutEntryPoint(name).FDShareSupport(g.dev)
		if !errors.Is(err, ErrNotAvailable) || !strings.Contains(err.Error(), name) {
			t.Errorf("without %s: FDShareSupport = %v", name, err)
		}
	}
	if _, err := g.d.withoutEntryPoint("cuMemImportFromShareableHandle").MemImportFD(0); !errors.Is(err, ErrNotAvailable) {
		t.Errorf("MemImportFD without its entry point: %v", err)
	}
}

// vmmArena is a test's cuMemCreate allocation mapped read-write on its
// device.
type vmmArena struct {
	h    MemHandle
	p    DevicePtr
	size uint64
}

func mapVMM(t testing.TB, g *gpu, n uint64) *vmmArena {
	t.Helper()
	prop := AllocationProp{Device: g.dev}
	gran, err := g.d.MemGetAllocationGranularity(prop, false)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := g.d.MemGetAllocationGranularity(prop, true)
	if err != nil {
		t.Fatal(err)
	}
	if gran == 0 || rec < gran || rec%gran != 0 {
		t.Fatalf("granularity %d, recommended %d", gran, rec)
	}
	size, err := AlignUp(n, gran)
	if err != nil {
		t.Fatal(err)
	}
	a := &vmmArena{size: size}
	if a.h, err = g.d.MemCreate(size, prop); err != nil {
		t.Fatal(err)
	}
	if a.p, err = g.d.MemAddressReserve(size, gran); err != nil {
		t.Fatal(err)
	}
	if err := g.d.MemMap(a.p, size, 0, a.h); err != nil {
		t.Fatal(err)
	}
	if err := g.d.MemSetAccess(a.p, size, g.dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := errors.Join(g.d.MemUnmap(a.p, size), g.d.MemAddressFree(a.p, size), g.d.MemRelease(a.h)); err != nil {
			t.Errorf("unmap: %v", err)
		}
	})
	return a
}

// TestVMMAcrossProcesses: a cuMemCreate allocation exported as a POSIX
// descriptor is imported, mapped and written by another process (on this
// GPU and, where there is one, another); its properties survive the trip.
func TestVMMAcrossProcesses(t *testing.T) {
	for _, peer := range []int{0, 1} {
		t.Run(fmt.Sprintf("child-on-device-%d", peer), func(t *testing.T) {
			g := openGPU(t, 0)
			if peer >= g.n {
				t.Skipf("skipping: needs %d CUDA devices, found %d", peer+1, g.n)
			}
			if err := g.d.FDShareSupport(g.dev); err != nil {
				t.Skipf("skipping: %v", err)
			}
			const n = 32 << 20
			a := mapVMM(t, g, n+1)
			if a.size <= n {
				t.Fatalf("%d bytes rounded up to %d", n+1, a.size)
			}
			if err := g.d.MemcpyHtoD(a.p, randomBytes(3, n)); err != nil {
				t.Fatal(err)
			}
			if mt, err := g.d.PointerMemoryType(a.p); err != nil || mt != MemoryDevice {
				t.Fatalf("memory type %v, %v", mt, err)
			}
			prop, err := g.d.MemAllocationProp(a.h)
			if err != nil || prop.Device != g.dev {
				t.Fatalf("properties %+v, %v", prop, err)
			}
			fd, err := g.d.MemExportFD(a.h)
			if err != nil {
				t.Fatal(err)
			}
			f := os.NewFile(uintptr(fd), "vmm")
			defer f.Close()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=vmm",
				"PXN_CUDA_TEST_DEVICE="+strconv.Itoa(peer), "PXN_CUDA_TEST_SIZE="+strconv.FormatUint(a.size, 10))
			cmd.ExtraFiles = []*os.File{f}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			got := make([]byte, n)
			if err := g.d.MemcpyDtoH(got, a.p); err != nil {
				t.Fatal(err)
			}
			if i := firstDiff(got, randomBytes(4, n)); i >= 0 {
				t.Fatalf("byte %d written by the child differs", i)
			}
		})
	}
}

func vmmChild() error {
	ordinal, _ := strconv.Atoi(os.Getenv("PXN_CUDA_TEST_DEVICE"))
	size, _ := strconv.ParseUint(os.Getenv("PXN_CUDA_TEST_SIZE"), 10, 64)
	const n = 32 << 20
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
	h, err := d.MemImportFD(3)
	if err != nil {
		return err
	}
	unix.Close(3)
	prop, err := d.MemAllocationProp(h)
	if err != nil {
		return err
	}
	gran, err := d.MemGetAllocationGranularity(prop, false)
	if err != nil {
		return err
	}
	p, err := d.MemAddressReserve(size, gran)
	if err != nil {
		return err
	}
	if err := d.MemMap(p, size, 0, h); err != nil {
		return err
	}
	// Mapping more than the allocation holds is refused: OpenFD relies on
	// it to turn down a peer's allocation smaller than the size it claims.
	if q, err := d.MemAddressReserve(size+gran, gran); err == nil {
		if d.MemMap(q, size+gran, 0, h) == nil {
			return errors.New("mapped more than the allocation")
		}
		d.MemAddressFree(q, size+gran)
	}
	if err := d.MemSetAccess(p, size, dev); err != nil {
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
	return errors.Join(d.MemUnmap(p, size), d.MemAddressFree(p, size), d.MemRelease(h))
}
