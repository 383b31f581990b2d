// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// The benchmarks and tests of this file take the engine apart: one engine
// with its pump driven by the test (ManualPump), and the test playing the
// other side of the ring through the shared control block. So the sender
// path, the relay path and the pump round are each measured alone.

// pathLoad is one Piece's worth of writes: count blocks of block bytes.
type pathLoad struct {
	name         string
	block, count int
}

var pathLoads = []pathLoad{
	{"10KiB", 10 << 10, 1},
	{"8MiB", 8 * mib, 1},
	{"16KiBx512", 16 << 10, 512},
	// The 8 MiB of the one-block load in the most blocks a Piece holds:
	// the difference is what the blocks cost.
	{"2KiBx4096", 2 << 10, staging.MaxPlans},
}

func (l pathLoad) bytes() int { return l.block * l.count }

func (l pathLoad) requests(p *pair) []relay.Request {
	reqs := make([]relay.Request, l.count)
	for i := range reqs {
		off := i * l.block
		reqs[i] = relay.Request{Op: relay.Write, Src: p.src(off), Len: uint64(l.block), Target: sessRail1, Dst: tgtBase + uint64(off)}
	}
	return reqs
}

// fakeRelay opens every claimed lane of rank and completes every ticket
// rung on them once its Piece has landed whole, with status OK when its
// Desc is valid.
type fakeRelay struct {
	rank   *memRank
	vd     staging.ValidDesc
	opened int
	// taken is each lane's Piece taken and not yet completed. A relay may
	// take a Piece once its first part has landed, but completes it only
	// once every part has: until its doorbell the sender's copier still
	// writes the slot and the part words.
	taken [staging.LaneCount]takenPiece
}

type takenPiece struct {
	epoch, seq uint64
	parts      int
}

func (f *fakeRelay) step() {
	for i := range staging.LaneCount {
		rx := f.rank.Inbound(i)
		epoch, _ := rx.Sync()
		if epoch == 0 {
			continue
		}
		t := &f.taken[i]
		if t.epoch != epoch {
			// The lane was claimed anew: the Piece never lands whole, and
			// its completion would write nothing.
			*t = takenPiece{}
		}
		// Nothing taken under an earlier epoch is pending, so nothing of
		// it still reads a slot.
		if !rx.Opened() {
			if err := rx.Open(); err != nil {
				panic(err)
			}
			f.opened++
		}
		for {
			if t.seq != 0 {
				if rx.PartsLanded(t.seq, t.parts) < t.parts {
					break
				}
				if err := rx.Complete(epoch, t.seq, staging.CompletionOK); err != nil {
					panic(err)
				}
				*t = takenPiece{}
			}
			if _, st := rx.Poll(); st != staging.TicketReady {
				break
			}
			seq, err := rx.Take(&f.vd)
			if err != nil {
				if err := rx.Complete(epoch, seq, staging.CompletionInvalidDesc); err != nil {
					panic(err)
				}
				continue
			}
			*t = takenPiece{epoch: epoch, seq: seq, parts: len(f.vd.PartEnds()) + 1}
		}
	}
}

// submitAndDrive submits reqs on e and runs its rounds, and other's steps,
// until the batch is done; every task must complete.
func submitAndDrive(tb testing.TB, e *relay.Engine, reqs []relay.Request, other func()) {
	bt, err := e.Submit(reqs)
	if err != nil {
		tb.Fatal(err)
	}
	for !bt.Done() {
		if !e.RunRound() {
			runtime.Gosched()
		}
		other()
	}
	for i := range reqs {
		if st, _ := bt.Status(i); st.State != relay.Completed {
			tb.Fatalf("task %d: %v (%v)", i, st.State, st.Err)
		}
	}
	if err := bt.Release(); err != nil {
		tb.Fatal(err)
	}
}

// senderPair is engine a alone, its pump driven by the caller, and a fake
// relay on rank b; it returns once a has a lane on b that b has opened.
func senderPair(tb testing.TB, size int) (*pair, *fakeRelay) {
	p := newPairTB(tb, pairOpts{tgtSize: size, srcSize: size, manual: true, without: "b"})
	fr := &fakeRelay{rank: p.rankB}
	waitFor(tb, "a lane on rail1 that the relay opened", func() bool {
		p.a.RunRound()
		fr.step()
		return p.a.HasRelay("rail1") && fr.opened > 0
	})
	return p, fr
}

