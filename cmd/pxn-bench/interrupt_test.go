// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

// TestRunInterrupted: SIGINT or SIGTERM of a run whose ranks are
// registered ends its ranks and targets and removes everything the run
// made in its registry root: the ranks' registry folder with their control
// files and staging arenas.
func TestRunInterrupted(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			root := privateRoot(t)
			cmd := exec.Command(benchBin, "run", "--device", "host", "--ranks", "2", "--bytes", "1MiB", "--credit-timeout", "60000",
				"--registry-root", root, "--hold-after", "10m")
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			held := make(chan struct{})
			var lines strings.Builder
			scanned := make(chan struct{})
			go func() {
				defer close(scanned)
				s := bufio.NewScanner(stderr)
				for s.Scan() {
					lines.WriteString(s.Text() + "\n")
					if strings.Contains(s.Text(), "(--hold-after)") {
						close(held)
					}
				}
			}()
			select {
			case <-held:
			case <-time.After(5 * time.Minute):
				_ = cmd.Process.Kill()
				<-scanned
				_ = cmd.Wait()
				t.Fatalf("pxn-bench never held its ranks:\n%s", lines.String())
			}
			regs, err := filepath.Glob(filepath.Join(root, "pxn-bench-registry-*"))
			if err != nil || len(regs) != 1 {
				t.Fatalf("registry folders %v (%v), want one", regs, err)
			}
			var pids []int
			for deadline := time.Now().Add(time.Minute); len(pids) < 2 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				groups, err := inspect.Root(regs[0], time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				pids = nil
				for _, g := range groups {
					for _, r := range g.Ranks {
						if r.State == "READY" {
							pids = append(pids, r.Pid)
						}
					}
				}
			}
			if len(pids) != 2 {
				t.Fatalf("ranks %v registered, want 2", pids)
			}

			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				<-scanned
				done <- cmd.Wait()
			}()
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("pxn-bench still running after %v:\n%s", sig, lines.String())
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() <= 0 {
				t.Errorf("pxn-bench after %v: %v, want a non-zero exit status", sig, err)
			}
			if !strings.Contains(lines.String(), "interrupted") {
				t.Errorf("stderr does not say the run was interrupted:\n%s", lines.String())
			}
			if left := leftIn(t, root); len(left) != 0 {
				t.Errorf("left in the registry root after %v: %v", sig, left)
			}
			for _, pid := range pids {
				if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
					t.Errorf("rank pid %d after %v: kill 0 = %v, want no such process", pid, sig, err)
				}
			}
		})
	}
}

// TestSoakInterrupted: SIGINT or SIGTERM of a soak whose ranks are
// registered ends its ranks and removes their registry folder.
func TestSoakInterrupted(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			root := privateRoot(t)
			cmd := exec.Command(benchBin, "soak", "--ranks", "2", "--duration", "10m", "--fault-every", "0")
			cmd.Env = append(os.Environ(), contract.EnvRegistryRoot+"="+root)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			pids := readyRanks(t, root, "pxn-soak-registry-*", 2, done)
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("pxn-bench soak still running after %v:\n%s", sig, out.String())
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() <= 0 || !strings.Contains(out.String(), "interrupted") {
				t.Errorf("pxn-bench soak after %v: %v, want a non-zero exit status saying it was interrupted:\n%s", sig, err, out.String())
			}
			if left := leftIn(t, root); len(left) != 0 {
				t.Errorf("left in the registry root after %v: %v", sig, left)
			}
			for _, pid := range pids {
				if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
					t.Errorf("rank pid %d after %v: kill 0 = %v, want no such process", pid, sig, err)
				}
			}
		})
	}
}

// readyRanks waits until n ranks are registered and ready in the one
// registry folder matching glob under root, and returns their pids. The
// command's end (done) fails the test.
func readyRanks(t *testing.T, root, glob string, n int, done <-chan error) []int {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("ended before %d ranks registered: %v", n, err)
		default:
		}
		regs, err := filepath.Glob(filepath.Join(root, glob))
		if err != nil || len(regs) > 1 {
			t.Fatalf("registry folders %v (%v), want one", regs, err)
		}
		if len(regs) == 0 {
			continue
		}
		groups, err := inspect.Root(regs[0], time.Minute)
		if err != nil {
			continue
		}
		var pids []int
		for _, g := range groups {
			for _, r := range g.Ranks {
				if r.State == "READY" {
					pids = append(pids, r.Pid)
				}
			}
		}
		if len(pids) == n {
			return pids
		}
	}
	t.Fatalf("%d ranks never registered under %s", n, root)
	return nil
}
