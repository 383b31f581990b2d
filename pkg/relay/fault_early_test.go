// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// earlyChildEnv names, in a child of TestRelayCompletingEarlyCannotCrashSender,
// the way its sender gives the lane up.
const earlyChildEnv = "PXN_EARLY_COMPLETION"

// earlyRelay is a hostile relay: it opens every claimed lane of rank and
// completes every seq the sender says it published, OK, at once, before
// any part of its Piece has landed and without forwarding a byte.
type earlyRelay struct {
	rank   *memRank
	opened int
	done   [staging.LaneCount]uint64
}

func (f *earlyRelay) step() {
	for i := range staging.LaneCount {
		rx := f.rank.Inbound(i)
		epoch, _ := rx.Sync()
		if epoch == 0 {
			continue
		}
		if !rx.Opened() {
			if err := rx.Open(); err != nil {
				panic(err)
			}
			f.opened++
			f.done[i] = 0
		}
		w := f.rank.words[i].Load()
		for pub := atomic.LoadUint64(&w.Sender.Sender.PublishedSeq); f.done[i] < pub; {
			f.done[i]++
			c := &w.Relay.Completions[staging.SlotOf(f.done[i])]
			atomic.StoreInt32(&c.Status, staging.CompletionOK)
			atomic.StoreUint64(&c.Seq, f.done[i])
			atomic.StoreUint64(&w.Relay.Relay.CompletedSeq, f.done[i])
		}
	}
}

// A relay that completes a Piece before the sender's copier has written
// any of it, and then closes, dies or outlives the sender's engine, never
// makes the sender unmap the lane under its copier: the lane's claim and
// mappings go back only once the copier has finished what it was given.
// The copier is held before the Piece's first part (its source-ready event)
// until the lane was given up, and on main the sender then crashes on its
// copier's first part word. Each way runs in a process of its own, so that
// a crash fails the test instead of ending the test binary.
func TestRelayCompletingEarlyCannotCrashSender(t *testing.T) {
	if how := os.Getenv(earlyChildEnv); how != "" {
		runEarlyCompletion(t, how)
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"closing", "gone", "close"} {
		t.Run(how, func(t *testing.T) {
			cmd := exec.Command(exe, "-test.run=^TestRelayCompletingEarlyCannotCrashSender$", "-test.v")
			cmd.Env = append(os.Environ(), earlyChildEnv+"="+how)
			out, err := cmd.CombinedOutput()
			if err != nil {
				// The panic and the faulting goroutine come first.
				if len(out) > 3000 {
					out = out[:3000]
				}
				t.Fatalf("sender process: %v\n%s", err, out)
			}
		})
	}
}

func runEarlyCompletion(t *testing.T, how string) {
	const block, n = 16 << 10, 256 // 4 MiB, copied in parts
	p := newPair(t, pairOpts{tgtSize: n * block, srcSize: n * block, manual: true, without: "b", holdReady: true})
	fr := &earlyRelay{rank: p.rankB}
	waitFor(t, "a lane on rail1 that the relay opened", func() bool {
		p.a.RunRound()
		fr.step()
		return p.a.HasRelay("rail1") && fr.opened > 0
	})
	lane := -1
	for i := range p.rankB.claims {
		if p.rankB.claims[i].Load() >= 0 {
			lane = i
		}
	}
	reqs := kvRequests(p, n, block)
	b, err := p.a.Submit(reqs)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the relay's early completion reaped", func() bool {
		p.a.RunRound()
		fr.step()
		return b.Done()
	})
	if len(p.holdA.HeldReady()) == 0 {
		t.Fatal("the copier is not held before the Piece")
	}
	released := func() bool { return p.rankB.claims[lane].Load() < 0 }
	switch how {
	case "closing", "gone":
		if how == "closing" {
			p.rankB.closing.Store(true)
		} else {
			p.rankB.gone.Store(true)
		}
		waitFor(t, "the lane given up", func() bool {
			p.a.RunRound()
			return !p.a.HasRelay("rail1")
		})
		p.holdA.ReleaseAllReady()
		waitFor(t, "the lane released", func() bool {
			p.a.RunRound()
			return released()
		})
		if st := p.copA.Stats(); st.Copies != 1 || st.Parts == 0 {
			t.Fatalf("copier stats %+v: want the Piece copied, in parts", st)
		}
	case "close":
		// The copier goes on the moment the lane is released: a sender
		// that releases it before its copier has drained crashes.
		p.rankB.onRelease = func() { p.holdA.ReleaseAllReady() }
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.a.Close(ctx)
		if !released() {
			t.Fatal("the lane is still claimed after Close")
		}
	default:
		t.Fatalf("unknown way %q", how)
	}
	for i := range reqs {
		st := statusOf(t, b, i)
		if st.State != relay.Completed && st.Err == nil {
			t.Fatalf("task %d: %v without a reason", i, st.State)
		}
		dst := p.tgt[sessRail1][(n-1-i)*block:][:block]
		if own := p.srcBytes[i*block:][:block]; !bytes.Equal(dst, own) && !bytes.Equal(dst, make([]byte, block)) {
			t.Fatalf("task %d: destination holds bytes neither its own nor none", i)
		}
	}
}
