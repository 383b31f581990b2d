// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/pxn-project/pxn/pkg/memrange"
	"github.com/pxn-project/pxn/pkg/relay"
)

// DefaultLoopbackDepth is the queue depth of a Loopback whose options leave it
// zero.
const DefaultLoopbackDepth = 256

// LoopbackOptions configures a Loopback.
type LoopbackOptions struct {
	// QueueDepth bounds the ops that Submit accepted and whose completion
	// Poll has not returned; beyond it Submit returns relay.ErrHopBusy.
	// Zero means DefaultLoopbackDepth.
	QueueDepth int
	// HoldCompletions holds every accepted op, unperformed, until the test
	// completes it with Complete, Fail or CompleteAll.
	HoldCompletions bool
}

// LoopbackStats are a Loopback's counters.
type LoopbackStats struct {
	Submitted uint64
	Succeeded uint64
	Failed    uint64
	Bytes     uint64
	Busy      uint64
	// Pieces counts Pieces submitted whole (SubmitPiece); their ops count
	// in Submitted too.
	Pieces   uint64
	Held     int
	Unpolled int
	// Resolves and Routes count Resolve and Route calls.
	Resolves uint64
	Routes   uint64
	// Lookups counts ops whose session was looked up by name when they
	// were performed; Routed counts ops performed through a route handle.
	Lookups uint64
	Routed  uint64
}

// Loopback is an in-process relay.Hop, relay.Router and relay.Directory for
// unit tests. Targets are buffers registered with AddTarget. An op is
// performed (its bytes copied from Src into the target buffer) when it
// finishes: at Submit, or, while completions are held, when the test
// completes it. Validation errors and injected failures are reported as
// completions.
//
// Resolve gives each range the Key of its buffer, and Route a handle for the
// session, so an op that carries both reaches its buffer without a lookup by
// name or a search of the ranges. An op whose Route is not a live handle of
// this Loopback for its Target fails with ErrStaleRoute (and
// ErrUnknownSession once the session is removed): a handle from another
// Loopback is never trusted, since its keys name another Loopback's buffers.
type Loopback struct {
	mu       sync.Mutex
	depth    int
	hold     bool
	busy     bool
	sessions map[string]*loopSession
	rules    []failRule
	held     []heldEntry
	done     []relay.HopCompletion
	stats    LoopbackStats
}

// loopSession is a registered session and the handle Route returns for it.
type loopSession struct {
	owner *Loopback
	name  string
	// removed is set by RemoveTarget: the handle is no longer honoured.
	removed bool
	// hcas, ranges and bufs are replaced, never modified in place, so the
	// slices Resolve returned stay valid. ranges[i] describes bufs[i], and
	// its Key is i+1.
	hcas   []string
	ranges []relay.Range
	spans  memrange.Spans
	bufs   [][]byte
}

type failRule struct {
	session string
	whole   bool
	r       relay.Range
	err     error
}

var (
	_ relay.Hop       = (*Loopback)(nil)
	_ relay.Router    = (*Loopback)(nil)
	_ relay.Directory = (*Loopback)(nil)
)

// NewLoopback returns an empty Loopback.
func NewLoopback(opts LoopbackOptions) *Loopback {
	depth := opts.QueueDepth
	if depth <= 0 {
		depth = DefaultLoopbackDepth
	}
	return &Loopback{depth: depth, hold: opts.HoldCompletions, sessions: make(map[string]*loopSession)}
}

