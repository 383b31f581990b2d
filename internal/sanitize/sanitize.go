// SPDX-License-Identifier: Apache-2.0

// Package sanitize builds the C and C++ code of a host process, and the
// libpxn.so it loads, under AddressSanitizer (LeakSanitizer included) and
// UndefinedBehaviorSanitizer, runs it so that the first report ends the
// process, and finds the reports in what it printed. The tests of
// cmd/libpxn, pkg/cuda and integrations/mooncake use it; docs/c-abi.md
// ("Sanitizers") says which combination runs where and why.
package sanitize

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Sanitizers is the -fsanitize list of every sanitized C and C++ build.
const Sanitizers = "address,undefined"

// CFlags are the flags for compiling C or C++ with both sanitizers: every
// report fatal, frame pointers kept for the reports' stacks.
func CFlags() []string {
	return []string{"-O1", "-g", "-fsanitize=" + Sanitizers, "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"}
}

// LDFlags are the flags for linking a program or library built with CFlags.
func LDFlags() []string {
	return []string{"-fsanitize=" + Sanitizers}
}

// GoEnv returns environ for building libpxn.so (or a cgo test binary) with
// Go's AddressSanitizer mode: GOFLAGS gains -asan and loses -race (the two
// cannot be combined), so the Go code's accesses are checked against the
// shadow memory and the cgo C code is compiled with -fsanitize=address;
// CGO_CFLAGS adds UBSan to that C code.
func GoEnv(environ []string) []string {
	var goflags []string
	for _, f := range strings.Fields(lookup(environ, "GOFLAGS")) {
		if f != "-race" && f != "-race=true" && f != "-asan" {
			goflags = append(goflags, f)
		}
	}
	goflags = append(goflags, "-asan")
	return set(environ,
		"CGO_ENABLED=1",
		"GOFLAGS="+strings.Join(goflags, " "),
		"CGO_CFLAGS=-O1 -g -fno-omit-frame-pointer -fsanitize=undefined -fno-sanitize-recover=all",
		"CGO_LDFLAGS=-fsanitize=undefined",
	)
}

// RunEnv returns environ with the sanitizers' run-time options: ASan stops
// at its first report and LeakSanitizer looks for leaks at exit; UBSan
// prints the stack of its report (its reports already end the process,
// -fno-sanitize-recover=all).
func RunEnv(environ []string) []string {
	return set(environ,
		"ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1",
		"UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1",
	)
}

// report matches the first line of an ASan or LSan report
// ("==123==ERROR: AddressSanitizer: heap-buffer-overflow ...") and of a
// UBSan one ("shim.c:21:3: runtime error: ..."), also where another
// thread's output shares the line; a Go panic's "panic: runtime error:"
// does not match.
var report = regexp.MustCompile(`==\d+==ERROR: (AddressSanitizer|LeakSanitizer)\b.*|([^\s"'=]+:\d+(:\d+)?|<unknown>): runtime error: .*`)

// Reports returns the first line of every sanitizer report in out.
func Reports(out string) []string {
	return report.FindAllString(out, -1)
}

// Check fails t, naming who, for every sanitizer report in out, and shows
// out once when there is one.
func Check(t testing.TB, who, out string) {
	t.Helper()
	reports := Reports(out)
	if len(reports) == 0 {
		return
	}
	t.Errorf("%s: %d sanitizer report(s): %s\n%s", who, len(reports), strings.Join(reports, "; "), out)
}

// Require checks that compiler builds and runs a program with CFlags and
// LDFlags: without the sanitizers' run-time libraries (libasan, libubsan:
// Debian's gcc depends on them) the test skips, or fails under
// PXN_REQUIRE_TOOLS=1 (make test).
func Require(t testing.TB, compiler string) {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("PXN_REQUIRE_TOOLS") == "1" {
			t.Fatalf(format+", and PXN_REQUIRE_TOOLS=1", args...)
		}
		t.Skipf(format, args...)
	}
	cc, err := exec.LookPath(compiler)
	if err != nil {
		missing("%s not found in PATH: the sanitized builds need it", compiler)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "probe.c")
	if err := os.WriteFile(src, []byte("int main(void) { return 0; }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "probe")
	args := append(append(CFlags(), LDFlags()...), "-x", "c", src, "-o", bin)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		missing("%s cannot build with -fsanitize=%s (libasan and libubsan missing?): %s %s: %v\n%s",
			compiler, Sanitizers, compiler, strings.Join(args, " "), err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = RunEnv(os.Environ())
	if out, err := cmd.CombinedOutput(); err != nil {
		missing("a program built by %s with -fsanitize=%s does not run here: %v\n%s", compiler, Sanitizers, err, out)
	}
}

// GoTool is the go command that builds sanitized libraries and test
// binaries: the one in PATH, else $GOROOT/bin/go.
func GoTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		return filepath.Join(root, "bin", "go"), nil
	}
	return "", errors.New("no go command: neither in PATH nor under $GOROOT")
}

func lookup(environ []string, key string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(environ[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// set returns environ with each KEY=value of kvs replacing any KEY there.
func set(environ []string, kvs ...string) []string {
	out := make([]string, 0, len(environ)+len(kvs))
	for _, e := range environ {
		k, _, _ := strings.Cut(e, "=")
		replaced := false
		for _, kv := range kvs {
			if strings.HasPrefix(kv, k+"=") {
				replaced = true
				break
			}
		}
		if !replaced {
			out = append(out, e)
		}
	}
	return append(out, kvs...)
}
