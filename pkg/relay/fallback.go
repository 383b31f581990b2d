// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"fmt"
	"sync/atomic"
)

// fallbackReason is why a Piece went direct: staging.FallbackCreditTimeout
// and the rest, the index of its counts.
type fallbackReason uint8

// fallbackPiece is a Piece that goes direct: Piece i of g until its writes
// are built (g set), then the writes the hop has not taken yet.
type fallbackPiece struct {
	g      *group
	i      int
	reason fallbackReason
	ops    []WriteOp
	unsent []WriteOp
}

// fallbackQueue holds the Pieces that go direct. Callers push (a failed
// source-ready event) and so does the pump; only the pump pops. n is its
// length, kept under mu and read without it every round.
type fallbackQueue struct {
	mu chanMutex
	q  fifo[fallbackPiece]
	n  atomic.Int32
}

// chanMutex is a mutex that is a channel of one.
type chanMutex chan struct{}

func (m chanMutex) lock() { m <- struct{}{} }

func (m chanMutex) unlock() { <-m }

func (f *fallbackQueue) push(fb fallbackPiece) {
	f.mu.lock()
	f.q.push(fb)
	f.n.Store(int32(f.q.len()))
	f.mu.unlock()
}

func (f *fallbackQueue) pop() fallbackPiece {
	f.mu.lock()
	defer f.mu.unlock()
	fb := f.q.pop()
	f.n.Store(int32(f.q.len()))
	return fb
}

func (f *fallbackQueue) len() int { return int(f.n.Load()) }

// takeAll empties the queue and returns what it held.
func (f *fallbackQueue) takeAll() fifo[fallbackPiece] {
	f.mu.lock()
	defer f.mu.unlock()
	q := f.q
	f.q = fifo[fallbackPiece]{}
	f.n.Store(0)
	return q
}

// fallback sends Piece i of g direct, after its source-ready event.
func (s *shared) fallback(g *group, i int, why fallbackReason) {
	s.fallbacks.push(fallbackPiece{g: g, i: i, reason: why})
}

// runFallbacks sends direct the Pieces that never reached a doorbell, each
// exactly once and only after its source-ready event.
func (sn *sender) runFallbacks() bool {
	fb := &sn.s.fallbacks
	progressed := false
	for n := fb.len(); n > 0; n-- {
		p := fb.pop()
		keep, moved := sn.runFallback(&p)
		progressed = progressed || moved
		if keep {
			fb.push(p)
		}
	}
	return progressed
}

// runFallback moves one fallen-back Piece on: it reports whether the Piece
// still has work left and whether anything happened.
func (sn *sender) runFallback(fb *fallbackPiece) (keep, progressed bool) {
	s := sn.s
	if g := fb.g; g != nil {
		if g.ready != 0 {
			done, err := s.copier.Query(g.ready)
			if err != nil {
				s.counters.failedPieces.Add(1)
				g.finishPiece(fb.i, fmt.Errorf("source-ready event: %w", err))
				s.pieceDone(g)
				return false, true
			}
			if !done {
				return true, false
			}
		}
		// The writes carry their slices by value: the group is done with.
		ops := s.opBufs.get(g.pieceEntries(fb.i))
		it := g.plan.PieceSlices(g.blocks, fb.i)
		for sl, ok := it.Next(); ok; sl, ok = it.Next() {
			ops = append(ops, WriteOp{Src: uintptr(sl.Src), Len: sl.Len, Target: g.key.session, Dst: sl.Dst,
				Token: s.tokens.add(tokenEntry{kind: tokFallback, slice: taskSlice{batch: g.batch, task: int32(sl.Task), len: sl.Len}})})
		}
		s.counters.fallback(fb.reason, g.pieceLen(fb.i))
		g.key.lane.pieces.Add(-1)
		s.pieceDone(g)
		fb.g, fb.ops, fb.unsent = nil, ops, ops
	}
	before := len(fb.unsent)
	fb.unsent = s.drainOps(fb.unsent, nil)
	progressed = len(fb.unsent) != before
	if len(fb.unsent) > 0 {
		return true, progressed
	}
	s.opBufs.put(fb.ops)
	return false, progressed
}
