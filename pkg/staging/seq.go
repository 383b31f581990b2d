// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"errors"
	"fmt"
	"math"
)

// MaxLaneSeq is the largest seq a lane ever publishes. Past it the lane
// drains and restarts at 1 under a new epoch. The margin of SlotsPerLane+1
// below 2^64-1 keeps every sum either side forms from a live seq (seq+1,
// completed+K, the credit difference) from wrapping to 0.
const MaxLaneSeq = math.MaxUint64 - SlotsPerLane - 1

// Errors of the lane sequence bookkeeping. ErrSeqOrder always means a
// caller bug or a corrupted peer.
var (
	ErrSeqOrder       = errors.New("seq out of order")
	ErrLaneNotDrained = errors.New("lane not drained")
	ErrLaneEpoch      = errors.New("lane epoch not new")
)

// HasCredit reports whether seq next may be published while seqs up to
// reaped have been reaped: at most SlotsPerLane seqs are outstanding, so
// next reuses the slot of next-K only after next-K was reaped.
func HasCredit(next, reaped uint64) bool { return next-reaped <= SlotsPerLane }

// LaneSeq is a sender's sequence state for one outbound lane. Seqs are
// allocated, published (doorbell submitted) and reaped strictly in order:
// reaped ≤ published < next. It is owned by the pump thread.
type LaneSeq struct {
	epoch     uint64
	next      uint64
	published uint64
	reaped    uint64
}

// NewLaneSeq starts a lane at epoch, which must not be 0.
func NewLaneSeq(epoch uint64) (LaneSeq, error) {
	if epoch == 0 {
		return LaneSeq{}, fmt.Errorf("%w: epoch 0 is reserved for an unclaimed lane", ErrLaneEpoch)
	}
	return LaneSeq{epoch: epoch, next: 1}, nil
}

// Epoch is the lane epoch every Desc of this lane carries.
func (l *LaneSeq) Epoch() uint64 { return l.epoch }

// Next is the seq the next Alloc returns.
func (l *LaneSeq) Next() uint64 { return l.next }

// Published is the highest seq whose doorbell was submitted.
func (l *LaneSeq) Published() uint64 { return l.published }

// Reaped is the highest seq whose completion the sender consumed.
func (l *LaneSeq) Reaped() uint64 { return l.reaped }

// Alloc returns the next seq, or false when the lane has no credit or must
// roll over first. It never returns 0.
func (l *LaneSeq) Alloc() (uint64, bool) {
	seq, ok := l.peek()
	if ok {
		l.next++
	}
	return seq, ok
}

// peek is the seq Alloc would return, without taking it.
func (l *LaneSeq) peek() (uint64, bool) {
	if l.next == 0 || l.next > MaxLaneSeq || !HasCredit(l.next, l.reaped) {
		return 0, false
	}
	return l.next, true
}

// MarkPublished records that seq's doorbell was submitted.
func (l *LaneSeq) MarkPublished(seq uint64) error {
	if seq != l.published+1 || seq >= l.next {
		return fmt.Errorf("%w: publish seq %d, want %d (next %d)", ErrSeqOrder, seq, l.published+1, l.next)
	}
	l.published = seq
	return nil
}

// MarkReaped records that seq's completion was consumed; its slot is free.
func (l *LaneSeq) MarkReaped(seq uint64) error {
	if seq != l.reaped+1 || seq > l.published {
		return fmt.Errorf("%w: reap seq %d, want %d (published %d)", ErrSeqOrder, seq, l.reaped+1, l.published)
	}
	l.reaped = seq
	return nil
}

// Drained reports whether every allocated seq was published and reaped.
func (l *LaneSeq) Drained() bool { return l.published == l.reaped && l.reaped == l.next-1 }

// NeedsRollover reports whether the lane has used its last seq.
func (l *LaneSeq) NeedsRollover() bool { return l.next > MaxLaneSeq }

// Rollover restarts a drained lane at seq 1 under newEpoch, which must be
// neither 0 nor the current epoch: stale doorbells and Descs of the old
// epoch then never match.
func (l *LaneSeq) Rollover(newEpoch uint64) error {
	if !l.Drained() {
		return fmt.Errorf("%w: next %d, published %d, reaped %d", ErrLaneNotDrained, l.next, l.published, l.reaped)
	}
	if newEpoch == 0 || newEpoch == l.epoch {
		return fmt.Errorf("%w: %#x (current %#x)", ErrLaneEpoch, newEpoch, l.epoch)
	}
	*l = LaneSeq{epoch: newEpoch, next: 1}
	return nil
}

// CompletionWindow is the relay's completed seq for one lane. Second hops
// finish in any order; Completed advances only over a contiguous run of
// finished seqs. The zero value is a lane whose completed seq is 0. It is
// owned by the pump thread.
type CompletionWindow struct {
	completed uint64
	done      uint32
}

// The done bitmap holds one bit per slot.
var _ [32 - SlotsPerLane]struct{}

// Completed is the highest seq below which every seq has finished.
func (w *CompletionWindow) Completed() uint64 { return w.completed }

// MarkDone records that seq finished and returns the completed seq after
// advancing over every contiguous finished seq. seq must lie in the window
// (Completed, Completed+K], not exceed MaxLaneSeq and not have been marked
// before.
func (w *CompletionWindow) MarkDone(seq uint64) (uint64, error) {
	if seq <= w.completed || seq-w.completed > SlotsPerLane || seq > MaxLaneSeq {
		return w.completed, fmt.Errorf("%w: done seq %d outside (%d, %d]", ErrSeqOrder, seq, w.completed, w.completed+SlotsPerLane)
	}
	bit := uint32(1) << SlotOf(seq)
	if w.done&bit != 0 {
		return w.completed, fmt.Errorf("%w: done seq %d marked twice", ErrSeqOrder, seq)
	}
	w.done |= bit
	for {
		bit = uint32(1) << SlotOf(w.completed+1)
		if w.done&bit == 0 {
			return w.completed, nil
		}
		w.done &^= bit
		w.completed++
	}
}
