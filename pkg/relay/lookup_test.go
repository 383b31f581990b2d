// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// lookupRig is a relay on rail1 whose directory counts its lookups, with
// raw sender lanes on its inbound lanes: the test plays the senders.
type lookupRig struct {
	rank *memRank
	e    *relay.Engine
	hop  *fabric.Loopback
	dir  *tallyDir
	tgt  []byte
	txs  []*staging.SenderLane
}

// newLookupRig opens the relay with lanes senders; wrap, when set, gives
// the relay the directory it returns in place of the counting one.
func newLookupRig(t *testing.T, lanes int, manual bool, wrap func(relay.Directory) relay.Directory) *lookupRig {
	t.Helper()
	r := &lookupRig{rank: newMemGroup(t).add("rail1", "mlx5_1"), hop: fabric.NewLoopback(fabric.LoopbackOptions{}), tgt: mapAnon(t, mib)}
	if err := r.hop.AddTarget(sessRail1, "rmlx5_1", r.tgt, tgtBase); err != nil {
		t.Fatal(err)
	}
	r.dir = &tallyDir{Directory: r.hop, calls: map[string]int{}}
	var dir relay.Directory = r.dir
	if wrap != nil {
		dir = wrap(dir)
	}
	var err error
	r.e, err = relay.OpenWithFaultHooks(enabledConfig(), relay.Deps{Hop: r.hop, Directory: dir, Copier: cpucopy.NewHostCopier(),
		Registry: r.rank, LocalHCA: "mlx5_1"}, relay.FaultHooks{ManualPump: manual, SeparateSlots: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.e.Close(ctx)
	})
	for i := range lanes {
		tx, _, closeWake := r.rank.claim(i, staging.Identity{Pid: 3000 + i, StartTime: 1, Epoch: uint64(i + 1)}, uint64(0x100+i))
		t.Cleanup(closeWake)
		r.txs = append(r.txs, tx)
	}
	// Senders take tickets once the relay has opened their lanes.
	waitFor(t, "the relay opening the lanes", func() bool {
		if manual {
			r.e.RunRound()
		}
		for _, tx := range r.txs {
			if !tx.Opened() {
				return false
			}
		}
		return true
	})
	return r
}

// publish stages payload in lane's next slot and publishes it as a Piece
// to dst of session; it reports false when the lane has no credit.
func (r *lookupRig) publish(t *testing.T, lane int, session string, dst uint64, payload []byte) (uint64, bool) {
	t.Helper()
	tx := r.txs[lane]
	seq, ok := tx.Ticket()
	if !ok {
		return 0, false
	}
	copy(r.rank.arena[staging.SlotOffset(lane, staging.SlotOf(seq)):], payload)
	n := uint64(len(payload))
	if err := tx.Commit(seq, session, []staging.PlanEntry{{Dst: dst, Len: n}}, n, nil); err != nil {
		t.Fatal(err)
	}
	staging.RingDoorbell(tx.ReadyWord(seq), seq)
	if err := tx.Publish(seq); err != nil {
		t.Fatal(err)
	}
	return seq, true
}

// reapAt runs the manual pump's rounds at now until lane's completion of
// seq comes, and returns its status; completions must come in seq order.
func (r *lookupRig) reapAt(t *testing.T, lane int, seq uint64, now time.Time) int32 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, st, ok := r.txs[lane].Reap(); ok {
			if got != seq {
				t.Fatalf("lane %d completed seq %d, want %d", lane, got, seq)
			}
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("lane %d: seq %d not completed", lane, seq)
		}
		r.e.RunRoundAt(now)
	}
}

// 200 Pieces of two senders naming two sessions no directory knows, all
// within one window of the relay's clock: one lookup per (lane, session),
// every Piece unresolved, and a Piece to a known target between them goes
// through. Past the window, or once the host invalidates the session, the
// lane looks it up again.
func TestUnknownSessionsLookedUpOncePerLaneAndWindow(t *testing.T) {
	const lanes, pieces = 2, 200
	r := newLookupRig(t, lanes, true, nil)
	ghosts := []string{"ghost-0", "ghost-1"}
	payload := make([]byte, 4096)
	fillPattern(payload, 7)
	t0 := time.Now()
	for k := range pieces {
		lane, ghost := k%lanes, ghosts[(k/lanes)%len(ghosts)]
		seq, ok := r.publish(t, lane, ghost, tgtBase, payload)
		if !ok {
			t.Fatalf("piece %d: no credit on lane %d", k, lane)
		}
		if st := r.reapAt(t, lane, seq, t0); st != staging.CompletionUnresolved {
			t.Fatalf("piece %d to %q on lane %d: status %d, want %d (unresolved)", k, ghost, lane, st, staging.CompletionUnresolved)
		}
		if k == pieces/2 {
			seq, _ := r.publish(t, lane, sessRail1, tgtBase, payload)
			if st := r.reapAt(t, lane, seq, t0); st != staging.CompletionOK {
				t.Fatalf("piece to %q on lane %d among the unknown ones: status %d, want OK", sessRail1, lane, st)
			}
		}
	}
	for _, g := range ghosts {
		if n := r.dir.count(g); n != lanes {
			t.Errorf("%q looked up %d times for %d Pieces of %d lanes, want %d", g, n, pieces/len(ghosts), lanes, lanes)
		}
	}
	if !bytes.Equal(r.tgt[:len(payload)], payload) {
		t.Error("the known target's bytes differ from the payload")
	}

	later := t0.Add(relay.UnresolvedFor)
	seq, _ := r.publish(t, 0, ghosts[0], tgtBase, payload)
	if st := r.reapAt(t, 0, seq, later); st != staging.CompletionUnresolved || r.dir.count(ghosts[0]) != lanes+1 {
		t.Errorf("past the window: status %d after %d lookups of %q, want unresolved after %d", st, r.dir.count(ghosts[0]), ghosts[0], lanes+1)
	}
	r.e.InvalidateTarget(ghosts[1])
	seq, _ = r.publish(t, 1, ghosts[1], tgtBase, payload)
	if st := r.reapAt(t, 1, seq, t0); st != staging.CompletionUnresolved || r.dir.count(ghosts[1]) != lanes+1 {
		t.Errorf("after an invalidation: status %d after %d lookups of %q, want unresolved after %d", st, r.dir.count(ghosts[1]), ghosts[1], lanes+1)
	}
}

