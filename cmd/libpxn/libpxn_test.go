// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/sanitize"
	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// The C tests build libpxn.so once, with the command docs/c-abi.md gives:
//
//	CGO_ENABLED=1 go build -buildmode=c-shared -o libpxn.so ./cmd/libpxn
//
// and once more with Go's AddressSanitizer mode for the sanitized tests
// (sanitize_test.go).
var plainLib, sanitizedLib libBuild

// A libBuild is one build of libpxn.so, made the first time a test asks.
type libBuild struct {
	once sync.Once
	dir  string
	err  error
}

// A libpxn is a built libpxn.so and how C programs are compiled against it
// and run: sanitized ones with the sanitizers, and their reports checked.
type libpxn struct {
	dir       string
	sanitized bool
}

func (l libpxn) cflags() []string {
	if l.sanitized {
		return append(sanitize.CFlags(), sanitize.LDFlags()...)
	}
	return []string{"-O2"}
}

// env is a program's environment: environ, with the sanitizers' options
// for a sanitized build.
func (l libpxn) env(environ []string) []string {
	if l.sanitized {
		return sanitize.RunEnv(environ)
	}
	return environ
}

// check fails t for every sanitizer report in a sanitized program's output.
func (l libpxn) check(t testing.TB, who, out string) {
	t.Helper()
	if l.sanitized {
		sanitize.Check(t, who, out)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, b := range []*libBuild{&plainLib, &sanitizedLib} {
		if b.dir != "" {
			os.RemoveAll(b.dir)
		}
	}
	os.Exit(code)
}

// needTool returns the path of a C compiler. Without it the test skips, or
// fails when PXN_REQUIRE_TOOLS=1 (make test), like every tool-bound test.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("PXN_REQUIRE_TOOLS") == "1" {
			t.Fatalf("%s not found in PATH, and PXN_REQUIRE_TOOLS=1: %v", name, err)
		}
		t.Skipf("%s not found in PATH: the C ABI tests compile C programs against libpxn.so", name)
	}
	return p
}

// library builds libpxn.so and returns it.
// PXN_LIBPXN_DIR names a folder with a libpxn.so built already, for
// machines without a Go toolchain (the GPU machine).
func library(t *testing.T) libpxn {
	t.Helper()
	needTool(t, "gcc")
	if dir := os.Getenv("PXN_LIBPXN_DIR"); dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			t.Fatal(err)
		}
		return libpxn{dir: abs}
	}
	plainLib.build(t, "plain", append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS="+testtools.WithoutRace(os.Getenv("GOFLAGS"))))
	return libpxn{dir: plainLib.dir}
}

// sanitizedLibrary builds libpxn.so with go build -asan, its cgo C code
// under ASan and UBSan, and returns it; C programs built against it are
// sanitized too. Without the sanitizers' runtimes the test skips, or fails
// under PXN_REQUIRE_TOOLS=1.
func sanitizedLibrary(t *testing.T) libpxn {
	t.Helper()
	needTool(t, "gcc")
	if os.Getenv("PXN_LIBPXN_DIR") != "" {
		t.Skip("PXN_LIBPXN_DIR names a prebuilt libpxn.so; the sanitized tests build their own with go build -asan")
	}
	sanitize.Require(t, "gcc")
	sanitizedLib.build(t, "-asan, cgo C code with UBSan", sanitize.GoEnv(os.Environ()))
	return libpxn{dir: sanitizedLib.dir, sanitized: true}
}

// build runs go build -buildmode=c-shared with env once, into a fresh
// directory; what names the build in its error.
func (b *libBuild) build(t *testing.T, what string, env []string) {
	t.Helper()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "libpxn-test-")
		if err != nil {
			b.err = err
			return
		}
		b.dir = dir
		gocmd, err := sanitize.GoTool()
		if err != nil {
			b.err = err
			return
		}
		cmd := exec.Command(gocmd, "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "libpxn.so"), ".")
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build -buildmode=c-shared (%s): %w\n%s", what, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
}

func repoPath(parts ...string) string {
	return filepath.Join(append([]string{"..", ".."}, parts...)...)
}

