// SPDX-License-Identifier: Apache-2.0

// Package gpukit checks hack/gpu-kit.sh's run on a machine without a GPU:
// the kit's binaries and the MPS control daemon are stand-in scripts that
// record how they were called, so the order of the steps, their limits,
// which of them ran under MPS, and that the daemon is told to quit however
// the run ends are judged from the records.
package gpukit

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
)

// The stand-ins append one line per call to $STUB_LOG. A binary hangs
// (writing its pid to $STUB_LOG.hang first) when its arguments contain
// $STUB_HANG; pxn-bench's help lists --pidns and --arena-share when
// $STUB_PIDNS is set.
const benchStub = `#!/bin/sh
ctl=no
[ -p "${CUDA_MPS_PIPE_DIRECTORY:-/nonexistent}/control" ] && ctl=yes
echo "$(basename "$0") $* | pipes=${CUDA_MPS_PIPE_DIRECTORY:-} control=$ctl dir=$(pwd -P) lib=${PXN_LIBPXN_DIR:-}" >> "$STUB_LOG"
case "$*" in
*--help*)
	[ -z "$STUB_PIDNS" ] || printf '      --pidns\n      --arena-share string\n'
	exit 0 ;;
esac
if [ -n "$STUB_HANG" ]; then
	case "$*" in
	*"$STUB_HANG"*) echo $$ > "$STUB_LOG.hang"; exec sleep 300 ;;
	esac
fi
exit 0
`

const mpsStub = `#!/bin/sh
if [ "$1" = -d ]; then
	mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control" || exit 1
	echo "daemon start pipes=$CUDA_MPS_PIPE_DIRECTORY logs=$CUDA_MPS_LOG_DIRECTORY" >> "$STUB_LOG"
	exit 0
fi
read -r cmd
echo "daemon $cmd pipes=$CUDA_MPS_PIPE_DIRECTORY" >> "$STUB_LOG"
[ "$cmd" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
exit 0
`

type kit struct {
	dir, repo, out, log string
	env                 []string
}

// newKit lays out a built kit (the script, its binaries, COMMIT and
// BASELINE) and a checkout for it, with the daemon stand-in on PATH when
// daemon is set. out is the run's output folder: short, or long enough
// that the daemon's pipes cannot live under it.
func newKit(t *testing.T, daemon, longOut bool) *kit {
	t.Helper()
	base, err := os.MkdirTemp("", "kit")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	k := &kit{dir: filepath.Join(base, "kit"), repo: filepath.Join(base, "repo"), log: filepath.Join(base, "calls.log")}
	k.out = filepath.Join(base, "out")
	if longOut {
		k.out = filepath.Join(base, strings.Repeat("o", 60), "out")
	}
	bin := filepath.Join(base, "bin")
	for _, d := range []string{k.dir, filepath.Join(k.dir, "lib"), filepath.Join(k.repo, "include"), filepath.Join(k.repo, "cmd", "libpxn"), bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script, err := os.ReadFile(filepath.Join(testtools.RepoRoot(), "hack", "gpu-kit.sh"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		filepath.Join(k.dir, "gpu-kit.sh"):        string(script),
		filepath.Join(k.dir, "COMMIT"):            "abc\n",
		filepath.Join(k.dir, "BASELINE"):          "def\n",
		filepath.Join(k.repo, "include", "pxn.h"): "",
		filepath.Join(bin, "nvidia-smi"):          "#!/bin/sh\necho GPU 0: stand-in\n",
		filepath.Join(k.dir, "pxn-bench"):         benchStub,
		filepath.Join(k.dir, "pxn-bench.before"):  benchStub,
		filepath.Join(k.dir, "gpu.test"):          benchStub,
		filepath.Join(k.dir, "cuda.test"):         benchStub,
		filepath.Join(k.dir, "libpxn.test"):       benchStub,
		filepath.Join(k.dir, "gpunic.test"):       benchStub,
	}
	if daemon {
		files[filepath.Join(bin, "nvidia-cuda-mps-control")] = mpsStub
	}
	for p, s := range files {
		if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if !daemon {
		if p, err := exec.LookPath("nvidia-cuda-mps-control"); err == nil {
			t.Skipf("skipping: this machine has a real %s, which the kit would start", p)
		}
	}
	k.env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "PXN_REPO="+k.repo, "STUB_LOG="+k.log, "NVCC=pxn-no-nvcc",
		"CUDA_MPS_PIPE_DIRECTORY=", "CUDA_MPS_LOG_DIRECTORY=", "GPU_KIT_BUDGET=", "GPU_KIT_P14_LIMIT=", "STUB_HANG=", "STUB_PIDNS=")
	return k
}

func (k *kit) command(extra ...string) *exec.Cmd {
	cmd := exec.Command("bash", filepath.Join(k.dir, "gpu-kit.sh"), "run", k.out)
	cmd.Env = append(k.env, extra...)
	return cmd
}

func (k *kit) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(k.log)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// steps reads OUT/steps.txt: each step's name, exit status and MPS.
func (k *kit) steps(t *testing.T) (lines []string, byName map[string][2]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(k.out, "steps.txt"))
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(string(b)), "\n")
	byName = map[string][2]string{}
	re := regexp.MustCompile(`^(\S+) rc=(\d+) \d+ ms limit=\d+s mps=(on|off)$`)
	for _, l := range lines {
		if m := re.FindStringSubmatch(l); m != nil {
			byName[m[1]] = [2]string{m[2], m[3]}
		}
	}
	return lines, byName
}

