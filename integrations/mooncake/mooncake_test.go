// SPDX-License-Identifier: Apache-2.0

// Package mooncake holds the PXN transport for Mooncake's transfer engine
// (C++, built by this directory's Makefile against a Mooncake checkout).
// These tests build it against MOONCAKE_SRC, with the factory patch applied
// to a copy of the checkout's multi_transport.cpp, link it against the link
// seam in test/, and run it as real processes sharing a PXN registry; the
// Sanitized tests do the same with everything in those processes built
// under ASan and UBSan.
package mooncake

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/sanitize"
	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/contract"
)

// packages names the Debian packages whose headers Mooncake's headers
// include, and how to include one of each (jsoncpp as Mooncake does).
var packages = []struct{ pkg, include string }{
	{"libgoogle-glog-dev", "#include <glog/logging.h>"},
	{"libgflags-dev", "#include <gflags/gflags.h>"},
	{"libjsoncpp-dev", "#if __has_include(<jsoncpp/json/json.h>)\n#include <jsoncpp/json/json.h>\n#else\n#include <json/json.h>\n#endif"},
	{"libibverbs-dev", "#include <infiniband/verbs.h>"},
	{"libnuma-dev", "#include <numa.h>"},
}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test's source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// mooncakeSrc is MOONCAKE_SRC, else the reference checkout CI keeps beside
// the clone; without one the tests skip, or fail under PXN_REQUIRE_TOOLS=1
// (make test: CI has the checkout).
func mooncakeSrc(t *testing.T, root string) string {
	t.Helper()
	src := os.Getenv("MOONCAKE_SRC")
	if src == "" {
		src = filepath.Join(root, "..", "shared", "reference", "mooncake")
	}
	src, err := filepath.Abs(src)
	if err != nil {
		t.Fatal(err)
	}
	hdr := filepath.Join(src, "mooncake-transfer-engine", "include", "transport", "rdma_transport", "rdma_transport.h")
	if _, err := os.Stat(hdr); err != nil {
		testtools.Missing(t, "no Mooncake checkout at %s (%v): set MOONCAKE_SRC to one to build and test the transport", src, err)
	}
	return src
}

// needBuildTools checks the compiler, make, patch and the packages' headers.
// Missing ones skip the test, or fail it when PXN_REQUIRE_TOOLS=1 (make
// test, where .ci/run installs them).
func needBuildTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"g++", "make", "patch", "ar"} {
		if _, err := exec.LookPath(tool); err != nil {
			testtools.Missing(t, "%s not found in PATH: the transport is C++ built by make", tool)
		}
	}
	var src strings.Builder
	for _, p := range packages {
		fmt.Fprintln(&src, p.include)
	}
	cmd := exec.Command("g++", "-std=c++20", "-fsyntax-only", "-x", "c++", "-")
	cmd.Stdin = strings.NewReader(src.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		var pkgs []string
		for _, p := range packages {
			pkgs = append(pkgs, p.pkg)
		}
		testtools.Missing(t, "Mooncake's headers need %s (apt-get install -y %s): %v\n%s",
			strings.Join(pkgs, ", "), strings.Join(pkgs, " "), err, out)
	}
}