// tallyDir counts lookups by session and answers as the directory it
// wraps.
type tallyDir struct {
	relay.Directory
	mu    sync.Mutex
	calls map[string]int
}

func (d *tallyDir) Resolve(session string, dst uint64) (relay.Target, error) {
	d.mu.Lock()
	d.calls[session]++
	d.mu.Unlock()
	return d.Directory.Resolve(session, dst)
}

func (d *tallyDir) count(session string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[session]
}

// blockingDir holds every lookup of one session until released.
type blockingDir struct {
	relay.Directory
	session string
	entered chan struct{}
	release chan struct{}
}

func (d *blockingDir) Resolve(session string, dst uint64) (relay.Target, error) {
	if session == d.session {
		d.entered <- struct{}{}
		<-d.release
	}
	return d.Directory.Resolve(session, dst)
}

// While the directory holds lane 0's lookup, the other lanes' Pieces, to a
// session none has resolved yet, go through; lane 0's Pieces wait, in
// order, and complete once the lookup answers.
func TestSlowLookupHoldsOnlyItsLane(t *testing.T) {
	const slow = "target-slow"
	var bd *blockingDir
	r := newLookupRig(t, staging.LaneCount, false, func(d relay.Directory) relay.Directory {
		bd = &blockingDir{Directory: d, session: slow, entered: make(chan struct{}, 1), release: make(chan struct{})}
		return bd
	})
	var once sync.Once
	release := func() { once.Do(func() { close(bd.release) }) }
	t.Cleanup(release)
	slowBuf := mapAnon(t, mib)
	if err := r.hop.AddTarget(slow, "rmlx5_1", slowBuf, tgtBase); err != nil {
		t.Fatal(err)
	}
	payload := func(lane, k int) []byte {
		b := make([]byte, 4096)
		fillPattern(b, uint64(lane*16+k+1))
		return b
	}
	dstOf := func(lane, k int) uint64 { return tgtBase + uint64(lane*16+k)*4096 }

	first, _ := r.publish(t, 0, slow, tgtBase, payload(0, 0))
	second, _ := r.publish(t, 0, sessRail1, dstOf(0, 1), payload(0, 1))
	<-bd.entered
	const perLane = 3
	for lane := 1; lane < staging.LaneCount; lane++ {
		for k := range perLane {
			if _, ok := r.publish(t, lane, sessRail1, dstOf(lane, k), payload(lane, k)); !ok {
				t.Fatalf("no credit on lane %d", lane)
			}
		}
	}
	done := make([]int, staging.LaneCount)
	waitFor(t, "the other lanes' Pieces", func() bool {
		for lane := 1; lane < staging.LaneCount; lane++ {
			for {
				seq, st, ok := r.txs[lane].Reap()
				if !ok {
					break
				}
				if st != staging.CompletionOK || seq != uint64(done[lane]+1) {
					t.Fatalf("lane %d: seq %d completed with status %d, want seq %d OK", lane, seq, st, done[lane]+1)
				}
				done[lane]++
			}
			if done[lane] < perLane {
				return false
			}
		}
		return true
	})
	if seq, st, ok := r.txs[0].Reap(); ok {
		t.Fatalf("lane 0 completed seq %d (status %d) while its lookup was held", seq, st)
	}
	for lane := 1; lane < staging.LaneCount; lane++ {
		for k := range perLane {
			off := dstOf(lane, k) - tgtBase
			if !bytes.Equal(r.tgt[off:off+4096], payload(lane, k)) {
				t.Fatalf("lane %d Piece %d: target bytes differ", lane, k)
			}
		}
	}

	release()
	for _, want := range []uint64{first, second} {
		var seq uint64
		var st int32
		waitFor(t, fmt.Sprintf("lane 0's seq %d", want), func() bool {
			var ok bool
			seq, st, ok = r.txs[0].Reap()
			return ok
		})
		if seq != want || st != staging.CompletionOK {
			t.Fatalf("lane 0: seq %d completed with status %d, want seq %d OK", seq, st, want)
		}
	}
	if !bytes.Equal(slowBuf[:4096], payload(0, 0)) {
		t.Error("the slow target's bytes differ from lane 0's first Piece")
	}
	off := dstOf(0, 1) - tgtBase
	if !bytes.Equal(r.tgt[off:off+4096], payload(0, 1)) {
		t.Error("lane 0's second Piece did not land")
	}
	if n := r.dir.count(slow); n != 1 {
		t.Errorf("%q looked up %d times, want once", slow, n)
	}
}

