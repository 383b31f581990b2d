// SPDX-License-Identifier: Apache-2.0

package relay

import (
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