func field(line, key string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// TestKitRunsStepsUnderItsOwnDaemon: the contrast step runs first, away
// from any daemon; then the kit starts a daemon with its folders under OUT,
// runs every other step under it in order, and tells it to quit once, last.
func TestKitRunsStepsUnderItsOwnDaemon(t *testing.T) {
	k := newKit(t, true, false)
	if out, err := k.command("STUB_PIDNS=1").CombinedOutput(); err != nil {
		t.Fatalf("kit run: %v\n%s", err, out)
	}
	lines, steps := k.steps(t)
	if !strings.Contains(strings.Join(lines, "\n"), "firsthop skipped: no nvcc here") {
		t.Errorf("with no nvcc the kit did not skip the firsthop step:\n%s", strings.Join(lines, "\n"))
	}
	want := []string{"nomps-p3", "after-p13", "before-p13", "after-p10", "noparts-p10", "noinline-p10", "spin-p10", "before-p10", "after-p14", "before-p14", "after-p14kv",
		"after-p8", "after-p9", "after-p14-7to1", "after-p14-a2a", "pidns", "cuda", "gpu", "libpxn", "nic"}
	// before-p14 runs the baseline once for each of P14's seven block
	// sizes, and after-p14kv this build on the same seven.
	p14Shapes := []string{"80x256x1KiB", "80x128x2KiB", "80x64x4KiB", "80x32x8KiB", "80x16x16KiB", "80x14x18KiB", "80x4x64KiB"}
	for _, name := range want {
		mps := "on"
		if name == "nomps-p3" {
			mps = "off"
		}
		if got, ok := steps[name]; !ok || got != [2]string{"0", mps} {
			t.Errorf("step %s: %v (found %v), want rc 0 and MPS %s", name, got, ok, mps)
		}
	}
	calls := k.calls(t)
	var order []string
	pipes := filepath.Join(k.out, "mps", "pipe")
	var nompsPipes string
	for _, c := range calls {
		switch {
		case strings.HasPrefix(c, "daemon start"):
			order = append(order, "start")
			if field(c, "pipes") != pipes || field(c, "logs") != filepath.Join(k.out, "mps", "log") {
				t.Errorf("daemon started with %q, want its folders under %s", c, filepath.Join(k.out, "mps"))
			}
		case strings.HasPrefix(c, "daemon quit"):
			order = append(order, "quit")
		case strings.Contains(c, "--help"):
		case strings.Contains(c, "--suite p3 "):
			order = append(order, "nomps-p3")
			nompsPipes = field(c, "pipes")
			if nompsPipes == "" || nompsPipes == pipes || field(c, "control") != "no" {
				t.Errorf("the contrast step ran with %q, want an empty pipe folder of its own", c)
			}
		default:
			order = append(order, "step")
			if field(c, "pipes") != pipes || field(c, "control") != "yes" {
				t.Errorf("step %q did not run under the kit's daemon", c)
			}
		}
	}
	if got := strings.Join(order, " "); got != "nomps-p3 start "+strings.Repeat("step ", len(want)-1+2*(len(p14Shapes)-1))+"quit" {
		t.Errorf("order of events %q", got)
	}
	all := strings.Join(calls, "\n")
	wantCalls := []string{
		"pxn-bench run --device cuda --suite p14-1to1 --json " + k.out + "/after-p14.json",
		"pxn-bench run --device cuda --suite p8 --json " + k.out + "/after-p8.json",
		"pxn-bench run --device cuda --suite p14-7to1 --json " + k.out + "/after-p14-7to1.json",
		"pxn-bench run --device cuda --suite p14-a2a --json " + k.out + "/after-p14-a2a.json",
		"gpunic.test -test.run ^$ -test.bench . -test.benchtime 200ms",
	}
	for _, s := range p14Shapes {
		wantCalls = append(wantCalls, "pxn-bench.before run --device cuda --ranks 2 --pattern kv --kv-shape "+s+" --kv-requests 16 --kv-inflight 4 --rate 50 --json "+k.out+"/before-p14-"+s+".json",
			"pxn-bench run --device cuda --ranks 2 --pattern kv --kv-shape "+s+" --kv-requests 16 --kv-inflight 4 --rate 50 --json "+k.out+"/after-p14-"+s+".json")
	}
	for _, w := range append(wantCalls,
		"pxn-bench run --device cuda --suite p10 --poll-spin 2ms",
		"pxn-bench run --device cuda --suite p10 --slot-parts 1",
		"pxn-bench run --device cuda --suite p10 --no-inline-plan",
		"pxn-bench.before run --device cuda --suite p10",
		"pxn-bench run --device cuda --ranks 2 --pattern cross-rail --bytes 256MiB --block 8MiB --pidns --arena-share fd",
		"libpxn.test -test.v -test.run TestGPURanksThroughCABI|TestFirstHopChoice|TestABIRules | pipes="+pipes+" control=yes dir="+k.repo+"/cmd/libpxn lib="+k.dir+"/lib",
	) {
		if !strings.Contains(all, w) {
			t.Errorf("no call %q in\n%s", w, all)
		}
	}
	if _, err := os.Stat(nompsPipes); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the contrast step's pipe folder %s is left behind: %v", nompsPipes, err)
	}
}