// compile builds a C program from srcs against pxn.h and libpxn.so.
func compile(t *testing.T, lib libpxn, out string, srcs ...string) string {
	t.Helper()
	return compileWith(t, lib, repoPath("include"), out, srcs...)
}

// v2Header is the folder of pxn.h as API version 2 shipped it.
var v2Header = filepath.Join("testdata", "v2")

// compileWith is compile against the pxn.h in include.
func compileWith(t *testing.T, lib libpxn, include, out string, srcs ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), out)
	args := append([]string{"-std=c11"}, lib.cflags()...)
	args = append(args, "-Wall", "-Wextra", "-Werror", "-I", include, "-I", repoPath("examples", "c"))
	args = append(args, srcs...)
	args = append(args, "-L", lib.dir, "-lpxn", "-Wl,-rpath,"+lib.dir, "-lpthread", "-o", bin)
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// childEnv is the test's environment without any MC_PXN_ variable, plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, contract.EnvPrefix) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

func TestHeaderCompilesAlone(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, compiler, file, src string
		flags                     []string
	}{
		{"c11", "gcc", "only.c", "#include \"pxn.h\"\n", []string{"-std=c11", "-Wall", "-Wextra", "-Werror", "-Wpedantic"}},
		{"c++17", "g++", "only.cc", "#include \"pxn.h\"\n", []string{"-std=c++17", "-Wall", "-Wextra", "-Werror", "-Wpedantic"}},
		{"with pxn_abi.h", "gcc", "both.c", "#include \"pxn_abi.h\"\n#include \"pxn.h\"\n", []string{"-std=c11", "-Wall", "-Wextra", "-Werror"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := needTool(t, tc.compiler)
			src := filepath.Join(dir, tc.file)
			if err := os.WriteFile(src, []byte(tc.src), 0o600); err != nil {
				t.Fatal(err)
			}
			args := append(append([]string{}, tc.flags...), "-fsyntax-only", "-I", repoPath("include"), src)
			if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
				t.Fatalf("%s %s: %v\n%s", tc.compiler, strings.Join(args, " "), err, out)
			}
		})
	}
}

// TestABIRules runs testdata/abi_check.c: handles, errors, status mapping,
// batch freeing, per-thread messages and concurrent calls, PXN off.
func TestABIRules(t *testing.T) {
	testABIRules(t, library(t))
}

func testABIRules(t *testing.T, lib libpxn) {
	bin := compile(t, lib, "abi_check", filepath.Join("testdata", "abi_check.c"))
	env := childEnv(contract.EnvEnable + "=0")
	if haveCUDA() {
		env = append(env, "PXN_ABI_CHECK_CUDA=1")
	}
	runABICheck(t, lib, bin, env)
}

// TestV2HostRunsUnchanged builds the ABI check of API version 2 against
// that version's header and runs it against this library: options version
// 1, the 48-byte transport op, PENDING for unfinished tasks.
func TestV2HostRunsUnchanged(t *testing.T) {
	testV2HostRunsUnchanged(t, library)
}

func testV2HostRunsUnchanged(t *testing.T, library func(*testing.T) libpxn) {
	if haveCUDA() {
		t.Skip("the version-2 check expects PXN_COPIER_CUDA to fail, as it does only on a machine without a CUDA driver")
	}
	lib := library(t)
	bin := compileWith(t, lib, v2Header, "abi_check_v2", filepath.Join("testdata", "v2", "abi_check.c"))
	runABICheck(t, lib, bin, childEnv(contract.EnvEnable+"=0"))
}

// haveCUDA reports whether the CUDA driver loads and has a device.
func haveCUDA() bool {
	d, err := cuda.Load()
	if err != nil {
		return false
	}
	n, err := d.DeviceCount()
	return err == nil && n > 0
}

