// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// threadRuns is how many times thread tid of this process was put on a CPU
// (its schedstat: each wake-up counts one, and so does each return from a
// preemption).
func threadRuns(t *testing.T, tid int) uint64 {
	t.Helper()
	if tid == 0 {
		t.Fatal("the engine has no pump thread")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/schedstat", tid))
	if err != nil {
		t.Skipf("no schedstat for the pump thread: %v", err)
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		t.Fatalf("schedstat %q: want 3 fields", b)
	}
	runs, err := strconv.ParseUint(f[2], 10, 64)
	if err != nil {
		t.Fatalf("schedstat %q: %v", b, err)
	}
	return runs
}

// pumpAsleep reports whether e's pump is in its sleep on w: its thread
// blocked in a futex wait on the Seq of a WakeWord, or in ppoll for an
// EventWaiter, as /proc/self/task/<tid>/syscall shows it. The sleeping
// flag alone holds from the announce on, through a last round that may
// still find work and take it without a waker. Where the kernel does not
// show a thread's system call, the flag stands in.
func pumpAsleep(e *relay.Engine, w relay.Waiter) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/syscall", e.PumpThreadID()))
	if err != nil {
		switch w := w.(type) {
		case *staging.WakeWord:
			return atomic.LoadUint32(&w.Sleeping) != 0
		case *staging.EventWaiter:
			return w.Announced()
		}
		return false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return false
	}
	nr, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return false
	}
	switch w := w.(type) {
	case *staging.WakeWord:
		if nr != unix.SYS_FUTEX {
			return false
		}
		addr, err := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64)
		return err == nil && uintptr(addr) == uintptr(unsafe.Pointer(&w.Seq))
	case *staging.EventWaiter:
		return nr == unix.SYS_PPOLL && w.Announced()
	}
	return false
}

// An idle pump sleeps on its wake word and wakes for its heartbeat only:
// over 15 sleeps of each pump of a pair, no waker ends a sleep, each
// heartbeat takes one sleep (a spurious return of the futex may add one),
// and the thread is put on a CPU a few times a sleep, where a 1 ms poll
// would sleep and run hundreds of times a heartbeat. Counts only, so a
// loaded machine that delays the wake-ups changes nothing; the idle pump's
// CPU share and wake-up rate are pxn-bench's P4/P5 figures (its idle
// phase, docs/benchmarks.md).
func TestIdlePumpSleepsUntilItsHeartbeat(t *testing.T) {
	// A heartbeat timeout of 1 s makes an idle pump beat every 200 ms.
	p := newPair(t, pairOpts{tgtSize: mib, srcSize: mib, cfg: func(c *engineconfig.Config) { c.HeartbeatTimeout = time.Second }})
	ranks := []struct {
		name string
		e    *relay.Engine
		r    *memRank
	}{{"sender", p.a, p.rankA}, {"relay", p.b, p.rankB}}
	// Each rank relays for the other: a claim wakes the relay it claims a
	// lane on, so both claims come first.
	waitFor(t, "each rank holding a lane on the other", func() bool { return p.a.HasRelay("rail1") && p.b.HasRelay("rail0") })
	for _, rk := range ranks {
		waitFor(t, rk.name+" pump asleep", func() bool { return pumpAsleep(rk.e, rk.r.Wake()) })
	}
	type sample struct{ runs, sleeps, wakes, beats uint64 }
	take := func(i int) sample {
		rk := ranks[i]
		c := rk.e.Counters()
		return sample{runs: threadRuns(t, rk.e.PumpThreadID()), sleeps: c.PumpSleeps, wakes: c.PumpWakes, beats: rk.r.beats.Load()}
	}
	var before [2]sample
	for i := range ranks {
		before[i] = take(i)
	}
	const sleeps = 15
	for i, rk := range ranks {
		waitFor(t, fmt.Sprintf("%s pump through %d sleeps", rk.name, sleeps), func() bool {
			return rk.e.Counters().PumpSleeps-before[i].sleeps >= sleeps
		})
	}
	for i, rk := range ranks {
		a := take(i)
		runs, slept, woken, beats := a.runs-before[i].runs, a.sleeps-before[i].sleeps, a.wakes-before[i].wakes, a.beats-before[i].beats
		t.Logf("%s pump: %d sleeps, %d ended by a waker, %d heartbeats, %d runs of its thread", rk.name, slept, woken, beats, runs)
		if woken != 0 {
			t.Errorf("%s pump: a waker ended %d of %d sleeps of an idle pump, want none", rk.name, woken, slept)
		}
		if slept > 2*beats+2 {
			t.Errorf("%s pump slept %d times over %d heartbeats, want about one sleep a heartbeat", rk.name, slept, beats)
		}
		// A wake-up is one run; the runtime handing the locked goroutine
		// back to its thread and the preemptions of a loaded machine add
		// a few. A poll would add hundreds a sleep.
		if runs > 10*slept {
			t.Errorf("%s pump's thread ran %d times over %d sleeps, want at most 10 a sleep", rk.name, runs, slept)
		}
	}
}

