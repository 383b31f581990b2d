// SPDX-License-Identifier: Apache-2.0

// Package testtools finds the tools that tests need (etcd, kube-apiserver,
// kubectl, helm, controller-gen), built by hack/tools.sh into its cache.
package testtools

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// RepoRoot is the module's root folder.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Path returns the path of a built tool, or an error naming the tool and how
// to build it.
func Path(name string) (string, error) {
	script := filepath.Join(RepoRoot(), "hack", "tools.sh")
	out, err := exec.Command("bash", script, "path", name).Output()
	if err != nil {
		return "", fmt.Errorf("locate tool %q: %w", name, err)
	}
	p := strings.TrimSpace(string(out))
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("tool %q not built at %s (run make tools): %w", name, p, err)
	}
	return p, nil
}

// Missing skips the test with the reason, or fails it when
// PXN_REQUIRE_TOOLS=1: make test and CI set it, after installing every
// package and tool the suite needs, so that what is missing there is a
// broken setup and never a silent pass.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("PXN_REQUIRE_TOOLS") == "1" {
		t.Fatalf("%s, and PXN_REQUIRE_TOOLS=1", msg)
	}
	t.Skip("skipping: " + msg)
}

// Require returns the path of a tool; when the tool is missing the test
// skips or fails as Missing says.
func Require(t testing.TB, name string) string {
	t.Helper()
	p, err := Path(name)
	if err != nil {
		Missing(t, "%v", err)
	}
	return p
}

// EnvtestAssets returns a folder holding etcd, kube-apiserver and kubectl for
// envtest, from KUBEBUILDER_ASSETS or the tools cache.
func EnvtestAssets(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "kube-apiserver")); err == nil {
			return dir
		}
	}
	for _, n := range []string{"etcd", "kube-apiserver", "kubectl"} {
		Require(t, n)
	}
	out, err := exec.Command("bash", filepath.Join(RepoRoot(), "hack", "tools.sh"), "assets").Output()
	if err != nil {
		t.Fatalf("envtest assets: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// MappingSize is the size of this process's mapping that starts at addr,
// from /proc/self/maps; 0 when none does.
func MappingSize(t testing.TB, addr uintptr) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		r, _, _ := strings.Cut(line, " ")
		lo, hi, ok := strings.Cut(r, "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && uintptr(start) == addr {
			return end - start
		}
	}
	return 0
}

// WithoutRace returns goflags (a GOFLAGS value) without -race, for what a
// test builds to be loaded by processes that are not its own race-enabled
// binary: a race-enabled libpxn.so cannot start inside a host program
// built without the thread sanitizer.
func WithoutRace(goflags string) string {
	var keep []string
	for _, f := range strings.Fields(goflags) {
		if f != "-race" && f != "-race=true" {
			keep = append(keep, f)
		}
	}
	return strings.Join(keep, " ")
}