// buildDir is kept between runs (make rebuilds what changed): a cold build
// of Mooncake's headers takes minutes on a small machine. It is one per
// checkout of this tree and Mooncake checkout: make judges by times, so
// objects built from another checkout's newer sources would be linked.
func buildDir(t *testing.T, src string) string {
	t.Helper()
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	sum := sha256.Sum256([]byte(repoRoot(t) + "\x00" + src))
	dir := filepath.Join(base, "pxn", "mooncake-test-"+hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A testBuild is one build of the test program, made once per test binary:
// libpxn.so, the transport, the patched multi_transport.cpp, the seam and
// the program, by the Makefile's test-bin target. A sanitized one compiles
// the C++ (the checkout's files it links included) with ASan and UBSan and
// builds libpxn.so with go build -asan, its cgo C code under both.
//
// An event-driven one compiles the C++ with USE_EVENT_DRIVEN_COMPLETION, as
// Mooncake's option of that name does: tasks and batches complete through
// the counters and condition variable it adds.
type testBuild struct {
	sanitized bool
	event     bool
	once      sync.Once
	err       error
}

var (
	plainBuild     testBuild
	sanitizedBuild = testBuild{sanitized: true}
	eventBuild     = testBuild{event: true}
)

// A program is a built test program and the folder that holds it and
// libpxn.so; a sanitized one runs with the sanitizers' options and its
// reports fail the test.
type program struct {
	bin, lib  string
	sanitized bool
}

func (p program) env(environ []string) []string {
	if p.sanitized {
		return sanitize.RunEnv(environ)
	}
	return environ
}

func (p program) check(t *testing.T, who, stderr string) {
	t.Helper()
	if p.sanitized {
		sanitize.Check(t, who, stderr)
	}
}

// build builds the test program b describes, or skips the test saying what
// is missing (failing instead under PXN_REQUIRE_TOOLS=1).
func (b *testBuild) build(t *testing.T) program {
	t.Helper()
	root := repoRoot(t)
	src := mooncakeSrc(t, root)
	needBuildTools(t)
	out := buildDir(t, src)
	vars := []string{"CXXFLAGS=-O1 -g"}
	env := append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS="+testtools.WithoutRace(os.Getenv("GOFLAGS")))
	if b.event {
		out += "-event"
		vars = []string{"CXXFLAGS=-O1 -g -DUSE_EVENT_DRIVEN_COMPLETION"}
	}
	if b.sanitized {
		sanitize.Require(t, "g++")
		out += "-asan-ubsan"
		vars = []string{
			"CXXFLAGS=" + strings.Join(sanitize.CFlags(), " "),
			"LDFLAGS=" + strings.Join(sanitize.LDFlags(), " "),
		}
		env = sanitize.GoEnv(os.Environ())
	}
	b.once.Do(func() {
		start := time.Now()
		args := append([]string{"-C", filepath.Join(root, "integrations", "mooncake"), "-j2", "test-bin",
			"MOONCAKE_SRC=" + src, "OUT=" + out}, vars...)
		cmd := exec.Command("make", args...)
		cmd.Env = env
		if o, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("make %s: %w\n%s", strings.Join(args, " "), err, o)
			return
		}
		t.Logf("built against %s in %s (%s)", src, out, time.Since(start).Round(time.Millisecond))
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return program{bin: filepath.Join(out, "pxn_transport_test"), lib: out, sanitized: b.sanitized}
}

// scratch holds the two decode buffers both ranks map, and the registry.
func scratch(t *testing.T) string {
	t.Helper()
	parent := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		parent = "/dev/shm"
	}
	dir, err := os.MkdirTemp(parent, "pxn-mooncake-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, name := range []string{"decode0", "decode1"} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(64 << 20); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if err := os.Mkdir(filepath.Join(dir, "registry"), 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// env is the children's environment: no MC_PXN_* from outside, then extra.
func env(lib, dir string, extra ...string) []string {
	var e []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, contract.EnvPrefix) && !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") {
			e = append(e, kv)
		}
	}
	e = append(e, "SEAM_DIR="+dir, "LD_LIBRARY_PATH="+lib)
	return append(e, extra...)
}

func pxnEnv(dir string) []string {
	return []string{
		contract.EnvEnable + "=1",
		contract.EnvGroupID + "=mooncake-test",
		contract.EnvRegistryRoot + "=" + filepath.Join(dir, "registry"),
		contract.EnvRailMap + `={"mlx5_0":"rail0","mlx5_1":"rail1"}`,
		contract.EnvCreditTimeout + "=300",
		// The cases count Pieces in whole slots (three held of a 24 MiB
		// write): no ramp.
		contract.EnvFirstPiece + "=" + strconv.Itoa(contract.MaxFirstPieceKiB),
	}
}

// results turns the program's PASS/FAIL lines into subtests.
type results struct {
	lines []string
	done  bool
	skip  string
}

func (r *results) add(line string) {
	if line == "DONE" {
		r.done = true
		return
	}
	if why, ok := strings.CutPrefix(line, "SKIP "); ok {
		r.skip = why
		return
	}
	if strings.HasPrefix(line, "PASS ") || strings.HasPrefix(line, "FAIL ") {
		r.lines = append(r.lines, line)
	}
}

func (r *results) report(t *testing.T, stderr func() string) {
	t.Helper()
	if r.skip != "" && len(r.lines) == 0 {
		testtools.Missing(t, "%s", r.skip)
	}
	if len(r.lines) == 0 {
		t.Fatalf("the test program reported no case\n%s", stderr())
	}
	for _, line := range r.lines {
		name, why, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(line, "PASS "), "FAIL "), ": ")
		pass := strings.HasPrefix(line, "PASS ")
		t.Run(name, func(t *testing.T) {
			if !pass {
				t.Errorf("%s", why)
			}
		})
	}
	if !r.done {
		t.Errorf("the test program stopped before its last case\n%s", stderr())
	}
}

// tail keeps a process's stderr: String is its last 8000 bytes, for a
// failure's message; all of it goes to the sanitizer check.
type tail struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *tail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *tail) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *tail) String() string {
	s := l.all()
	if len(s) > 8000 {
		s = s[len(s)-8000:]
	}
	return s
}

