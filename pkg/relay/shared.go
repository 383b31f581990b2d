// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/engineconfig"
)

// shared is the part of the engine that callers and the pump both reach.
// Every field is read-only after Open or safe for concurrent use; what only
// the pump touches lives in its sender and relayer instead.
type shared struct {
	// sentTimes and relayedTimes keep the last Pieces' times (PieceTimes).
	sentTimes, relayedTimes timeRing

	cfg engineconfig.Config
	hop Hop
	// pieceHop is hop when it takes relayed Pieces whole, else nil.
	pieceHop PieceHop
	dir      Directory
	copier   Copier
	// partCopier is copier when it signals a Piece's parts, else nil.
	partCopier PartCopier
	// drainer is copier when it says when its lanes have drained, else
	// nil.
	drainer   CopyDrainer
	localRail string
	log       klog.Logger
	// hooks is nil in production.
	hooks *hooks

	// pxn is true while cross-rail writes may take the PXN path.
	pxn atomic.Bool
	// routes maps rails to outbound lanes; the pump replaces it, Submit
	// reads it.
	routes   atomic.Pointer[routeTable]
	tokens   tokenTable
	counters Counters

	batches *batchPool
	groups  *groupPool
	opBufs  *opsPool

	// backlog holds direct writes the hop could not take yet.
	backlogMu sync.Mutex
	backlog   []WriteOp

	fallbacks fallbackQueue
	invals    invalQueue

	// wakeWord is what the pump sleeps on (the registry's eventfds; a
	// word of its own without a registry). Everything that queues work
	// for the pump wakes it after the work is queued.
	wakeWord Waiter
	// pumpTID and pumpDead are the pump's thread id and whether it
	// stopped after a panic.
	pumpTID  atomic.Int64
	pumpDead atomic.Bool
}

func (s *shared) wake() {
	if s.wakeWord.Wake() {
		s.counters.wakeCalls.Add(1)
	}
}

// pieceDone counts Piece work of g as over; the last releases the
// source-ready event and returns g to the pool.
func (s *shared) pieceDone(g *group) {
	if g.pending.Add(-1) != 0 {
		return
	}
	if g.ready != 0 {
		s.copier.Release(g.ready)
	}
	s.groups.put(g)
}

// retryBacklog resubmits direct writes the hop could not take yet.
func (s *shared) retryBacklog() bool {
	s.backlogMu.Lock()
	defer s.backlogMu.Unlock()
	if len(s.backlog) == 0 {
		return false
	}
	before := len(s.backlog)
	rest := s.drainOps(s.backlog, nil)
	n := copy(s.backlog, rest)
	clear(s.backlog[n:])
	s.backlog = s.backlog[:n]
	return n != before
}

// hopChunk is how many ops go to the hop in one Submit: a Piece can carry
// 4096 entries, more than a bounded hop queue takes at once.
const hopChunk = 32

// drainOps submits ops in chunks until the hop is busy and returns those it
// has not taken. An op the hop refuses on its own (not as busy) fails, with
// its token, and the rest go on. Relayed writes fail through rly, which
// only the pump passes.
func (s *shared) drainOps(ops []WriteOp, rly *relayer) []WriteOp {
	chunk := hopChunk
	for len(ops) > 0 {
		c := min(chunk, len(ops))
		err := s.hop.Submit(ops[:c])
		switch {
		case err == nil:
			ops = ops[c:]
			chunk = hopChunk
		case errors.Is(err, ErrHopBusy):
			return ops
		case c > 1:
			chunk = c / 2
		default:
			s.failOps(ops[:1], fmt.Errorf("submit to the hop: %w", err), rly)
			ops = ops[1:]
		}
	}
	return ops
}

func (s *shared) failOps(ops []WriteOp, err error, rly *relayer) {
	for _, op := range ops {
		s.failToken(op.Token, err, rly)
	}
}

// applyCompletion applies one hop completion. One that is not final
// (ErrWriteHeld) ends a direct or fallback task now, and only marks a
// relayed write's Piece as failed: its token stays out for the final
// report, which ends the write.
func (s *shared) applyCompletion(c HopCompletion, rly *relayer) {
	if errors.Is(c.Err, ErrWriteHeld) {
		if ent, ok := s.tokens.peek(c.Token); ok && ent.kind == tokRelay {
			if rly != nil {
				rly.noteFailure(ent.rec, c.Err)
			}
			return
		}
	}
	if ent, ok := s.tokens.take(c.Token); ok {
		s.finishToken(ent, c.Err, rly)
	}
}

// failToken finishes what tok stands for with err, if it is still out.
func (s *shared) failToken(tok uint64, err error, rly *relayer) {
	if ent, ok := s.tokens.take(tok); ok {
		s.finishToken(ent, err, rly)
	}
}

// finishToken applies one hop completion. A relayed write's completion
// belongs to the relayer: only the pump has one to pass, and only the pump
// creates relay tokens.
func (s *shared) finishToken(ent tokenEntry, err error, rly *relayer) {
	switch ent.kind {
	case tokDirect, tokFallback:
		ent.slice.finish(err)
	case tokRelay:
		if rly != nil {
			rly.finishWrite(ent.rec, err)
		}
	}
}

// invalQueue holds the sessions InvalidateTarget named since the pump last
// looked ("" for all); pending says there are some.
type invalQueue struct {
	mu      sync.Mutex
	names   []string
	pending atomic.Bool
}

func (q *invalQueue) add(session string) {
	q.mu.Lock()
	q.names = append(q.names, session)
	q.pending.Store(true)
	q.mu.Unlock()
}

// swap hands the queued names out and keeps buf (emptied) in their place.
func (q *invalQueue) swap(buf []string) []string {
	if !q.pending.Load() {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	names := q.names
	q.names = buf[:0]
	q.pending.Store(false)
	return names
}