func runABICheck(t *testing.T, lib libpxn, bin string, env []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = lib.env(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	lib.check(t, "abi_check", stderr.String())
	if err != nil {
		t.Fatalf("abi_check: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if strings.TrimSpace(stdout.String()) != "PASS" {
		t.Fatalf("abi_check printed %q, want PASS\nstderr:\n%s", stdout.String(), stderr.String())
	}
}

// pattern is examples/c/pxn_example.c's pattern(): the byte rank writes at
// offset off of its region of target.
func pattern(rank, target int, off uint64) byte {
	v := off*0x9E3779B97F4A7C15 + uint64(rank+1)*0x100000001B3 + uint64(target+1)*0xC2B2AE3D27D4EB4F
	return byte(v >> 56)
}

// rankRun is one rank process of pxn_example.
type rankRun struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// counterLine parses "FINAL key=value ..." into its fields.
func counterLine(line string) (map[string]uint64, error) {
	fields := strings.Fields(line)
	if len(fields) == 0 || fields[0] != "FINAL" {
		return nil, fmt.Errorf("not a FINAL line: %q", line)
	}
	out := make(map[string]uint64)
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("field %q of %q", f, line)
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("field %q of %q: %w", f, line, err)
		}
		out[k] = n
	}
	return out, nil
}