// TestPxnOffIsRdmaTransport: with MC_PXN_ENABLE unset the factory builds
// RdmaTransport, and PxnRdmaTransport posts what RdmaTransport posts, with
// no libpxn loaded and no thread of its own.
func TestPxnOffIsRdmaTransport(t *testing.T) {
	testPxnOff(t, plainBuild.build(t))
}

// TestPxnOffIsRdmaTransportSanitized is TestPxnOffIsRdmaTransport under
// ASan and UBSan.
func TestPxnOffIsRdmaTransportSanitized(t *testing.T) {
	testPxnOff(t, sanitizedBuild.build(t))
}

func testPxnOff(t *testing.T, p program) {
	dir := scratch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.bin, "off")
	cmd.Env = p.env(env(p.lib, dir))
	var stderr tail
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	p.check(t, "pxn_transport_test off", stderr.all())
	var r results
	for _, line := range strings.Split(string(out), "\n") {
		r.add(line)
	}
	r.report(t, stderr.String)
	if err != nil && !t.Failed() {
		t.Fatalf("pxn_transport_test off: %v\n%s", err, stderr.String())
	}
}

// TestTransportThroughRelay runs a relay rank and a sender rank: the sender
// runs its cases through the patched MultiTransport, and asks the relay to
// hold, release or fail its NIC, or to check what it posted.
func TestTransportThroughRelay(t *testing.T) {
	testThroughRelay(t, plainBuild.build(t))
}

// TestTransportThroughRelayEventDriven is TestTransportThroughRelay with
// Mooncake's event-driven completion compiled in.
func TestTransportThroughRelayEventDriven(t *testing.T) {
	testThroughRelay(t, eventBuild.build(t))
}

// TestTransportThroughRelaySanitized is TestTransportThroughRelay with both
// ranks under ASan and UBSan.
func TestTransportThroughRelaySanitized(t *testing.T) {
	testThroughRelay(t, sanitizedBuild.build(t))
}

func testThroughRelay(t *testing.T, p program) {
	dir := scratch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	var relayErr, senderErr tail
	relay := exec.CommandContext(ctx, p.bin, "relay")
	relay.Env = p.env(env(p.lib, dir, pxnEnv(dir)...))
	relay.Stderr = &relayErr
	relayIn, err := relay.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	relayOutPipe, err := relay.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	relayDone := false
	defer func() {
		if !relayDone {
			relayIn.Close()
			relay.Wait()
			p.check(t, "relay", relayErr.all())
		}
	}()
	relayOut := bufio.NewScanner(relayOutPipe)
	relayOut.Scan()
	if why, ok := strings.CutPrefix(relayOut.Text(), "SKIP "); ok {
		testtools.Missing(t, "%s", why)
	}
	if relayOut.Text() != "READY" {
		t.Fatalf("relay did not start: %q\n%s", relayOut.Text(), relayErr.String())
	}

	sender := exec.CommandContext(ctx, p.bin, "sender")
	sender.Env = p.env(env(p.lib, dir, pxnEnv(dir)...))
	sender.Stderr = &senderErr
	senderIn, err := sender.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	senderOutPipe, err := sender.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sender.Start(); err != nil {
		t.Fatal(err)
	}
	var r results
	senderOut := bufio.NewScanner(senderOutPipe)
	for senderOut.Scan() {
		line := senderOut.Text()
		cmd, ok := strings.CutPrefix(line, "RELAY ")
		if !ok {
			r.add(line)
			continue
		}
		reply := "FAIL the relay is gone"
		if _, err := io.WriteString(relayIn, cmd+"\n"); err == nil && relayOut.Scan() {
			reply = relayOut.Text()
		}
		if _, err := io.WriteString(senderIn, reply+"\n"); err != nil {
			break
		}
	}
	senderIn.Close()
	serr := sender.Wait()
	p.check(t, "sender", senderErr.all())
	io.WriteString(relayIn, "quit\n")
	relayIn.Close()
	rerr := relay.Wait()
	relayDone = true
	p.check(t, "relay", relayErr.all())
	r.report(t, func() string {
		return "sender:\n" + senderErr.String() + "\nrelay:\n" + relayErr.String()
	})
	if serr != nil && !t.Failed() {
		t.Errorf("sender: %v\n%s", serr, senderErr.String())
	}
	if rerr != nil && !t.Failed() {
		t.Errorf("relay: %v\n%s", rerr, relayErr.String())
	}
	if ctx.Err() != nil {
		t.Errorf("ran past its deadline")
	}
}