// AddTarget registers buf as the range [base, base+len(buf)) of session,
// served by the NIC named hca. A session registered with several HCAs
// resolves to all of them. The Loopback writes into buf until the test stops
// using it or removes the session.
func (l *Loopback) AddTarget(session, hca string, buf []byte, base uint64) error {
	if session == "" || hca == "" {
		return fmt.Errorf("fabric: target needs a session and an HCA (session %q, hca %q)", session, hca)
	}
	size := uint64(len(buf))
	if !memrange.ValidRange(base, size) {
		return fmt.Errorf("fabric: target %q: invalid range %#x+%d", session, base, size)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[session]
	if s == nil {
		s = &loopSession{owner: l, name: session}
		l.sessions[session] = s
	}
	if s.spans.Overlaps(base, size) {
		return fmt.Errorf("fabric: target %q: range %#x+%d overlaps a registered range", session, base, size)
	}
	s.bufs = append(slices.Clip(s.bufs), buf)
	s.spans = s.spans.Insert(memrange.Span{Start: base, Size: size, Ref: len(s.bufs) - 1})
	s.ranges = append(slices.Clip(s.ranges), relay.Range{Addr: base, Len: size, Key: uint64(len(s.bufs))})
	if !slices.Contains(s.hcas, hca) {
		s.hcas = append(slices.Clip(s.hcas), hca)
	}
	return nil
}

// RemoveTarget forgets session and all its ranges. From then on ops to it
// fail with ErrUnknownSession, held ones included, and so do Resolve, Route
// and ops that carry a route handle issued for it before; the Loopback no
// longer writes into its buffers. AddTarget may register the session again,
// with a new handle.
func (l *Loopback) RemoveTarget(session string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[session]
	if s == nil {
		return fmt.Errorf("fabric: remove target: %w: %q", ErrUnknownSession, session)
	}
	s.removed = true
	delete(l.sessions, session)
	return nil
}

// Resolve returns the HCAs and ranges of session; dst must lie in one of the
// ranges. The Key of a range is its buffer's position in the session, from
// 1. The returned slices must not be modified.
func (l *Loopback) Resolve(session string, dst uint64) (relay.Target, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stats.Resolves++
	s := l.sessions[session]
	if s == nil {
		return relay.Target{}, fmt.Errorf("%w: %q", ErrUnknownSession, session)
	}
	if s.spans.Find(dst, 1) < 0 {
		return relay.Target{}, fmt.Errorf("%w: session %q dst %#x", ErrOutOfRange, session, dst)
	}
	return relay.Target{HCAs: s.hcas, Ranges: s.ranges}, nil
}

// Route returns this Loopback's handle for session, for WriteOp.Route. The
// handle stays valid until RemoveTarget removes the session.
func (l *Loopback) Route(session string) (any, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stats.Routes++
	s := l.sessions[session]
	if s == nil {
		return nil, fmt.Errorf("fabric: route: %w: %q", ErrUnknownSession, session)
	}
	return s, nil
}

// FailSession makes every op to session that finishes from now on fail with
// err.
func (l *Loopback) FailSession(session string, err error) {
	l.mu.Lock()
	l.rules = append(l.rules, failRule{session: session, whole: true, err: err})
	l.mu.Unlock()
}

// FailRange makes every op to session whose destination shares a byte with r
// fail with err.
func (l *Loopback) FailRange(session string, r relay.Range, err error) {
	l.mu.Lock()
	l.rules = append(l.rules, failRule{session: session, r: r, err: err})
	l.mu.Unlock()
}

// ClearFailures removes every failure rule.
func (l *Loopback) ClearFailures() {
	l.mu.Lock()
	l.rules = nil
	l.mu.Unlock()
}

// SetHold turns holding of completions on or off. Ops already held stay held.
func (l *Loopback) SetHold(on bool) {
	l.mu.Lock()
	l.hold = on
	l.mu.Unlock()
}

// SetBusy makes every Submit return relay.ErrHopBusy while on.
func (l *Loopback) SetBusy(on bool) {
	l.mu.Lock()
	l.busy = on
	l.mu.Unlock()
}

// Submit accepts every op of ops or, when the queue has no room for all of
// them, none and returns relay.ErrHopBusy.
func (l *Loopback) Submit(ops []relay.WriteOp) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(ops) > l.depth {
		return fmt.Errorf("fabric: batch of %d ops exceeds the loopback queue depth %d", len(ops), l.depth)
	}
	if l.busy || len(l.held)+len(l.done)+len(ops) > l.depth {
		l.stats.Busy++
		return relay.ErrHopBusy
	}
	l.stats.Submitted += uint64(len(ops))
	for _, op := range ops {
		if l.hold {
			l.held = append(l.held, heldEntry{op: op, token: op.Token})
			continue
		}
		l.finish(op, nil)
	}
	return nil
}