// BenchmarkSenderPath measures Submit, publish and reap of one Piece per
// iteration: the engine's sender side and its copier, with the relay's part
// played by the benchmark.
func BenchmarkSenderPath(b *testing.B) {
	for _, l := range pathLoads {
		b.Run(l.name, func(b *testing.B) {
			p, fr := senderPair(b, l.bytes())
			reqs := l.requests(p)
			run := func() { submitAndDrive(b, p.a, reqs, fr.step) }
			// Past the host copier's first use of its buffers.
			for range 2 * cpucopy.LaneQueueDepth {
				run()
			}
			measureSteadyState(b, p, uint64(l.bytes()), run)
		})
	}
}

// fakeSender owns a lane on rank b's relay and publishes Pieces into it as
// a sender engine would, with the payload staged once per slot.
type fakeSender struct {
	link    relay.Link
	tx      *staging.SenderLane
	entries []staging.PlanEntry
}

// newFakeSender claims a lane of rank b and runs b's rounds until b has
// opened it.
func newFakeSender(tb testing.TB, p *pair, l pathLoad) *fakeSender {
	link, err := p.rankA.Attach(relay.Peer{Pid: p.rankB.pid, Epoch: p.rankB.epoch, Rail: p.rankB.rail, HCA: p.rankB.hca})
	if err != nil {
		tb.Fatal(err)
	}
	s := &fakeSender{link: link, tx: link.Sender()}
	waitFor(tb, "the relay opening the lane", func() bool {
		p.b.RunRound()
		return s.tx.Opened()
	})
	for i := range l.count {
		s.entries = append(s.entries, staging.PlanEntry{Dst: tgtBase + uint64(i*l.block), Len: uint64(l.block)})
	}
	lane := p.rankB.arena[staging.LaneOffset(link.LaneIndex()):]
	for slot := range staging.SlotsPerLane {
		copy(lane[slot*staging.SlotSize:], p.srcBytes[:l.bytes()])
	}
	return s
}

// send publishes one Piece and runs e's rounds until the relay completes it.
func (s *fakeSender) send(tb testing.TB, e *relay.Engine, n uint64) {
	seq, ok := s.tx.Ticket()
	if !ok {
		tb.Fatalf("no ticket at seq %d", s.tx.Next())
	}
	if err := s.tx.Commit(seq, sessRail1, s.entries, n, nil); err != nil {
		tb.Fatal(err)
	}
	staging.RingDoorbell(s.tx.ReadyWord(seq), seq)
	if err := s.tx.Publish(seq); err != nil {
		tb.Fatal(err)
	}
	for {
		got, st, ok := s.tx.Reap()
		if ok {
			if got != seq || st != staging.CompletionOK {
				tb.Fatalf("seq %d completed with status %d, want seq %d OK", got, st, seq)
			}
			return
		}
		if !e.RunRound() {
			runtime.Gosched()
		}
	}
}

// BenchmarkRelayPath measures the relay side of one Piece per iteration:
// Desc validation, the route lookup, the second hop's writes (a loopback
// that copies into the target) and the completion, with the sender's part
// played by the benchmark.
func BenchmarkRelayPath(b *testing.B) {
	for _, l := range pathLoads {
		b.Run(l.name, func(b *testing.B) {
			p := newPairTB(b, pairOpts{tgtSize: l.bytes(), srcSize: l.bytes(), manual: true, without: "a"})
			s := newFakeSender(b, p, l)
			run := func() { s.send(b, p.b, uint64(l.bytes())) }
			for range 3 {
				run()
			}
			measurePieces(b, uint64(l.bytes()), func() (uint64, uint64) {
				c := p.b.Counters()
				return c.ForwardedPieces, c.SecondHopFailures + c.InvalidDescs
			}, run)
			if !bytes.Equal(p.tgt[sessRail1][:l.bytes()], p.srcBytes[:l.bytes()]) {
				b.Fatal("target differs from the staged payload")
			}
		})
	}
}

