// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
)

// A relay that hands out a lane's memfd unsealed and one lane long, then
// shrinks and seals it while the sender checks it, gets no mapping of a
// lane from it: the sender judges the size only under the seals. A tracer
// stops the sender at the end of its first look at the descriptor and
// reshapes the memfd there, as a relay racing its sender could.
func TestSealOpenLaneFDJudgesSizeUnderSeals(t *testing.T) {
	const shrunk = 1 << 20
	fd, err := unix.MemfdCreate("lane-race", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	lane := os.NewFile(uintptr(fd), "lane-race")
	defer lane.Close()
	if err := unix.Fchmod(fd, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, staging.LaneBytes); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), registryHelperEnv+"=openlane")
	cmd.ExtraFiles = []*os.File{lane}
	cmd.Stderr = os.Stderr
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
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("the child said nothing: %v", lines.Err())
	}
	tid, err := strconv.Atoi(lines.Text())
	if err != nil {
		t.Fatalf("the child's thread %q: %v", lines.Text(), err)
	}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(tid); err != nil {
		t.Skipf("skipping: this machine does not let a process trace its child: %v", err)
	}
	traced := true
	defer func() {
		if traced {
			unix.PtraceDetach(tid)
		}
	}()
	stop := func() unix.WaitStatus {
		t.Helper()
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(tid, &ws, unix.WALL, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				t.Fatalf("wait for thread %d: %v", tid, err)
			}
			if !ws.Stopped() {
				traced = false
				t.Fatalf("thread %d ended (%v) before it looked at the descriptor", tid, ws)
			}
			return ws
		}
	}
	if err := unix.PtraceInterrupt(tid); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := unix.PtraceSetOptions(tid, unix.PTRACE_O_TRACESYSGOOD); err != nil {
		t.Fatal(err)
	}
	if err := unix.PtraceSyscall(tid, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	const enosys = ^uint64(unix.ENOSYS) + 1
	for looked := false; !looked; {
		ws := stop()
		sig := 0
		if s := ws.StopSignal(); s != unix.SIGTRAP|0x80 {
			if s != unix.SIGTRAP {
				sig = int(s)
			}
		} else {
			var regs unix.PtraceRegs
			if err := unix.PtraceGetRegs(tid, &regs); err != nil {
				t.Fatal(err)
			}
			exit := regs.Rax != enosys
			looks := regs.Orig_rax == unix.SYS_FSTAT && regs.Rdi == 3 ||
				regs.Orig_rax == unix.SYS_FCNTL && regs.Rdi == 3 && regs.Rsi == unix.F_GET_SEALS
			looked = exit && looks
		}
		if looked {
			break
		}
		if err := unix.PtraceSyscall(tid, sig); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Ftruncate(fd, shrunk); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, arenaSeals); err != nil {
		t.Fatal(err)
	}
	if err := unix.PtraceDetach(tid); err != nil {
		t.Fatal(err)
	}
	traced = false
	if !lines.Scan() {
		t.Fatalf("the child said nothing after its map: %v", lines.Err())
	}
	got := lines.Text()
	if want := "a file of " + strconv.Itoa(shrunk) + " bytes, want one lane"; !strings.HasPrefix(got, "refused ") || !strings.Contains(got, want) {
		t.Errorf("the sender of a lane shrunk and sealed under its checks: %q, want refused with %q", got, want)
	}
}