// heldEntry is an accepted op, or a Piece's ops, not yet performed.
type heldEntry struct {
	token uint64
	op    relay.WriteOp
	// piece holds the ops of a Piece submitted whole (op is unused).
	piece []relay.WriteOp
}

// SubmitPiece accepts a relayed Piece's ops whole (relay.PieceHop): they
// count as one toward the queue depth and end in one completion carrying
// token, whose error is the first op's failure. Held, the Piece is one
// entry under token.
func (l *Loopback) SubmitPiece(ops []relay.WriteOp, token uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.busy || len(l.held)+len(l.done)+1 > l.depth {
		l.stats.Busy++
		return relay.ErrHopBusy
	}
	l.stats.Submitted += uint64(len(ops))
	l.stats.Pieces++
	if l.hold {
		l.held = append(l.held, heldEntry{token: token, piece: slices.Clone(ops)})
		return nil
	}
	l.finishPiece(ops, token, nil)
	return nil
}

// finishPiece performs and counts a Piece's ops and queues one completion
// with the first failure. l.mu is held.
func (l *Loopback) finishPiece(ops []relay.WriteOp, token uint64, forced error) {
	var first error
	for _, op := range ops {
		if err := l.count(op, forced); err != nil && first == nil {
			first = err
		}
	}
	l.done = append(l.done, relay.HopCompletion{Token: token, Err: first})
}

// complete finishes a held entry. l.mu is held.
func (l *Loopback) complete(h heldEntry, forced error) {
	if h.piece != nil {
		l.finishPiece(h.piece, h.token, forced)
		return
	}
	l.finish(h.op, forced)
}

// finish performs and counts op (count) and queues its completion. l.mu is
// held.
func (l *Loopback) finish(op relay.WriteOp, forced error) {
	l.done = append(l.done, relay.HopCompletion{Token: op.Token, Err: l.count(op, forced)})
}

// count performs op unless forced or a rule or validation fails it, counts
// the outcome and returns its error. l.mu is held.
func (l *Loopback) count(op relay.WriteOp, forced error) error {
	err := forced
	if err == nil {
		err = l.perform(op)
	}
	if err != nil {
		l.stats.Failed++
	} else {
		l.stats.Succeeded++
		l.stats.Bytes += op.Len
	}
	return err
}

func (l *Loopback) perform(op relay.WriteOp) error {
	for _, r := range l.rules {
		if r.session != op.Target {
			continue
		}
		if r.whole || rangesMeet(r.r, op.Dst, op.Len) {
			return fmt.Errorf("fabric: loopback write token %d to %q dst %#x len %d: %w", op.Token, op.Target, op.Dst, op.Len, r.err)
		}
	}
	var s *loopSession
	if op.Route != nil {
		var err error
		if s, err = l.routed(op); err != nil {
			return err
		}
		l.stats.Routed++
	} else {
		l.stats.Lookups++
		if s = l.sessions[op.Target]; s == nil {
			return fmt.Errorf("fabric: loopback write token %d: %w: %q", op.Token, ErrUnknownSession, op.Target)
		}
	}
	buf, base, err := s.dest(op)
	if err != nil {
		return err
	}
	if op.Len == 0 {
		return nil
	}
	if op.Src == 0 || !memrange.ValidRange(uint64(op.Src), op.Len) {
		return fmt.Errorf("fabric: loopback write token %d to %q: source %#x len %d is not addressable", op.Token, op.Target, op.Src, op.Len)
	}
	off := op.Dst - base
	copy(buf[off:off+op.Len], memrange.Bytes(op.Src, op.Len))
	return nil
}