// BenchmarkPumpRound measures one round of each engine's pump of a pair:
// idle, and while 10 KiB writes flow through the relay without pause.
func BenchmarkPumpRound(b *testing.B) {
	b.Run("idle", func(b *testing.B) {
		p := newPairTB(b, pairOpts{tgtSize: mib, srcSize: mib, manual: true})
		reqs := pathLoads[0].requests(p)
		warmPair(b, p, reqs)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			p.a.RunRound()
			p.b.RunRound()
		}
	})
	b.Run("busy", func(b *testing.B) {
		p := newPairTB(b, pairOpts{tgtSize: mib, srcSize: mib, manual: true})
		reqs := pathLoads[0].requests(p)
		warmPair(b, p, reqs)
		before := p.a.Counters().RelayedPieces
		var bt *relay.Batch
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if bt == nil || bt.Done() {
				if bt != nil {
					if err := bt.Release(); err != nil {
						b.Fatal(err)
					}
				}
				var err error
				if bt, err = p.a.Submit(reqs); err != nil {
					b.Fatal(err)
				}
			}
			p.a.RunRound()
			p.b.RunRound()
		}
		b.StopTimer()
		if n := p.a.Counters().RelayedPieces - before; n > 0 {
			b.ReportMetric(float64(b.N)/float64(n), "rounds/piece")
		}
	})
}

// warmPair attaches both engines' lanes and moves reqs through the relay
// until every pool on the way has reached its working size (the host
// copier keeps a buffer per queued copy and fills them on first use), with
// the pumps driven here.
func warmPair(tb testing.TB, p *pair, reqs []relay.Request) {
	for !p.a.HasRelay("rail1") {
		p.a.RunRound()
		p.b.RunRound()
	}
	for range 2 * cpucopy.LaneQueueDepth {
		submitAndDrive(tb, p.a, reqs, func() { p.b.RunRound() })
	}
}

// TestSteadyStateAllocatesNothing is P5's allocation target: once warm,
// Pieces of every shape cross the sender, the relay and both pumps without
// a heap allocation.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	type load struct {
		pathLoad
		first uint64
	}
	var loads []load
	for _, l := range pathLoads {
		loads = append(loads, load{l, staging.SlotSize})
	}
	// An 8 MiB request under the default ramp: five Pieces of 256 KiB to
	// 4 MiB, and the last 256 KiB.
	loads = append(loads, load{pathLoad{"16KiBx512 ramp", 16 << 10, 512}, 256 << 10})
	// A request of one block more than a Piece holds: two Pieces.
	loads = append(loads, load{pathLoad{"1KiBx4097", 1 << 10, staging.MaxPlans + 1}, staging.SlotSize})
	for _, l := range loads {
		t.Run(l.name, func(t *testing.T) {
			p := newPairTB(t, pairOpts{tgtSize: l.bytes(), srcSize: l.bytes(), manual: true, cfg: func(c *engineconfig.Config) { c.FirstPiece = l.first }})
			reqs := l.requests(p)
			warmPair(t, p, reqs)
			// The runtime itself allocates now and then (a new OS thread
			// when the copier's goroutines wake on a busy machine), so a
			// count above 0 is tried again; an allocation of the engine
			// happens on every attempt.
			const pieces, attempts = 50, 3
			var counts []uint64
			for range attempts {
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				for range pieces {
					submitAndDrive(t, p.a, reqs, func() { p.b.RunRound() })
				}
				runtime.ReadMemStats(&m1)
				counts = append(counts, m1.Mallocs-m0.Mallocs)
				if counts[len(counts)-1] == 0 {
					break
				}
			}
			if n := counts[len(counts)-1]; n != 0 {
				t.Fatalf("heap allocations over %d Pieces of %s, in %d attempts: %v; want 0", pieces, l.name, attempts, counts)
			}
			if !bytes.Equal(p.tgt[sessRail1][:l.bytes()], p.srcBytes[:l.bytes()]) {
				t.Fatal("target differs from the source")
			}
		})
	}
}
