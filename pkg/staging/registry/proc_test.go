// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

func statLine(comm string, start string) string {
	// Fields 3..21 then starttime (22) and a few more.
	return "4242 (" + comm + ") S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 " + start + " 1000 200 18446744073709551615\n"
}

func TestIdentityParseProcStat(t *testing.T) {
	tests := []struct {
		name  string
		line  string
		state byte
		start uint64
		ok    bool
	}{
		{"plain", statLine("pxn", "987654"), 'S', 987654, true},
		{"comm with spaces", statLine("my rank 0", "11"), 'S', 11, true},
		{"comm with parentheses", statLine("a) S 1 2 (b", "12"), 'S', 12, true},
		{"comm that looks like fields", statLine(") R 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 777", "13"), 'S', 13, true},
		{"empty comm", statLine("", "14"), 'S', 14, true},
		{"zombie", strings.Replace(statLine("z", "15"), ") S ", ") Z ", 1), 'Z', 15, true},
		{"no parentheses", "4242 pxn S 1 2", 0, 0, false},
		{"truncated", "4242 (pxn) S 1 4242 4242 0 -1", 0, 0, false},
		{"start not a number", statLine("pxn", "x1"), 0, 0, false},
		{"state not a letter", strings.Replace(statLine("p", "1"), ") S ", ") SS ", 1), 0, 0, false},
		{"empty", "", 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := folder.ParseProcStat([]byte(tt.line))
			if (err == nil) != tt.ok {
				t.Fatalf("folder.ParseProcStat(%q) = %+v, %v; want ok %v", tt.line, st, err, tt.ok)
			}
			if tt.ok && (st.State != tt.state || st.StartTime != tt.start) {
				t.Errorf("folder.ParseProcStat(%q) = %c %d, want %c %d", tt.line, st.State, st.StartTime, tt.state, tt.start)
			}
		})
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte(statLine("pxn", "1")))
	f.Add([]byte(statLine("a) b", "2")))
	f.Add([]byte("1 ("))
	f.Fuzz(func(t *testing.T, b []byte) {
		folder.ParseProcStat(b)
	})
}

func TestIdentityOfThisProcess(t *testing.T) {
	a, err := folder.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	b, err := folder.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if a.Pid != os.Getpid() || a.StartTime == 0 || a.StartTime != b.StartTime {
		t.Errorf("identities %v and %v, want this pid and one start time", a, b)
	}
	if a.Epoch == 0 || b.Epoch == 0 || a.Epoch == b.Epoch {
		t.Errorf("epochs %#x and %#x, want two different non-zero ones", a.Epoch, b.Epoch)
	}
	if why := folder.GoneReason(a.Pid, a.StartTime); why != "" {
		t.Errorf("this process is %q", why)
	}
	if why := folder.GoneReason(a.Pid, a.StartTime+1); !strings.Contains(why, "reused") {
		t.Errorf("another start time: %q, want reused", why)
	}
	for _, pid := range []int{0, -1, staging.MaxPid + 1} {
		if why := folder.GoneReason(pid, 1); why == "" {
			t.Errorf("pid %d counts as running", pid)
		}
	}
}

func TestIdentityExitedAndZombieProcessesAreGone(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), registryHelperEnv+"=exit")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	// Not yet reaped: a zombie, which kill(pid, 0) still finds.
	pollUntil(t, "the child to become a zombie", func() bool {
		st, err := folder.ReadProcStat(pid)
		return err == nil && st.State == 'Z'
	})
	st, _ := folder.ReadProcStat(pid)
	if why := folder.GoneReason(pid, st.StartTime); !strings.Contains(why, "zombie") {
		t.Errorf("zombie %d: %q, want exited (zombie)", pid, why)
	}
	cmd.Wait()
	if why := folder.GoneReason(pid, st.StartTime); !strings.Contains(why, "exited") {
		t.Errorf("reaped %d: %q, want exited", pid, why)
	}
}

func TestIdentityMonoNanosIsMonotonic(t *testing.T) {
	prev := staging.MonoNanos()
	for i := 0; i < 1000; i++ {
		now := staging.MonoNanos()
		if now < prev {
			t.Fatalf("MonoNanos went back from %d to %d", prev, now)
		}
		prev = now
	}
	// It is CLOCK_MONOTONIC itself, which other processes read too: a
	// reading is no later than a reading of that clock after it, however
	// long the machine keeps this goroutine from running in between, and
	// trails one before it by no more than the instant between the two
	// readings of its anchor (slack: a second, where another clock would
	// be off by the time since boot or since 1970).
	var before, after unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &before); err != nil {
		t.Fatal(err)
	}
	mono := staging.MonoNanos()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &after); err != nil {
		t.Fatal(err)
	}
	if mono > after.Nano() || mono < before.Nano()-int64(time.Second) {
		t.Errorf("MonoNanos %d is outside the clock_gettime(CLOCK_MONOTONIC) readings %d and %d around it", mono, before.Nano(), after.Nano())
	}
}