// TestKitPipesOutsideALongOutput: a unix socket's path is short, so under
// a long OUT the daemon's pipes go to a private folder under /tmp, which
// the kit removes; the logs stay in OUT.
func TestKitPipesOutsideALongOutput(t *testing.T) {
	k := newKit(t, true, true)
	if out, err := k.command().CombinedOutput(); err != nil {
		t.Fatalf("kit run: %v\n%s", err, out)
	}
	var start string
	for _, c := range k.calls(t) {
		if strings.HasPrefix(c, "daemon start") {
			start = c
		}
	}
	pipes := field(start, "pipes")
	if !strings.HasPrefix(pipes, "/tmp/pxn-mps.") || len(pipes) > 60 || field(start, "logs") != filepath.Join(k.out, "mps", "log") {
		t.Fatalf("daemon started with %q, want short pipes under /tmp and the logs in OUT", start)
	}
	if _, err := os.Stat(filepath.Dir(pipes)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the pipes' folder %s is left behind: %v", filepath.Dir(pipes), err)
	}
	lines, _ := k.steps(t)
	if !strings.Contains(strings.Join(lines, "\n"), "pidns skipped: this pxn-bench has no --pidns") {
		t.Fatalf("steps without the pidns skip:\n%s", strings.Join(lines, "\n"))
	}
}

// TestKitWithoutDaemon: with no nvidia-cuda-mps-control the kit says so and
// runs every step without MPS.
func TestKitWithoutDaemon(t *testing.T) {
	k := newKit(t, false, false)
	if out, err := k.command().CombinedOutput(); err != nil {
		t.Fatalf("kit run: %v\n%s", err, out)
	}
	lines, steps := k.steps(t)
	if !strings.Contains(strings.Join(lines, "\n"), "no nvidia-cuda-mps-control here; every step runs without MPS") {
		t.Errorf("steps.txt does not say MPS is missing:\n%s", strings.Join(lines, "\n"))
	}
	if len(steps) < 10 {
		t.Fatalf("%d steps ran", len(steps))
	}
	for name, s := range steps {
		if s[1] != "off" {
			t.Errorf("step %s: MPS %s without a daemon", name, s[1])
		}
	}
}