// scratchDir is a directory in /dev/shm when there is one, so that the
// targets and the registry are real shared memory.
func scratchDir(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp("/dev/shm", "pxn-libpxn-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestExampleRanks runs the C example as separate rank processes on the host
// path, with the transport callbacks in C, and checks every byte that lands
// in the targets and the counters of every rank.
func TestExampleRanks(t *testing.T) {
	testExampleRanks(t, library(t))
}

func testExampleRanks(t *testing.T, lib libpxn) {
	srcs := []string{repoPath("examples", "c", "pxn_example.c"), repoPath("examples", "c", "shm_transport.c")}
	bin := compile(t, lib, "pxn_example", srcs...)
	binV2 := compileWith(t, lib, v2Header, "pxn_example_v2", srcs...)
	const ranks = 2
	railMap := `{"mlx5_0":"rail0","mlx5_1":"rail1","rmlx5_0":"rail0","rmlx5_1":"rail1"}`
	for _, tc := range []struct {
		name string
		env  []string
		// directories is each rank's --directory.
		directories [ranks]string
		// busyEvery makes every nth transport submit answer PXN_BUSY.
		busyEvery int
		relayed   bool
		stderrHas string
		// v2 runs the example built against API version 2's header.
		v2 bool
		// refuseArena makes rank 1's transport refuse the arena.
		refuseArena bool
		// stale replaces every route handle after the first writes and
		// writes again: relays meet stale handles.
		stale bool
	}{
		{
			name:        "pxn",
			env:         []string{contract.EnvEnable + "=1", contract.EnvGroupID + "=ctest", contract.EnvRailMap + "=" + railMap},
			directories: [ranks]string{"table", "callback"},
			relayed:     true,
		},
		{
			// Every other submit, direct or second hop, is refused as
			// busy and must be retried.
			name:        "pxn busy transport",
			env:         []string{contract.EnvEnable + "=1", contract.EnvGroupID + "=ctest", contract.EnvRailMap + "=" + railMap},
			directories: [ranks]string{"callback", "table"},
			busyEvery:   2,
			relayed:     true,
		},
		{
			name:        "pxn v2 host",
			env:         []string{contract.EnvEnable + "=1", contract.EnvGroupID + "=ctest", contract.EnvRailMap + "=" + railMap},
			directories: [ranks]string{"callback", "table"},
			relayed:     true,
			v2:          true,
		},
		{
			// Rank 1 cannot register its arena: it does not relay, so
			// rank 0 writes to rail 1 direct, and says why once.
			name:        "arena refused",
			env:         []string{contract.EnvEnable + "=1", contract.EnvGroupID + "=ctest", contract.EnvRailMap + "=" + railMap},
			directories: [ranks]string{"table", "callback"},
			refuseArena: true,
			stderrHas:   "register_arena refused the staging arena",
		},
		{
			name:        "stale routes",
			env:         []string{contract.EnvEnable + "=1", contract.EnvGroupID + "=ctest", contract.EnvRailMap + "=" + railMap},
			directories: [ranks]string{"callback", "callback"},
			relayed:     true,
			stale:       true,
		},
		{
			name:        "direct",
			env:         []string{contract.EnvEnable + "=0", contract.EnvRailMap + "=" + railMap},
			directories: [ranks]string{"table", "table"},
		},
		{
			name:        "bad rail map",
			env:         []string{contract.EnvEnable + "=1", contract.EnvGroupID + "=ctest", contract.EnvRailMap + "=not json"},
			directories: [ranks]string{"callback", "table"},
			stderrHas:   "PXN configuration refused",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work := scratchDir(t)
			targets := filepath.Join(work, "targets")
			registry := filepath.Join(work, "registry")
			for _, d := range []string{targets, registry} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			env := lib.env(childEnv(append([]string{contract.EnvRegistryRoot + "=" + registry}, tc.env...)...))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()

			runs := make([]*rankRun, ranks)
			for r := range runs {
				b, extra := bin, []string(nil)
				if tc.v2 {
					b = binV2
				}
				switch {
				case tc.refuseArena && r == 1:
					extra = []string{"--refuse-arena", "1"}
				case tc.refuseArena:
					// Rail 1 will never have a relay.
					extra = []string{"--wait-relay", "0"}
				case tc.stale:
					// The stale-route case also keeps the transport's
					// submit_piece unset: relayed ops go one by one.
					extra = []string{"--stale-check", "1", "--pieces", "0"}
				}
				runs[r] = startRank(ctx, t, b, env, r, ranks, targets, tc.directories[r], tc.busyEvery, extra...)
			}
			defer func() {
				for r, rr := range runs {
					rr.stdin.Close()
					rr.cmd.Process.Kill()
					rr.cmd.Wait()
					lib.check(t, fmt.Sprintf("rank %d", r), rr.stderr.String())
				}
			}()

			// Every rank must be done before any may close: peers relay
			// through each other until the end. The counters printed after
			// the barrier are final, forwarded bytes included.
			for r, rr := range runs {
				if _, err := waitLine(ctx, rr, "DONE"); err != nil {
					t.Fatalf("rank %d: %v\nstderr:\n%s", r, err, rr.stderr.String())
				}
			}
			release := func() {
				for _, rr := range runs {
					if _, err := rr.stdin.Write([]byte("\n")); err != nil {
						t.Fatal(err)
					}
				}
			}
			release()
			if tc.stale {
				// Every rank renews its handles before any writes again,
				// and every rank is done before any closes.
				for _, step := range []string{"RENEWED", "STALE"} {
					for r, rr := range runs {
						line, err := waitLine(ctx, rr, step)
						if err != nil {
							t.Fatalf("rank %d: %v\nstderr:\n%s", r, err, rr.stderr.String())
						}
						t.Logf("rank %d: %s", r, line)
					}
					release()
				}
			}
			done := make([]map[string]uint64, ranks)
			for r, rr := range runs {
				line, err := waitLine(ctx, rr, "FINAL")
				if err != nil {
					t.Fatalf("rank %d: %v\nstderr:\n%s", r, err, rr.stderr.String())
				}
				if done[r], err = counterLine(line); err != nil {
					t.Fatal(err)
				}
				if !tc.v2 {
					line, err := waitLine(ctx, rr, "FINAL3")
					if err != nil {
						t.Fatalf("rank %d: %v\nstderr:\n%s", r, err, rr.stderr.String())
					}
					v3, err := counterLine(strings.Replace(line, "FINAL3", "FINAL", 1))
					if err != nil {
						t.Fatal(err)
					}
					checkV3Line(t, r, v3, done[r], tc.relayed, tc.refuseArena && r == 1, tc.stale)
					// One variable refused is counted, and nothing else is.
					if refused := tc.stderrHas == "PXN configuration refused"; (v3["config_refused"] == 1) != refused || v3["config_refused"] > 1 {
						t.Errorf("rank %d: config_refused %d, want 1 only for a refused configuration (%v)", r, v3["config_refused"], refused)
					}
				}
				line, err = waitLine(ctx, rr, "CLOSED")
				if err != nil {
					t.Fatalf("rank %d: %v\nstderr:\n%s", r, err, rr.stderr.String())
				}
				if tc.v2 || tc.env[0] == contract.EnvEnable+"=0" || tc.stderrHas == "PXN configuration refused" {
					// No arena was made.
				} else if n := closedDeregistrations(line); !(tc.refuseArena && r == 1) && n < staging.LaneCount {
					t.Errorf("rank %d: %q: %d arena ranges deregistered, want at least one a lane (%d)", r, line, n, staging.LaneCount)
				}
				if err := rr.cmd.Wait(); err != nil {
					t.Fatalf("rank %d: %v\nstderr:\n%s", r, err, rr.stderr.String())
				}
				if tc.stderrHas != "" && (!tc.refuseArena || r == 1) && !strings.Contains(rr.stderr.String(), tc.stderrHas) {
					t.Errorf("rank %d stderr lacks %q:\n%s", r, tc.stderrHas, rr.stderr.String())
				}
			}

			region := done[0]["region"]
			if region == 0 {
				t.Fatalf("rank 0 reported an empty region: %v", done[0])
			}
			for r, d := range done {
				want := map[string]uint64{
					"region":              region,
					"fallback_bytes":      0,
					"failed_pieces":       0,
					"second_hop_failures": 0,
				}
				if tc.refuseArena {
					want["pxn_active"] = 0
					if r == 0 {
						want["pxn_active"] = 1
					}
					want["relayed_bytes"] = 0
					want["forwarded_bytes"] = 0
					want["direct_bytes"] = 2 * ranks * region
				} else if tc.stale {
					// The second writes went through relays too; some
					// Pieces failed on a stale handle and were written
					// again, so only the absence of fallbacks is exact.
					want = map[string]uint64{"region": region, "pxn_active": 1, "fallback_bytes": 0}
					if d["second_hop_failures"] == 0 || d["relayed_bytes"] < 2*(ranks-1)*region {
						t.Errorf("rank %d: no stale-route failure seen, or too few relayed bytes: %v", r, d)
					}
				} else if tc.relayed {
					// One region to each other rail through its relay,
					// one region forwarded for each peer, the own rail's
					// write and every read direct.
					want["pxn_active"] = 1
					want["relayed_bytes"] = (ranks - 1) * region
					want["forwarded_bytes"] = (ranks - 1) * region
					want["direct_bytes"] = region + ranks*region
				} else {
					want["pxn_active"] = 0
					want["relayed_bytes"] = 0
					want["forwarded_bytes"] = 0
					want["direct_bytes"] = 2 * ranks * region
				}
				if busy := d["transport_busy"]; (tc.busyEvery > 0) != (busy > 0) {
					t.Errorf("rank %d: transport answered PXN_BUSY %d times with --busy-every %d", r, busy, tc.busyEvery)
				}
				for k, v := range want {
					if got, ok := d[k]; !ok || got != v {
						t.Errorf("rank %d: %s = %d (present %v), want %d; all: %v", r, k, got, ok, v, d)
					}
				}
			}
			checkTargets(t, targets, ranks, region)
		})
	}
}

// checkV3Line checks what an API version 3 rank's transport saw: every
// second-hop op carried the arena's key and the route and key the
// directory gave, and none was stale. Relayed Pieces came whole through
// submit_piece, except in the stale-route case, whose transport has none.
func checkV3Line(t *testing.T, r int, v3, counters map[string]uint64, relayed, refused, stale bool) {
	t.Helper()
	if v3["bad_keys"] != 0 || v3["live_batches"] != 0 || (v3["stale_ops"] != 0) != stale {
		t.Errorf("rank %d: %v (stale routes expected: %v)", r, v3, stale)
	}
	wantCopier := uint64(0)
	if counters["pxn_active"] == 1 {
		wantCopier = 1
	}
	if v3["copier"] != wantCopier {
		t.Errorf("rank %d: copier %d with pxn_active %d, want %d", r, v3["copier"], counters["pxn_active"], wantCopier)
	}
	switch {
	case refused:
		if v3["arena_registrations"] != 0 || v3["relayed_ops"] != 0 {
			t.Errorf("rank %d refused its arena yet: %v", r, v3)
		}
	case relayed:
		if v3["arena_registrations"] < staging.LaneCount || v3["relayed_ops"] == 0 || v3["routed_ops"] != v3["relayed_ops"] {
			t.Errorf("rank %d: every second-hop op should carry the arena key and a route: %v", r, v3)
		}
		if whole := !stale; whole != (v3["pieces"] > 0) || v3["pieces"] > v3["relayed_ops"] {
			t.Errorf("rank %d: %d Pieces taken whole for %d relayed ops; want them whole: %v", r, v3["pieces"], v3["relayed_ops"], whole)
		}
	default:
		if v3["relayed_ops"] != 0 || v3["routed_ops"] != 0 || v3["pieces"] != 0 {
			t.Errorf("rank %d relayed without PXN: %v", r, v3)
		}
	}
}

func startRank(ctx context.Context, t *testing.T, bin string, env []string, rank, ranks int, targets, directory string, busyEvery int, extra ...string) *rankRun {
	t.Helper()
	args := []string{"--rank", strconv.Itoa(rank), "--ranks", strconv.Itoa(ranks), "--dir", targets, "--directory", directory}
	args = append(args, extra...)
	if busyEvery > 0 {
		args = append(args, "--busy-every", strconv.Itoa(busyEvery))
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	rr := &rankRun{cmd: cmd, lines: make(chan string, 16), stderr: &lockedBuffer{}}
	cmd.Stderr = rr.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rr.stdin = stdin
	go func() {
		defer close(rr.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			rr.lines <- sc.Text()
		}
	}()
	return rr
}

// waitLine returns the rank's next stdout line that starts with prefix.
func waitLine(ctx context.Context, rr *rankRun, prefix string) (string, error) {
	for {
		select {
		case line, ok := <-rr.lines:
			if !ok {
				return "", errors.New("exited before printing " + prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return line, nil
			}
		case <-ctx.Done():
			return "", fmt.Errorf("no %s line: %w", prefix, ctx.Err())
		}
	}
}

// checkTargets reads every target file and checks each rank's region.
func checkTargets(t *testing.T, dir string, ranks int, region uint64) {
	t.Helper()
	for k := 0; k < ranks; k++ {
		b, err := os.ReadFile(filepath.Join(dir, "tgt"+strconv.Itoa(k)))
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(b)) != uint64(ranks)*region {
			t.Fatalf("target %d holds %d bytes, want %d", k, len(b), uint64(ranks)*region)
		}
		for r := 0; r < ranks; r++ {
			base := uint64(r) * region
			for off := uint64(0); off < region; off++ {
				if got, want := b[base+off], pattern(r, k, off); got != want {
					t.Fatalf("target %d, rank %d's region, offset %d: byte %#x, want %#x", k, r, off, got, want)
				}
			}
		}
	}
}

func TestGuardedTurnsPanicsIntoCodes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		f        func() error
		wantCode int32
		wantMsg  string
	}{
		{"ok", func() error { return nil }, codeOK, ""},
		{"coded", func() error { return fail(codeBusy, "batch %d busy", 3) }, codeBusy, "batch 3 busy"},
		{"wrapped coded", func() error { return fmt.Errorf("outer: %w", fail(codeNotSup, "inner")) }, codeNotSup, "outer: inner"},
		{"closed", func() error { return fmt.Errorf("submit: %w", relay.ErrClosed) }, codeClosed, "submit: relay: engine closed"},
		{"plain", func() error { return errors.New("disk on fire") }, codeIO, "disk on fire"},
		{"panic", func() error { panic("boom") }, codeInternal, "libpxn internal error: boom"},
		{"panic with error", func() error { panic(fmt.Errorf("wrapped %w", io.EOF)) }, codeInternal, "libpxn internal error: wrapped EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := guarded(tc.f)
			if code != tc.wantCode || msg != tc.wantMsg {
				t.Fatalf("guarded = (%d, %q), want (%d, %q)", code, msg, tc.wantCode, tc.wantMsg)
			}
		})
	}
}

