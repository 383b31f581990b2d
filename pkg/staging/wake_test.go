// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestWakeWordWithoutSleeperMakesNoCall(t *testing.T) {
	var w WakeWord
	for i := range 3 {
		if w.Wake() {
			t.Fatalf("wake %d made a system call with no sleeper", i)
		}
	}
	if got := atomic.LoadUint32(&w.Seq); got != 3 {
		t.Fatalf("Seq after 3 wakes = %d, want 3", got)
	}
}

func TestWakeWordSleep(t *testing.T) {
	tests := []struct {
		name      string
		wakeFirst bool
		timeout   time.Duration
		wantWoken bool
	}{
		{"timeout with no waker", false, time.Millisecond, false},
		{"a wake between Announce and Sleep ends the sleep at once", true, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w WakeWord
			seen := w.Announce()
			if atomic.LoadUint32(&w.Sleeping) == 0 {
				t.Fatal("Announce did not set Sleeping")
			}
			if tt.wakeFirst && !w.Wake() {
				t.Fatal("Wake after Announce made no system call")
			}
			if got := w.Sleep(seen, tt.timeout); got != tt.wantWoken {
				t.Fatalf("Sleep = %v, want %v", got, tt.wantWoken)
			}
			if atomic.LoadUint32(&w.Sleeping) != 0 {
				t.Fatal("Sleeping still set after Sleep")
			}
		})
	}
}

func TestWakeWordAllocatesNothing(t *testing.T) {
	var w WakeWord
	allocs := testing.AllocsPerRun(100, func() {
		seen := w.Announce()
		w.Wake()
		w.Sleep(seen, time.Microsecond)
	})
	if allocs != 0 {
		t.Fatalf("Announce, Wake and Sleep allocate %v times", allocs)
	}
}

const (
	wakeHelperEnv    = "PXN_WAKE_HELPER_FILE"
	wakeHelperRounds = 3
)

// wakeFile maps the shared page of the cross-process test: the word at 0
// and, one cache line later, the helper's count of wakes it has seen.
func wakeFile(t testing.TB, path string) (*WakeWord, *uint32) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, 2*CacheLine, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap %s: %v", path, err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return (*WakeWord)(unsafe.Pointer(&mem[0])), (*uint32)(unsafe.Pointer(&mem[CacheLine]))
}

// wakeHelper is the sleeping process of TestWakeWordAcrossProcesses: the
// test binary run again with wakeHelperEnv naming the shared file.
func wakeHelper(t *testing.T, path string) {
	w, rounds := wakeFile(t, path)
	for range wakeHelperRounds {
		for {
			seen := w.Announce()
			if w.Sleep(seen, 0) {
				break
			}
		}
		atomic.AddUint32(rounds, 1)
	}
}

// TestWakeWordAcrossProcesses wakes a process that sleeps on the word with
// no timeout, through a MAP_SHARED file in /dev/shm: without a shared
// futex the helper would sleep until the deadline kills it.
func TestWakeWordAcrossProcesses(t *testing.T) {
	if path := os.Getenv(wakeHelperEnv); path != "" {
		wakeHelper(t, path)
		return
	}
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	f, err := os.CreateTemp("/dev/shm", "pxn-wake-test-")
	if err != nil {
		t.Fatal(err)
	}
	path := f.Name()
	t.Cleanup(func() { _ = os.Remove(path) })
	if err := f.Truncate(2 * CacheLine); err != nil {
		t.Fatal(err)
	}
	f.Close()
	w, rounds := wakeFile(t, path)

	cmd := exec.Command(os.Args[0], "-test.run=^TestWakeWordAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), wakeHelperEnv+"="+path)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	}()
	for i := range wakeHelperRounds {
		for atomic.LoadUint32(&w.Sleeping) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the helper never announced a sleep; output:\n%s", i, out)
			}
			time.Sleep(time.Millisecond)
		}
		if !w.Wake() {
			t.Fatalf("round %d: Wake saw no sleeper after the helper announced", i)
		}
		for atomic.LoadUint32(rounds) != uint32(i+1) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the helper did not wake (Seq %d, Sleeping %d); output:\n%s", i, atomic.LoadUint32(&w.Seq), atomic.LoadUint32(&w.Sleeping), out)
			}
			time.Sleep(time.Millisecond)
		}
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("helper: %v; output:\n%s", err, out)
		}
	case <-time.After(time.Until(deadline)):
		t.Fatalf("helper did not exit; output:\n%s", out)
	}
}

// lockedBuffer collects a child's output while the test may read it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// A burst of wakes from the pump's process while it sleeps costs one
// eventfd write: the first waker takes the pump's flag, the others find it
// clear. The write ends the sleep however late it begins, and the next
// Announce is woken again.
func TestEventWaiterBurstWritesOnce(t *testing.T) {
	var lanes [LaneCount]*RelayLane
	w, err := NewEventWaiter(&lanes)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const burst = 16
	for round := range 3 {
		if w.Wake() {
			t.Fatalf("round %d: a wake before Announce wrote the eventfd", round)
		}
		w.Announce()
		writes := 0
		for range burst {
			if w.Wake() {
				writes++
			}
		}
		if writes != 1 {
			t.Fatalf("round %d: %d wakes during one sleep made %d writes, want 1", round, burst, writes)
		}
		if !w.Sleep(0, 10*time.Second) {
			t.Fatalf("round %d: Sleep after the burst was not woken", round)
		}
	}
}
