// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/cuda"
)

// TestCUDAWithoutDriver: on a machine without libcuda.so.1 the CUDA path
// refuses with a message that says so, and the host path still runs.
func TestCUDAWithoutDriver(t *testing.T) {
	if _, err := cuda.Load(); !errors.Is(err, cuda.ErrNoDriver) {
		t.Skipf("skipping: a CUDA driver is here (%v); run pxn-bench run --device cuda on it", err)
	}
	out, err := exec.Command(benchBin, "run", "--device", "cuda", "--ranks", "2", "--bytes", "1MiB").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("pxn-bench --device cuda without a driver: %v\n%s", err, out)
	}
	for _, want := range []string{"--device cuda", "libcuda.so.1 was not found", "--device host"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("message lacks %q:\n%s", want, out)
		}
	}
	rows := runBench(t, "--ranks", "2", "--bytes", "1MiB", "--pattern", "cross-rail")
	if !rows[0].Verified {
		t.Fatalf("host path after the refused CUDA run: %+v", rows[0])
	}
}
