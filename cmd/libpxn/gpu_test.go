// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/contract"
)

func TestFirstHopChoice(t *testing.T) {
	cuda := haveCUDA()
	for _, tc := range []struct {
		name     string
		kind     uint32
		pxnOn    bool
		want     uint32
		wantCode int32
	}{
		{"default, PXN off: no copier", copierDefault, false, copierDefault, codeOK},
		{"host", copierHost, true, copierHost, codeOK},
		{"host, PXN off", copierHost, false, copierDefault, codeOK},
		{"default: CUDA where a driver and device are", copierDefault, true, map[bool]uint32{true: copierCUDA, false: copierHost}[cuda], codeOK},
		{"explicit CUDA", copierCUDA, true, copierCUDA, map[bool]int32{true: codeOK, false: codeNotSup}[cuda]},
		{"explicit CUDA, PXN off", copierCUDA, false, copierDefault, map[bool]int32{true: codeOK, false: codeNotSup}[cuda]},
		{"unknown", 7, true, 0, codeInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := newFirstHop(tc.kind, tc.pxnOn, deviceChoice{}, contract.CopyModeAuto, klog.Background())
			if got := codeOf(err); got != tc.wantCode {
				t.Fatalf("newFirstHop(%d) = %v (code %d), want code %d", tc.kind, err, got, tc.wantCode)
			}
			if err != nil {
				if tc.wantCode == codeNotSup && !strings.Contains(err.Error(), "libcuda.so.1") {
					t.Fatalf("the refusal does not name the driver library: %v", err)
				}
				return
			}
			defer func() {
				if err := errors.Join(f.copier.Close(), f.close()); err != nil {
					t.Fatal(err)
				}
			}()
			if f.kind != tc.want {
				t.Fatalf("copier kind %d, want %d", f.kind, tc.want)
			}
			if wantDev := f.kind == copierCUDA; wantDev != (f.arenas != nil) || wantDev != (f.arenaKind == memDevice) {
				t.Fatalf("copier %d with arenas %v of kind %d", f.kind, f.arenas, f.arenaKind)
			}
		})
	}
	t.Run("device out of range", func(t *testing.T) {
		if !cuda {
			t.Skip("no CUDA driver or device (libcuda.so.1)")
		}
		_, err := newFirstHop(copierCUDA, true, deviceChoice{ordinal: 4096, set: true}, contract.CopyModeAuto, klog.Background())
		if codeOf(err) != codeNotSup || !strings.Contains(err.Error(), "cuda_device 4096") {
			t.Fatalf("device 4096: %v", err)
		}
	})
}

// TestGPURanksThroughCABI runs testdata/gpu_ranks.c: two rank processes
// and two target processes, device memory from cuMemAlloc and cuMemCreate,
// an emulated NIC in the host's callbacks, every byte checked by the
// targets; then again with each rank in a PID and mount namespace of its
// own (two pods without hostPID), where the ranks must map each other's
// device arena by descriptor. PXN_GPU_RANKS_BIN names a binary built
// already.
func TestGPURanksThroughCABI(t *testing.T) {
	if !haveCUDA() {
		t.Skip("no CUDA driver or device (libcuda.so.1): the C GPU test needs one")
	}
	lib := library(t)
	bin := os.Getenv("PXN_GPU_RANKS_BIN")
	if bin == "" {
		bin = compileWith(t, lib, repoPath("include"), "gpu_ranks", filepath.Join("testdata", "gpu_ranks.c"))
	}
	for _, pidns := range []bool{false, true} {
		t.Run(map[bool]string{false: "one-namespace", true: "namespace-per-rank"}[pidns], func(t *testing.T) {
			if pidns && os.Geteuid() != 0 {
				t.Skip("skipping: new PID and mount namespaces need root")
			}
			out := runGPURanks(t, bin, pidns)
			if !pidns {
				return
			}
			ns := map[string]bool{}
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) == 4 && f[0] == "RANKNS" {
					ns[strings.TrimPrefix(f[3], "pidns=")] = true
				}
			}
			own, _ := os.Readlink("/proc/self/ns/pid")
			if len(ns) != 2 || ns[own] {
				t.Fatalf("the ranks' PID namespaces %v (this process: %s): want two of their own", ns, own)
			}
			if !strings.Contains(out, `share="lane-descriptor"`) || strings.Contains(out, `share="handle"`) {
				t.Fatal("the ranks did not map each other's lanes by descriptor")
			}
		})
	}
}

func runGPURanks(t *testing.T, bin string, pidns bool) string {
	t.Helper()
	reg := t.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		reg = scratchDir(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var args []string
	if pidns {
		args = append(args, "--pidns", "1")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = childEnv(contract.EnvEnable+"=1", contract.EnvGroupID+"=gpu-ranks", contract.EnvRegistryRoot+"="+reg,
		contract.EnvRailMap+`={"mlx5_0":"rail0","mlx5_1":"rail1","rmlx5_0":"rail0","rmlx5_1":"rail1"}`)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("gpu_ranks %v:\n%s", args, out.String())
	if err != nil {
		t.Fatalf("gpu_ranks: %v", err)
	}
	if !strings.Contains(out.String(), "\nPASS\n") {
		t.Fatal("gpu_ranks did not print PASS")
	}
	return out.String()
}
