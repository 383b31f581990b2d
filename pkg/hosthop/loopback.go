package hosthop

import (
	"errors"
	"fmt"
	"slices"
	"sync"

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
	Held      int
	Unpolled  int
}

// Loopback is an in-process relay.Hop and relay.Directory for unit tests.
// Targets are buffers registered with AddTarget. An op is performed (its bytes
// copied from Src into the target buffer) when it finishes: at Submit, or,
// while completions are held, when the test completes it. Validation errors
// and injected failures are reported as completions.
type Loopback struct {
	mu       sync.Mutex
	depth    int
	hold     bool
	busy     bool
	sessions map[string]*loopSession
	rules    []failRule
	held     []relay.WriteOp
	done     []relay.HopCompletion
	stats    LoopbackStats
}

type loopSession struct {
	// hcas, ranges and bufs are replaced, never modified in place, so the
	// slices Resolve returned stay valid.
	hcas   []string
	ranges []relay.Range
	spans  spans
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
// using it.
func (l *Loopback) AddTarget(session, hca string, buf []byte, base uint64) error {
	if session == "" || hca == "" {
		return fmt.Errorf("hosthop: target needs a session and an HCA (session %q, hca %q)", session, hca)
	}
	size := uint64(len(buf))
	if !validRange(base, size) {
		return fmt.Errorf("hosthop: target %q: invalid range %#x+%d", session, base, size)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[session]
	if s == nil {
		s = &loopSession{}
		l.sessions[session] = s
	}
	if s.spans.overlaps(base, size) {
		return fmt.Errorf("hosthop: target %q: range %#x+%d overlaps a registered range", session, base, size)
	}
	s.bufs = append(slices.Clip(s.bufs), buf)
	s.spans = s.spans.insert(span{start: base, size: size, ref: len(s.bufs) - 1})
	s.ranges = append(slices.Clip(s.ranges), relay.Range{Addr: base, Len: size})
	if !slices.Contains(s.hcas, hca) {
		s.hcas = append(slices.Clip(s.hcas), hca)
	}
	return nil
}

// Resolve returns the HCAs and ranges of session; dst must lie in one of the
// ranges. The returned slices must not be modified.
func (l *Loopback) Resolve(session string, dst uint64) (relay.Target, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[session]
	if s == nil {
		return relay.Target{}, fmt.Errorf("%w: %q", ErrUnknownSession, session)
	}
	if s.spans.find(dst, 1) < 0 {
		return relay.Target{}, fmt.Errorf("%w: session %q dst %#x", ErrOutOfRange, session, dst)
	}
	return relay.Target{HCAs: s.hcas, Ranges: s.ranges}, nil
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
		return fmt.Errorf("hosthop: batch of %d ops exceeds the loopback queue depth %d", len(ops), l.depth)
	}
	if l.busy || len(l.held)+len(l.done)+len(ops) > l.depth {
		l.stats.Busy++
		return relay.ErrHopBusy
	}
	l.stats.Submitted += uint64(len(ops))
	for _, op := range ops {
		if l.hold {
			l.held = append(l.held, op)
			continue
		}
		l.finish(op, nil)
	}
	return nil
}

// finish performs op unless forced or a rule or validation fails it, and
// queues its completion. l.mu is held.
func (l *Loopback) finish(op relay.WriteOp, forced error) {
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
	l.done = append(l.done, relay.HopCompletion{Token: op.Token, Err: err})
}

func (l *Loopback) perform(op relay.WriteOp) error {
	for _, r := range l.rules {
		if r.session != op.Target {
			continue
		}
		if r.whole || rangesMeet(r.r, op.Dst, op.Len) {
			return fmt.Errorf("hosthop: loopback write token %d to %q dst %#x len %d: %w", op.Token, op.Target, op.Dst, op.Len, r.err)
		}
	}
	s := l.sessions[op.Target]
	if s == nil {
		return fmt.Errorf("hosthop: loopback write token %d: %w: %q", op.Token, ErrUnknownSession, op.Target)
	}
	i := s.spans.find(op.Dst, op.Len)
	if i < 0 {
		return fmt.Errorf("hosthop: loopback write token %d to %q: %w: dst %#x len %d", op.Token, op.Target, ErrOutOfRange, op.Dst, op.Len)
	}
	if op.Len == 0 {
		return nil
	}
	if op.Src == 0 || !validRange(uint64(op.Src), op.Len) {
		return fmt.Errorf("hosthop: loopback write token %d to %q: source %#x len %d is not addressable", op.Token, op.Target, op.Src, op.Len)
	}
	sp := s.spans[i]
	off := op.Dst - sp.start
	copy(s.bufs[sp.ref][off:off+op.Len], bytesAt(op.Src, op.Len))
	return nil
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
	for i, op := range l.held {
		out[i] = op.Token
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
		return errors.New("hosthop: Fail needs a non-nil error")
	}
	return l.release(token, err)
}

func (l *Loopback) release(token uint64, err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, op := range l.held {
		if op.Token == token {
			l.held = slices.Delete(l.held, i, i+1)
			l.finish(op, err)
			return nil
		}
	}
	return fmt.Errorf("hosthop: no held op with token %d", token)
}

// CompleteAll performs every held op in submission order and returns how
// many there were.
func (l *Loopback) CompleteAll() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := l.held
	l.held = nil
	for _, op := range held {
		l.finish(op, nil)
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