func TestTaskStateMapsOntoMooncake(t *testing.T) {
	for _, tc := range []struct {
		name       string
		st         relay.TaskStatus
		want       int32
		wantLegacy int32
	}{
		{"unfinished", relay.TaskStatus{State: relay.Pending, Transferred: 8 << 20}, taskWaiting, taskPending},
		{"completed", relay.TaskStatus{State: relay.Completed, Transferred: 9}, taskCompleted, taskCompleted},
		{"transport timeout", relay.TaskStatus{State: relay.Failed, Err: &transportError{code: codeTimedOut}}, taskTimeout, taskTimeout},
		{"relay second hop timed out", relay.TaskStatus{State: relay.Failed, Err: fmt.Errorf("relay completion status -5: %w", relay.ErrTimedOut)}, taskTimeout, taskTimeout},
		{"transport invalid", relay.TaskStatus{State: relay.Failed, Err: fmt.Errorf("direct submit: %w", &transportError{code: codeInvalid})}, taskInvalid, taskInvalid},
		{"stale route", relay.TaskStatus{State: relay.Failed, Err: &transportError{code: codeStale}}, taskFailed, taskFailed},
		{"transport failure", relay.TaskStatus{State: relay.Failed, Err: &transportError{code: codeIO, msg: "link down"}}, taskFailed, taskFailed},
		{"relay failure", relay.TaskStatus{State: relay.Failed, Err: errors.New("relay gone")}, taskFailed, taskFailed},
		{"failed without error", relay.TaskStatus{State: relay.Failed}, taskFailed, taskFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := taskState(tc.st, hostABI{}); got != tc.want {
				t.Fatalf("taskState(%+v) = %d, want %d", tc.st, got, tc.want)
			}
			if got := taskState(tc.st, hostABI{legacy: true}); got != tc.wantLegacy {
				t.Fatalf("taskState(%+v, legacy) = %d, want %d", tc.st, got, tc.wantLegacy)
			}
		})
	}
}

