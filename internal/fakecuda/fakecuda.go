// SPDX-License-Identifier: Apache-2.0

// Package fakecuda builds the stand-in CUDA driver of the binding's tests
// (pkg/cuda/testdata/fakecuda.c: device memory is host memory, every
// call has completed when it returns) for tests that drive the binding, or
// what sits on it, on a machine without a GPU. Only tests import it.
package fakecuda

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/testtools"
)

// Environment the fake driver reads, and the one its tests pass a library
// built already through.
const (
	// LibEnv names a fake driver library built already (a sanitized run's).
	LibEnv = "PXN_FAKECUDA_LIB"
	// VersionEnv sets the driver version cuDriverGetVersion reports and
	// the entry points cuGetProcAddress_v2 hands out (default 13000).
	VersionEnv = "PXN_FAKECUDA_VERSION"
	// InitEnv makes cuInit return the result it names.
	InitEnv = "PXN_FAKECUDA_INIT"
	// VMMEnv, set to 1, makes the driver hand out the virtual memory
	// calls (cuMemCreate and the rest, POSIX descriptors only), which a
	// driver without them lacks.
	VMMEnv = "PXN_FAKECUDA_VMM"
	// CallsEnv names the file the driver counts its calls in (Calls).
	CallsEnv = "PXN_FAKECUDA_CALLS"
)

// Source is the path of fakecuda.c.
func Source() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "pkg", "cuda", "testdata", "fakecuda.c")
}

// Build compiles the fake driver into dir with extra compiler flags and
// returns the library's path. Without gcc the test skips, or fails under
// PXN_REQUIRE_TOOLS=1.
func Build(t testing.TB, dir string, flags ...string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		testtools.Missing(t, "gcc not found in PATH: the fake driver is C: %v", err)
	}
	lib := filepath.Join(dir, "libfakecuda.so")
	args := append([]string{"-std=c11", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror"}, flags...)
	args = append(args, Source(), "-lpthread", "-o", lib)
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return lib
}

// Calls are the fake driver's call counts, which it keeps in a file while
// CallsEnv names it: a record per entry point, in the order of its entry
// table, each the name it is handed out by (56 bytes, NUL-padded) and a
// count of the calls since the driver's cuInit.
type Calls struct {
	path string
	mem  []byte
}

// callRecord is the size of a record of the counts file.
const callRecord = 64

// CountCalls makes the next load of the fake driver (its cuInit) count its
// calls in a file of t's: call it before cuda.LoadLibrary, and read the
// counts after the load.
func CountCalls(t testing.TB) *Calls {
	t.Helper()
	c := &Calls{path: filepath.Join(t.TempDir(), "calls")}
	t.Setenv(CallsEnv, c.path)
	t.Cleanup(func() {
		if c.mem != nil {
			_ = unix.Munmap(c.mem)
		}
	})
	return c
}

// Counts returns the count of every entry point called at least once, by
// name; the forms of one name are added up. It fails t when the driver
// has not made the file (it was loaded before CountCalls).
func (c *Calls) Counts(t testing.TB) map[string]uint64 {
	t.Helper()
	c.mapFile(t)
	counts := map[string]uint64{}
	for off := 0; off+callRecord <= len(c.mem); off += callRecord {
		name, _, _ := bytes.Cut(c.mem[off:off+callRecord-8], []byte{0})
		if n := c.count(off); n > 0 {
			counts[string(name)] += n
		}
	}
	return counts
}

// Total is the count of every call so far; unlike Counts it allocates
// nothing once the file is mapped.
func (c *Calls) Total(t testing.TB) uint64 {
	t.Helper()
	c.mapFile(t)
	var n uint64
	for off := 0; off+callRecord <= len(c.mem); off += callRecord {
		n += c.count(off)
	}
	return n
}

func (c *Calls) count(off int) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&c.mem[off+callRecord-8])))
}

func (c *Calls) mapFile(t testing.TB) {
	t.Helper()
	if c.mem == nil {
		f, err := os.Open(c.path)
		if err != nil {
			t.Fatalf("the fake driver keeps no call counts (was it loaded before CountCalls?): %v", err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil || st.Size() == 0 || st.Size()%callRecord != 0 {
			t.Fatalf("call counts %s: size %d (%v), want a whole number of %d-byte records", c.path, st.Size(), err, callRecord)
		}
		if c.mem, err = unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED); err != nil {
			t.Fatalf("mapping the call counts: %v", err)
		}
	}
}

// Since returns what counts after minus before, leaving out names whose
// count did not move.
func Since(before, after map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for name, n := range after {
		if n > before[name] {
			d[name] = n - before[name]
		}
	}
	return d
}