// A Submit into idle engines goes through both wake words: the caller's
// wakes the sender's pump, the sender's Publish wakes the relay's. Neither
// waits for its heartbeat: the wake counters say a waker ended the sleep.
// Each round starts with both pumps in their sleep (their threads blocked
// on their wake words), and the heartbeat timeout is long, so that no
// sleep ends by its timeout during a round however slow the machine: only
// a waker can end it.
func TestSubmitAfterIdleWakesBothPumps(t *testing.T) {
	p := newPair(t, pairOpts{tgtSize: 16 * mib, srcSize: 16 * mib, cfg: func(c *engineconfig.Config) { c.HeartbeatTimeout = 5 * time.Minute }})
	const n = 10 << 10
	for round := range 3 {
		waitFor(t, "sender pump asleep", func() bool { return pumpAsleep(p.a, p.rankA.Wake()) })
		waitFor(t, "relay pump asleep", func() bool { return pumpAsleep(p.b, p.rankB.Wake()) })
		a0, b0 := p.a.Counters(), p.b.Counters()
		clear(p.tgt[sessRail1][:n])
		b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(round * n), Len: n, Target: sessRail1, Dst: tgtBase}})
		if err != nil {
			t.Fatal(err)
		}
		waitBatch(t, b)
		if st := statusOf(t, b, 0); st.State != relay.Completed || b.Route(0) != relay.RoutePXN {
			t.Fatalf("round %d: status %+v route %v, want completed through PXN", round, st, b.Route(0))
		}
		_ = b.Release()
		if !bytes.Equal(p.tgt[sessRail1][:n], p.srcBytes[round*n:(round+1)*n]) {
			t.Fatalf("round %d: destination bytes differ from the source", round)
		}
		a1, b1 := p.a.Counters(), p.b.Counters()
		if a1.PumpWakes == a0.PumpWakes {
			t.Errorf("round %d: the sender's pump was not woken by Submit (sleeps %d→%d)", round, a0.PumpSleeps, a1.PumpSleeps)
		}
		if b1.PumpWakes == b0.PumpWakes {
			t.Errorf("round %d: the relay's pump was not woken by the sender (sleeps %d→%d)", round, b0.PumpSleeps, b1.PumpSleeps)
		}
	}
}

// Two processes of a real registry: the relay's pump sleeps in ppoll over
// its lanes' eventfds, and the sender's Publish, in another process, wakes
// it through its lane's eventfd. Each write goes to pumps in their
// sleep; the heartbeat timeout is long, so that only a waker ends it. The
// relay starts first: an idle pump lists its peers only when it wakes, and
// the sender's first listing must find it.
func TestWakeAcrossProcesses(t *testing.T) {
	g := newFaultGroup(t, faultGroupOpts{env: map[string]string{contract.EnvHeartbeatTimeout: "300000"}})
	r := g.start("relay", 1, faultMiB)
	s := g.start("sender", 0, 4*faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	for i := range 3 {
		eventually(t, 20*time.Second, "both pumps asleep", func() bool { return s.asleep() && r.asleep() })
		s0, r0 := s.counters().Counters, r.counters().Counters
		s.submit(true, faultWrites(1, 1, 64<<10, uint64(i)*64<<10, uint64(i)*64<<10)...)
		checkStates(t, s.wait(20 * time.Second)[i:], map[string]int{"completed": 1})
		s1, r1 := s.counters().Counters, r.counters().Counters
		if r1.ForwardedPieces != r0.ForwardedPieces+1 {
			t.Fatalf("write %d: the relay forwarded %d pieces, want 1", i, r1.ForwardedPieces-r0.ForwardedPieces)
		}
		if s1.PumpWakes == s0.PumpWakes {
			t.Errorf("write %d: Submit did not wake the sender's pump", i)
		}
		if r1.PumpWakes == r0.PumpWakes {
			t.Errorf("write %d: the sender's Publish did not wake the relay's pump in the other process", i)
		}
	}
	g.verify(0, s.tasks())
}

// A burst of Submits while the pump sleeps costs one system call: the
// first Submit's wake takes the pump's flag, the rest find it clear. The
// test plays the pump (its rounds run by hand): it announces its sleep,
// the caller submits, and the sleep ends at once. A second burst while the
// pump runs (nothing announced) costs none.
func TestSubmitBurstWakesThePumpOnce(t *testing.T) {
	const burst, n = 16, 4 << 10
	p := newPair(t, pairOpts{tgtSize: burst * n, srcSize: burst * n, manual: true})
	for !p.a.HasRelay("rail1") {
		p.a.RunRound()
		p.b.RunRound()
	}
	w := p.rankA.Wake()
	for _, asleep := range []bool{true, false} {
		if asleep {
			w.Announce()
		}
		before := p.a.Counters().WakeCalls
		batches := make([]*relay.Batch, 0, burst)
		for i := range burst {
			b, err := p.a.Submit([]relay.Request{{Op: relay.Write, Src: p.src(i * n), Len: n, Target: sessRail1, Dst: tgtBase + uint64(i*n)}})
			if err != nil {
				t.Fatal(err)
			}
			batches = append(batches, b)
		}
		want := uint64(0)
		if asleep {
			want = 1
			if !w.Sleep(0, 10*time.Second) {
				t.Fatal("the pump's sleep was not ended by the burst")
			}
		}
		if got := p.a.Counters().WakeCalls - before; got != want {
			t.Errorf("pump asleep %v: %d Submits made %d wake calls, want %d", asleep, burst, got, want)
		}
		for _, b := range batches {
			for !b.Done() {
				p.a.RunRound()
				p.b.RunRound()
			}
			if st := statusOf(t, b, 0); st.State != relay.Completed || b.Route(0) != relay.RoutePXN {
				t.Fatalf("status %+v route %v, want completed through PXN", st, b.Route(0))
			}
			_ = b.Release()
		}
	}
}