func TestTableDirectory(t *testing.T) {
	d := newTableDirectory(&routeBook{})
	for _, tc := range []struct {
		session, hca string
		base, n      uint64
		wantCode     int32
	}{
		{"seg", "rmlx5_0", 0x1000, 0x1000, codeOK},
		{"seg", "rmlx5_1", 0x3000, 0x1000, codeOK},
		{"seg", "rmlx5_1", 0x1fff, 2, codeInvalid},
		{"seg", "rmlx5_1", 0x0, 0x1001, codeInvalid},
		{"seg", "rmlx5_1", 0x2000, 0, codeInvalid},
		{"seg", "rmlx5_1", ^uint64(0), 2, codeInvalid},
		{"", "rmlx5_1", 0x8000, 1, codeInvalid},
		{strings.Repeat("s", 257), "rmlx5_1", 0x8000, 1, codeInvalid},
		{"seg", "", 0x8000, 1, codeInvalid},
		{"seg", strings.Repeat("h", 64), 0x8000, 1, codeInvalid},
		{"other", "rmlx5_0", 0x1000, 0x1000, codeOK},
	} {
		if got := codeOf(d.register(tc.session, tc.hca, tc.base, tc.n, 0, 0)); got != tc.wantCode {
			t.Errorf("register(%.10q, %q, %#x, %d) = %d, want %d", tc.session, tc.hca, tc.base, tc.n, got, tc.wantCode)
		}
	}
	for _, tc := range []struct {
		session string
		dst     uint64
		wantHCA string
	}{
		{"seg", 0x1000, "rmlx5_0"},
		{"seg", 0x1fff, "rmlx5_0"},
		{"seg", 0x2000, ""},
		{"seg", 0x3800, "rmlx5_1"},
		{"seg", 0x4000, ""},
		{"seg", 0x0fff, ""},
		{"nope", 0x1000, ""},
	} {
		tgt, err := d.Resolve(tc.session, tc.dst)
		switch {
		case tc.wantHCA == "" && err == nil:
			t.Errorf("Resolve(%q, %#x) = %v, want an error", tc.session, tc.dst, tgt)
		case tc.wantHCA != "" && (err != nil || len(tgt.HCAs) != 1 || tgt.HCAs[0] != tc.wantHCA):
			t.Errorf("Resolve(%q, %#x) = %v, %v; want HCA %q", tc.session, tc.dst, tgt, err, tc.wantHCA)
		}
	}
	if err := d.unregister("seg"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Resolve("seg", 0x1000); err == nil {
		t.Fatal("Resolve after unregister succeeded")
	}
	if got := codeOf(d.unregister("seg")); got != codeInvalid {
		t.Fatalf("second unregister = %d, want %d", got, codeInvalid)
	}
}

// closedDeregistrations reads arena_deregistrations=N from the example's
// CLOSED line, -1 when it is not there.
func closedDeregistrations(line string) int {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "arena_deregistrations="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}