// A lookup that never answers fails its Piece once the Piece has waited
// LookupWait on the relay's clock; the lane then serves Pieces on cached
// routes, fails those that need another lookup without one, and takes the
// late answer into the cache. A Piece still waiting when the relay closes
// completes as closing.
func TestLookupThatDoesNotAnswerFailsItsPiece(t *testing.T) {
	const slow = "target-slow"
	var bd *blockingDir
	r := newLookupRig(t, 2, true, func(d relay.Directory) relay.Directory {
		bd = &blockingDir{Directory: d, session: slow, entered: make(chan struct{}, 1), release: make(chan struct{})}
		return bd
	})
	var once sync.Once
	release := func() { once.Do(func() { close(bd.release) }) }
	t.Cleanup(release)
	slowBuf := mapAnon(t, mib)
	if err := r.hop.AddTarget(slow, "rmlx5_1", slowBuf, tgtBase); err != nil {
		t.Fatal(err)
	}
	if err := r.hop.AddTarget("target-other", "rmlx5_1", mapAnon(t, mib), tgtBase); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 4096)
	fillPattern(payload, 3)
	t0 := time.Now()
	seq, _ := r.publish(t, 1, sessRail1, tgtBase, payload)
	if st := r.reapAt(t, 1, seq, t0); st != staging.CompletionOK {
		t.Fatalf("warm-up Piece on lane 1: status %d", st)
	}

	held, _ := r.publish(t, 0, slow, tgtBase, payload)
	r.roundsUntilEntered(t, bd, t0)
	for range 100 {
		r.e.RunRoundAt(t0.Add(relay.LookupWait - time.Millisecond))
	}
	if got, st, ok := r.txs[0].Reap(); ok {
		t.Fatalf("seq %d completed with status %d before the wait ended", got, st)
	}
	if st := r.reapAt(t, 0, held, t0.Add(relay.LookupWait)); st != staging.CompletionUnresolved {
		t.Fatalf("held Piece: status %d, want %d (unresolved)", st, staging.CompletionUnresolved)
	}
	t1 := t0.Add(relay.LookupWait)
	seq, _ = r.publish(t, 0, sessRail1, tgtBase+4096, payload)
	if st := r.reapAt(t, 0, seq, t1); st != staging.CompletionOK {
		t.Fatalf("Piece on a cached route while the lookup is held: status %d, want OK", st)
	}
	seq, _ = r.publish(t, 0, "target-other", tgtBase, payload)
	if st := r.reapAt(t, 0, seq, t1); st != staging.CompletionUnresolved || r.dir.count("target-other") != 0 {
		t.Fatalf("Piece needing a second lookup: status %d after %d lookups, want unresolved after none", st, r.dir.count("target-other"))
	}

	release()
	waitFor(t, "the held lookup's answer", func() bool { return r.e.LookupSettled(0) })
	seq, _ = r.publish(t, 0, slow, tgtBase, payload)
	if st := r.reapAt(t, 0, seq, t1); st != staging.CompletionOK {
		t.Fatalf("Piece to the slow target after its answer: status %d, want OK", st)
	}
	if n := r.dir.count(slow); n != 1 || !bytes.Equal(slowBuf[:len(payload)], payload) {
		t.Fatalf("slow target looked up %d times, bytes landed %v; want once, true", n, bytes.Equal(slowBuf[:len(payload)], payload))
	}

	// Held again on a session the lane has not asked for: the relay closes.
	bd.session = "target-other"
	bd.release = make(chan struct{})
	seq, _ = r.publish(t, 0, "target-other", tgtBase, payload)
	r.roundsUntilEntered(t, bd, t1)
	close(bd.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A manual pump does not drain: Close fails what is left, and says so.
	_ = r.e.Close(ctx)
	if got, st, ok := r.txs[0].Reap(); !ok || got != seq || st != staging.CompletionRelayClosing {
		t.Fatalf("Piece waiting at close: seq %d status %d (ok %v), want seq %d closing", got, st, ok, seq)
	}
}

// roundsUntilEntered runs the manual pump's rounds at now until the
// directory holds a lookup.
func (r *lookupRig) roundsUntilEntered(t *testing.T, bd *blockingDir, now time.Time) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-bd.entered:
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay never looked %q up", bd.session)
		}
		r.e.RunRoundAt(now)
	}
}