// TestKitBudget: a step that outlives its limit is stopped (status 124),
// the kit goes on, and once the budget is spent the remaining steps are
// skipped, each with a line; the daemon still quits. The budget is 15 s,
// enough for one step to start on a loaded machine, so this test takes
// about that long.
func TestKitBudget(t *testing.T) {
	k := newKit(t, true, false)
	start := time.Now()
	if out, err := k.command("GPU_KIT_BUDGET=15", "STUB_HANG=--suite p3 ").CombinedOutput(); err != nil {
		t.Fatalf("kit run: %v\n%s", err, out)
	}
	lines, steps := k.steps(t)
	text := strings.Join(lines, "\n")
	// The step's limit is what was left of the budget when it started.
	m := regexp.MustCompile(`nomps-p3 rc=124 \d+ ms limit=(\d+)s`).FindStringSubmatch(text)
	if m == nil || steps["nomps-p3"][0] != "124" {
		t.Fatalf("the hanging step was not stopped at its limit (124):\n%s", text)
	}
	if limit, _ := strconv.Atoi(m[1]); limit < 10 || limit > 15 {
		t.Fatalf("the hanging step's limit %ds, want what was left of the 15 s budget\n%s", limit, text)
	}
	for _, name := range []string{"after-p13", "after-p9", "libpxn", "nic"} {
		if !strings.Contains(text, name+" skipped: ") {
			t.Errorf("step %s not skipped once the budget was spent:\n%s", name, text)
		}
	}
	if calls := strings.Join(k.calls(t), "\n"); !strings.Contains(calls, "daemon quit") {
		t.Errorf("the daemon was not told to quit:\n%s", calls)
	}
	// Generous: the budget is 15 s; the kit may take a few seconds more on
	// a loaded machine, but never the hanging step's 300 s.
	if d := time.Since(start); d > 2*time.Minute {
		t.Errorf("the kit took %v", d)
	}
}

// TestKitP14Limit: GPU_KIT_P14_LIMIT replaces after-p14's limit.
func TestKitP14Limit(t *testing.T) {
	k := newKit(t, true, false)
	if out, err := k.command("GPU_KIT_ONLY=after-p14", "GPU_KIT_P14_LIMIT=300").CombinedOutput(); err != nil {
		t.Fatalf("kit run: %v\n%s", err, out)
	}
	lines, steps := k.steps(t)
	text := strings.Join(lines, "\n")
	if steps["after-p14"][0] != "0" || !regexp.MustCompile(`(?m)^after-p14 rc=0 \d+ ms limit=300s`).MatchString(text) {
		t.Fatalf("after-p14 not run with a 300 s limit:\n%s", text)
	}
}

// TestKitOnly: GPU_KIT_ONLY runs the steps it names and skips every other
// one with a line saying why.
func TestKitOnly(t *testing.T) {
	k := newKit(t, true, false)
	if out, err := k.command("GPU_KIT_ONLY=after-p10 gpu").CombinedOutput(); err != nil {
		t.Fatalf("kit run: %v\n%s", err, out)
	}
	lines, steps := k.steps(t)
	text := strings.Join(lines, "\n")
	for _, name := range []string{"after-p10", "gpu"} {
		if got := steps[name]; got[0] != "0" {
			t.Errorf("step %s: %v, want it run (rc 0)\n%s", name, got, text)
		}
	}
	for _, name := range []string{"nomps-p3", "after-p13", "spin-p10", "after-p9", "libpxn", "nic"} {
		if !strings.Contains(text, name+" skipped: not in GPU_KIT_ONLY") {
			t.Errorf("step %s not skipped:\n%s", name, text)
		}
	}
	var ran []string
	for _, c := range k.calls(t) {
		if strings.Contains(c, "--suite") || strings.Contains(c, ".test") {
			ran = append(ran, c)
		}
	}
	if len(ran) != 2 || !strings.Contains(ran[0], "--suite p10 --json") || !strings.Contains(ran[1], "gpu.test") {
		t.Errorf("calls %q, want the p10 suite and pkg/gpu's tests alone", ran)
	}
}

// TestKitInterrupted: a signal to the kit in the middle of a step stops the
// step's processes and tells the daemon to quit before the kit exits.
func TestKitInterrupted(t *testing.T) {
	k := newKit(t, true, false)
	cmd := k.command("STUB_HANG=--suite p1,p3 ")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Generous deadlines throughout: they bound a hang, they time nothing.
	hang := k.log + ".hang"
	var pid int
	deadline := time.Now().Add(time.Minute)
	for pid == 0 {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("the step never started:\n%s", out.String())
		}
		if b, err := os.ReadFile(hang); err == nil && len(bytes.TrimSpace(b)) > 0 {
			pid, _ = strconv.Atoi(string(bytes.TrimSpace(b)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 130 {
			t.Fatalf("kit ended with %v, want exit status 130\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("the kit did not stop within a minute of SIGTERM\n%s", out.String())
	}
	if calls := strings.Join(k.calls(t), "\n"); !strings.Contains(calls, "daemon quit") {
		t.Errorf("the daemon was not told to quit:\n%s", calls)
	}
	deadline = time.Now().Add(time.Minute)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the interrupted step (pid %d) still runs", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
