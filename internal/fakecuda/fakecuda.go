// SPDX-License-Identifier: Apache-2.0

// Package fakecuda builds the stand-in CUDA driver of the binding's tests
// (pkg/cuda/testdata/fakecuda.c: device memory is host memory, every
// call has completed when it returns) for tests that drive the binding, or
// what sits on it, on a machine without a GPU. Only tests import it.
package fakecuda

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

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