// routed returns the session of op's route handle, or why the handle is not
// honoured. l.mu is held.
func (l *Loopback) routed(op relay.WriteOp) (*loopSession, error) {
	s, ok := op.Route.(*loopSession)
	switch {
	case !ok || s.owner != l:
		return nil, fmt.Errorf("fabric: loopback write token %d to %q: %w: handle %T was not issued by this loopback", op.Token, op.Target, ErrStaleRoute, op.Route)
	case s.name != op.Target:
		return nil, fmt.Errorf("fabric: loopback write token %d to %q: %w: handle is for session %q", op.Token, op.Target, ErrStaleRoute, s.name)
	case s.removed:
		return nil, fmt.Errorf("fabric: loopback write token %d: %w: %w: %q was removed", op.Token, ErrStaleRoute, ErrUnknownSession, op.Target)
	}
	return s, nil
}

// dest returns the buffer that holds op's destination and the buffer's base
// address. A Key picks the buffer, and then the destination must lie in it:
// a Key that does not hold it is the caller's bug, not a reason to search.
// Without a Key the ranges are searched. l.mu is held.
func (s *loopSession) dest(op relay.WriteOp) ([]byte, uint64, error) {
	if op.Key == 0 {
		i := s.spans.Find(op.Dst, op.Len)
		if i < 0 {
			return nil, 0, fmt.Errorf("fabric: loopback write token %d to %q: %w: dst %#x len %d", op.Token, op.Target, ErrOutOfRange, op.Dst, op.Len)
		}
		sp := s.spans[i]
		return s.bufs[sp.Ref], sp.Start, nil
	}
	if op.Key > uint64(len(s.ranges)) {
		return nil, 0, fmt.Errorf("fabric: loopback write token %d to %q: %w: key %d names no range (the session has %d): dst %#x len %d", op.Token, op.Target, ErrOutOfRange, op.Key, len(s.ranges), op.Dst, op.Len)
	}
	r := s.ranges[op.Key-1]
	if !memrange.Within(r.Addr, r.Len, op.Dst, op.Len) {
		return nil, 0, fmt.Errorf("fabric: loopback write token %d to %q: %w: key %d names range %#x+%d, which does not hold dst %#x len %d", op.Token, op.Target, ErrOutOfRange, op.Key, r.Addr, r.Len, op.Dst, op.Len)
	}
	return s.bufs[op.Key-1], r.Addr, nil
}

// rangesMeet reports whether r and [dst, dst+n) share a byte.
func rangesMeet(r relay.Range, dst, n uint64) bool {
	if r.Len == 0 || n == 0 {
		return false
	}
	return dst <= r.Addr+(r.Len-1) && r.Addr <= dst+(n-1)
}

// Held returns the tokens of the held ops in submission order.
func (l *Loopback) Held() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]uint64, len(l.held))
	for i, h := range l.held {
		out[i] = h.token
	}
	return out
}

// Complete performs the earliest held op with token and queues its
// completion.
func (l *Loopback) Complete(token uint64) error {
	return l.release(token, nil)
}

// Fail completes the earliest held op with token with err, without
// performing it.
func (l *Loopback) Fail(token uint64, err error) error {
	if err == nil {
		return errors.New("fabric: Fail needs a non-nil error")
	}
	return l.release(token, err)
}

func (l *Loopback) release(token uint64, err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, h := range l.held {
		if h.token == token {
			l.held = slices.Delete(l.held, i, i+1)
			l.complete(h, err)
			return nil
		}
	}
	return fmt.Errorf("fabric: no held op with token %d", token)
}

// CompleteAll performs every held op in submission order and returns how
// many there were.
func (l *Loopback) CompleteAll() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := l.held
	l.held = nil
	for _, h := range held {
		l.complete(h, nil)
	}
	return len(held)
}

// Poll moves up to len(out) completions into out.
func (l *Loopback) Poll(out []relay.HopCompletion) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return pollInto(out, &l.done)
}

// Stats returns the Loopback's counters.
func (l *Loopback) Stats() LoopbackStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.Held = len(l.held)
	s.Unpolled = len(l.done)
	return s
}
