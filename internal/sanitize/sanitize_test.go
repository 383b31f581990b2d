// SPDX-License-Identifier: Apache-2.0

package sanitize

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestReports(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      []string
	}{
		{"clean", "PASS\nI1202 open.go:42] \"PXN configuration refused\"\n", nil},
		{"go panic", "panic: runtime error: index out of range [3] with length 3\n", nil},
		{
			"asan",
			"PASS\n=================================================================\n==4711==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6020 at pc 0x55\n",
			[]string{"==4711==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6020 at pc 0x55"},
		},
		{
			"lsan",
			"DONE\n==12==ERROR: LeakSanitizer: detected memory leaks\n",
			[]string{"==12==ERROR: LeakSanitizer: detected memory leaks"},
		},
		{
			"ubsan amid another line",
			"I1202 registry.go:236] \"pxn rank published\"examples/c/shm_transport.c:216:2: runtime error: null pointer passed as argument 1\n",
			[]string{"examples/c/shm_transport.c:216:2: runtime error: null pointer passed as argument 1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Reports(tc.out); !slices.Equal(got, tc.want) {
				t.Fatalf("Reports = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestEnv(t *testing.T) {
	env := GoEnv([]string{"GOFLAGS=-race -count=1", "CGO_CFLAGS=-O2", "HOME=/home/x"})
	if got := lookup(env, "GOFLAGS"); got != "-count=1 -asan" {
		t.Errorf("GOFLAGS = %q, want %q", got, "-count=1 -asan")
	}
	if got := lookup(env, "CGO_CFLAGS"); !strings.Contains(got, "-fsanitize=undefined") || strings.Contains(got, "-O2") {
		t.Errorf("CGO_CFLAGS = %q", got)
	}
	if got := lookup(env, "HOME"); got != "/home/x" {
		t.Errorf("HOME = %q, want it kept", got)
	}
	run := RunEnv([]string{"ASAN_OPTIONS=detect_leaks=0"})
	if n := len(run); n != 2 || !strings.Contains(lookup(run, "ASAN_OPTIONS"), "detect_leaks=1") {
		t.Errorf("RunEnv = %q: want ASAN_OPTIONS replaced, with detect_leaks=1", run)
	}
}

// TestFindsBugs builds one defect per sanitizer with CFlags and checks that
// the run fails and Reports names it: the sanitized tests elsewhere can fail.
func TestFindsBugs(t *testing.T) {
	Require(t, "gcc")
	for _, tc := range []struct {
		name, src, want string
	}{
		{
			"heap overflow",
			"#include <stdlib.h>\nint main(int argc, char **argv) { (void)argv; char *p = malloc(7 + argc); int v = p[argc + 7]; free(p); return v; }\n",
			"ERROR: AddressSanitizer: heap-buffer-overflow",
		},
		{
			"use after free",
			"#include <stdlib.h>\nint main(void) { char *p = malloc(8); free(p); return p[0]; }\n",
			"ERROR: AddressSanitizer: heap-use-after-free",
		},
		{
			"leak",
			"#include <stdlib.h>\nvoid *volatile keep;\nint main(void) { keep = malloc(64); keep = 0; return 0; }\n",
			"ERROR: LeakSanitizer: detected memory leaks",
		},
		{
			"signed overflow",
			"#include <limits.h>\nint main(int argc, char **argv) { (void)argv; int v = INT_MAX - 1 + argc; return v + 1 == 0; }\n",
			"runtime error: signed integer overflow",
		},
		{
			"null memcpy",
			"#include <string.h>\nint main(int argc, char **argv) { (void)argv; char *p = argc > 5 ? argv[0] : 0; char b[1]; memcpy(b, p, argc - 1); return 0; }\n",
			"runtime error: null pointer passed as argument 2",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "bug.c")
			if err := os.WriteFile(src, []byte(tc.src), 0o600); err != nil {
				t.Fatal(err)
			}
			bin := filepath.Join(dir, "bug")
			args := append(append(CFlags(), LDFlags()...), src, "-o", bin)
			if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
				t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			cmd := exec.Command(bin)
			cmd.Env = RunEnv(os.Environ())
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Errorf("the run succeeded; want a non-zero exit\n%s", out)
			}
			reports := Reports(string(out))
			if len(reports) != 1 || !strings.Contains(reports[0], tc.want) {
				t.Errorf("Reports = %q, want one naming %q\n%s", reports, tc.want, out)
			}
		})
	}
}
