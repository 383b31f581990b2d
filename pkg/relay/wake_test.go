// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// threadSched is a thread's schedstat: CPU time and how many times it was
// put on a CPU (each wake-up counts one).
type threadSched struct {
	cpu    time.Duration
	slices uint64
}

func readSched(t *testing.T, tid int) threadSched {
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
	cpu, err1 := strconv.ParseUint(f[0], 10, 64)
	slices, err2 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("schedstat %q: %v %v", b, err1, err2)
	}
	return threadSched{cpu: time.Duration(cpu), slices: slices}
}

// An idle pump sleeps on its wake word and wakes for its heartbeat only:
// over 15 heartbeats each pump of a pair runs about once a heartbeat, far
// from the thousand wake-ups a second of a 1 ms poll.
func TestIdlePumpSleepsUntilItsHeartbeat(t *testing.T) {
	// A heartbeat timeout of 1 s makes an idle pump beat every 100 ms.
	p := newPair(t, pairOpts{tgtSize: mib, srcSize: mib, cfg: func(c *staging.Config) { c.HeartbeatTimeout = time.Second }})
	ranks := []struct {
		name string
		e    *relay.Engine
		r    *memRank
	}{{"sender", p.a, p.rankA}, {"relay", p.b, p.rankB}}
	for _, rk := range ranks {
		waitFor(t, rk.name+" pump asleep", rk.r.Wake().SleepingNow)
	}
	start := time.Now()
	var before [2]threadSched
	var sleeps [2]uint64
	for i, rk := range ranks {
		before[i] = readSched(t, rk.e.PumpThreadID())
		sleeps[i] = rk.e.Counters().PumpSleeps
	}
	const beats = 15
	for i, rk := range ranks {
		waitFor(t, fmt.Sprintf("%s pump through %d heartbeats", rk.name, beats), func() bool {
			return rk.e.Counters().PumpSleeps-sleeps[i] >= beats
		})
	}
	window := time.Since(start)
	for i, rk := range ranks {
		after := readSched(t, rk.e.PumpThreadID())
		slices, cpu := after.slices-before[i].slices, after.cpu-before[i].cpu
		t.Logf("%s pump over %v: %d wake-ups, %v CPU (%.3f %% of a core)", rk.name, window.Round(time.Millisecond), slices, cpu, 100*cpu.Seconds()/window.Seconds())
		if maxSlices := uint64(50 * window.Seconds()); slices > maxSlices {
			t.Errorf("%s pump ran %d times in %v, want at most %d (50 a second)", rk.name, slices, window, maxSlices)
		}
		if maxCPU := window / 100; cpu > maxCPU {
			t.Errorf("%s pump used %v of CPU in %v, want at most %v (1 %% of a core)", rk.name, cpu, window, maxCPU)
		}
	}
}

// A Submit into idle engines goes through both wake words: the caller's
// wakes the sender's pump, the sender's Publish wakes the relay's. Neither
// waits for its heartbeat: the wake counters say a waker ended the sleep.
func TestSubmitAfterIdleWakesBothPumps(t *testing.T) {
	p := newPair(t, pairOpts{tgtSize: 16 * mib, srcSize: 16 * mib})
	const n = 10 << 10
	for round := range 3 {
		waitFor(t, "sender pump asleep", p.rankA.Wake().SleepingNow)
		waitFor(t, "relay pump asleep", p.rankB.Wake().SleepingNow)
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

// Two processes of a real registry: the relay's pump sleeps on the wake
// word in its control file, and the sender's Publish, in another process,
// wakes it through that shared word. Each write goes to idle pumps.
func TestWakeAcrossProcesses(t *testing.T) {
	g := newFaultGroup(t, faultGroupOpts{})
	s := g.start("sender", 0, 4*faultMiB)
	r := g.start("relay", 1, faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	sw, rw := &g.control(s, false).Header.Wake, &g.control(r, false).Header.Wake
	for i := range 3 {
		eventually(t, 20*time.Second, "both pumps asleep", func() bool { return sw.SleepingNow() && rw.SleepingNow() })
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
