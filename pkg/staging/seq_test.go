// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"errors"
	"math"
	"testing"
)

func TestHasCredit(t *testing.T) {
	tests := []struct {
		next, reaped uint64
		want         bool
	}{
		{1, 0, true},
		{18, 0, true},
		{19, 0, false},
		{19, 1, true},
		{37, 18, false},
		{37, 19, true},
		{38, 19, false},
		{38, 20, true},
		{MaxLaneSeq + 1, MaxLaneSeq - SlotsPerLane + 1, true},
		{MaxLaneSeq + 1, MaxLaneSeq - SlotsPerLane, false},
	}
	for _, tt := range tests {
		if got := HasCredit(tt.next, tt.reaped); got != tt.want {
			t.Errorf("HasCredit(next %d, reaped %d) = %v, want %v", tt.next, tt.reaped, got, tt.want)
		}
	}
}

func TestNewLaneSeq(t *testing.T) {
	if _, err := NewLaneSeq(0); !errors.Is(err, ErrLaneEpoch) {
		t.Errorf("NewLaneSeq(0) = %v, want %v", err, ErrLaneEpoch)
	}
	l, err := NewLaneSeq(9)
	if err != nil {
		t.Fatalf("NewLaneSeq(9): %v", err)
	}
	if l.Epoch() != 9 || l.Next() != 1 || l.Published() != 0 || l.Reaped() != 0 || !l.Drained() || l.NeedsRollover() {
		t.Errorf("new lane: epoch %d next %d published %d reaped %d drained %v rollover %v, want 9 1 0 0 true false",
			l.Epoch(), l.Next(), l.Published(), l.Reaped(), l.Drained(), l.NeedsRollover())
	}
	var zero LaneSeq
	if seq, ok := zero.Alloc(); ok {
		t.Errorf("zero LaneSeq allocated seq %d; it has no epoch", seq)
	}
}

func TestLaneSeqCredit(t *testing.T) {
	l, _ := NewLaneSeq(1)
	for want := uint64(1); want <= SlotsPerLane; want++ {
		seq, ok := l.Alloc()
		if !ok || seq != want {
			t.Fatalf("Alloc = %d, %v; want %d, true", seq, ok, want)
		}
		if err := l.MarkPublished(seq); err != nil {
			t.Fatal(err)
		}
	}
	if seq, ok := l.Alloc(); ok {
		t.Fatalf("Alloc with %d seqs outstanding = %d; want no credit", SlotsPerLane, seq)
	}
	if err := l.MarkReaped(1); err != nil {
		t.Fatal(err)
	}
	seq, ok := l.Alloc()
	if !ok || seq != SlotsPerLane+1 || SlotOf(seq) != 0 {
		t.Fatalf("Alloc after reaping seq 1 = %d, %v; want %d in slot 0", seq, ok, SlotsPerLane+1)
	}
	if seq, ok := l.Alloc(); ok {
		t.Fatalf("Alloc = %d; want no credit until seq 2 is reaped", seq)
	}
}

func TestLaneSeqOrder(t *testing.T) {
	l, _ := NewLaneSeq(1)
	for range 3 {
		l.Alloc()
	}
	tests := []struct {
		name string
		do   func() error
	}{
		{"publish skips seq 1", func() error { return l.MarkPublished(2) }},
		{"publish unallocated", func() error { return l.MarkPublished(4) }},
		{"publish seq 0", func() error { return l.MarkPublished(0) }},
		{"reap unpublished", func() error { return l.MarkReaped(1) }},
	}
	for _, tt := range tests {
		if err := tt.do(); !errors.Is(err, ErrSeqOrder) {
			t.Errorf("%s: %v, want %v", tt.name, err, ErrSeqOrder)
		}
	}
	if err := l.MarkPublished(1); err != nil {
		t.Fatal(err)
	}
	if err := l.MarkPublished(1); !errors.Is(err, ErrSeqOrder) {
		t.Errorf("publish seq 1 twice: %v, want %v", err, ErrSeqOrder)
	}
	if err := l.MarkReaped(2); !errors.Is(err, ErrSeqOrder) {
		t.Errorf("reap seq 2 before 1: %v, want %v", err, ErrSeqOrder)
	}
	if err := l.MarkReaped(1); err != nil {
		t.Fatal(err)
	}
	if l.Published() != 1 || l.Reaped() != 1 || l.Next() != 4 {
		t.Errorf("published %d reaped %d next %d, want 1 1 4", l.Published(), l.Reaped(), l.Next())
	}
}

// laneWalk drives a LaneSeq like a pump whose relay lags: it publishes
// while there is credit and reaps the oldest seq when there is none. It
// records every (epoch, seq) produced and fails on a repeat, a gap or a 0.
type laneWalk struct {
	t           *testing.T
	l           *LaneSeq
	seen        map[[2]uint64]bool
	last        uint64
	outstanding []uint64
}

func (w *laneWalk) reapOldest() {
	w.t.Helper()
	if err := w.l.MarkReaped(w.outstanding[0]); err != nil {
		w.t.Fatal(err)
	}
	w.outstanding = w.outstanding[1:]
}

// run allocates until n seqs were produced or the lane needs a rollover.
func (w *laneWalk) run(n int) int {
	w.t.Helper()
	produced := 0
	for produced < n {
		seq, ok := w.l.Alloc()
		if !ok {
			if w.l.NeedsRollover() {
				break
			}
			w.reapOldest()
			continue
		}
		key := [2]uint64{w.l.Epoch(), seq}
		if seq == 0 || seq != w.last+1 || w.seen[key] {
			w.t.Fatalf("Alloc = %d after %d in epoch %d", seq, w.last, w.l.Epoch())
		}
		w.seen[key] = true
		w.last = seq
		produced++
		if err := w.l.MarkPublished(seq); err != nil {
			w.t.Fatal(err)
		}
		w.outstanding = append(w.outstanding, seq)
		if k := len(w.outstanding); k > SlotsPerLane {
			w.t.Fatalf("%d seqs outstanding, credit allows %d", k, SlotsPerLane)
		}
	}
	return produced
}

// TestLaneSeqRolloverNearTheTop walks a lane to its last seq, drains it,
// rolls it over and goes on: every (epoch, seq) is produced once, in order,
// and seq 0 never.
func TestLaneSeqRolloverNearTheTop(t *testing.T) {
	for _, start := range []uint64{math.MaxUint64 - 20, MaxLaneSeq - 3*SlotsPerLane - 5} {
		l := LaneSeq{epoch: 7, next: start, published: start - 1, reaped: start - 1}
		w := &laneWalk{t: t, l: &l, seen: map[[2]uint64]bool{}, last: start - 1}

		produced := w.run(1000)
		if !l.NeedsRollover() || w.last != MaxLaneSeq || produced != int(MaxLaneSeq-start+1) {
			t.Fatalf("start %d: stopped at seq %d after %d seqs (rollover %v), want the last seq %d", start, w.last, produced, l.NeedsRollover(), uint64(MaxLaneSeq))
		}
		if seq, ok := l.Alloc(); ok {
			t.Fatalf("Alloc past MaxLaneSeq = %d", seq)
		}
		if len(w.outstanding) == 0 {
			t.Fatal("the walk left nothing outstanding; the drain below proves nothing")
		}
		if err := l.Rollover(8); !errors.Is(err, ErrLaneNotDrained) {
			t.Fatalf("Rollover with %d outstanding = %v, want %v", len(w.outstanding), err, ErrLaneNotDrained)
		}
		for len(w.outstanding) > 0 {
			w.reapOldest()
		}
		if !l.Drained() {
			t.Fatalf("not drained after reaping everything: next %d published %d reaped %d", l.Next(), l.Published(), l.Reaped())
		}
		if err := l.Rollover(7); !errors.Is(err, ErrLaneEpoch) {
			t.Fatalf("Rollover to the same epoch = %v, want %v", err, ErrLaneEpoch)
		}
		if err := l.Rollover(0); !errors.Is(err, ErrLaneEpoch) {
			t.Fatalf("Rollover to epoch 0 = %v, want %v", err, ErrLaneEpoch)
		}
		if err := l.Rollover(8); err != nil {
			t.Fatalf("Rollover after the drain: %v", err)
		}
		if l.Epoch() != 8 || l.Next() != 1 || l.Published() != 0 || l.Reaped() != 0 {
			t.Fatalf("after rollover: epoch %d next %d published %d reaped %d, want 8 1 0 0", l.Epoch(), l.Next(), l.Published(), l.Reaped())
		}
		w.last = 0
		if got := w.run(3 * SlotsPerLane); got != 3*SlotsPerLane || w.last != 3*SlotsPerLane {
			t.Fatalf("after rollover produced %d seqs up to %d, want %d", got, w.last, 3*SlotsPerLane)
		}
		if got, want := len(w.seen), produced+3*SlotsPerLane; got != want {
			t.Errorf("%d distinct (epoch, seq) produced, want %d", got, want)
		}
	}
}

func TestCompletionWindowInOrder(t *testing.T) {
	var w CompletionWindow
	for seq := uint64(1); seq <= 3*SlotsPerLane; seq++ {
		got, err := w.MarkDone(seq)
		if err != nil || got != seq {
			t.Fatalf("MarkDone(%d) = %d, %v; want %d", seq, got, err, seq)
		}
	}
}

func TestCompletionWindowOutOfOrder(t *testing.T) {
	tests := []struct {
		name      string
		completed uint64
		done      []uint64
		want      []uint64
	}{
		{"reverse", 0, []uint64{3, 2, 1}, []uint64{0, 0, 3}},
		{"gap then fill", 0, []uint64{1, 3, 4, 2, 5}, []uint64{1, 1, 1, 4, 5}},
		{"whole window backwards", 0,
			[]uint64{18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1},
			[]uint64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 18}},
		{"across the slot wrap", 16, []uint64{19, 18, 20, 17}, []uint64{16, 16, 16, 20}},
		{"slot reused after advancing", 0, []uint64{2, 1, 19, 20, 3}, []uint64{0, 2, 2, 2, 3}},
		{"near the last seq", MaxLaneSeq - 3, []uint64{MaxLaneSeq, MaxLaneSeq - 2, MaxLaneSeq - 1}, []uint64{MaxLaneSeq - 3, MaxLaneSeq - 2, MaxLaneSeq}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := CompletionWindow{completed: tt.completed}
			for i, seq := range tt.done {
				got, err := w.MarkDone(seq)
				if err != nil {
					t.Fatalf("MarkDone(%d): %v", seq, err)
				}
				if got != tt.want[i] || w.Completed() != got {
					t.Fatalf("MarkDone(%d) = %d (Completed %d), want %d", seq, got, w.Completed(), tt.want[i])
				}
			}
		})
	}
}

func TestCompletionWindowRejects(t *testing.T) {
	tests := []struct {
		name      string
		completed uint64
		before    []uint64
		seq       uint64
	}{
		{"seq 0", 0, nil, 0},
		{"already completed", 5, nil, 5},
		{"beyond the window", 0, nil, SlotsPerLane + 1},
		{"beyond the window while held", 0, []uint64{2}, SlotsPerLane + 1},
		{"twice while held", 0, []uint64{3}, 3},
		{"past the last seq", MaxLaneSeq, nil, MaxLaneSeq + 1},
		{"far past", 10, nil, math.MaxUint64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := CompletionWindow{completed: tt.completed}
			for _, seq := range tt.before {
				if _, err := w.MarkDone(seq); err != nil {
					t.Fatal(err)
				}
			}
			got, err := w.MarkDone(tt.seq)
			if !errors.Is(err, ErrSeqOrder) {
				t.Fatalf("MarkDone(%d) = %d, %v; want %v", tt.seq, got, err, ErrSeqOrder)
			}
			if got != tt.completed || w.Completed() != tt.completed {
				t.Errorf("a rejected MarkDone moved completed from %d to %d", tt.completed, w.Completed())
			}
		})
	}
	var w CompletionWindow
	if _, err := w.MarkDone(2); err != nil {
		t.Fatal(err)
	}
	if got, err := w.MarkDone(1); err != nil || got != 2 {
		t.Fatalf("held seq 2 lost after a rejected mark: MarkDone(1) = %d, %v", got, err)
	}
}

func TestSeqHotPathDoesNotAllocate(t *testing.T) {
	l, _ := NewLaneSeq(1)
	var w CompletionWindow
	allocs := testing.AllocsPerRun(100, func() {
		seq, ok := l.Alloc()
		if !ok {
			t.Fatal("no credit")
		}
		if l.MarkPublished(seq) != nil || l.MarkReaped(seq) != nil {
			t.Fatal("publish/reap failed")
		}
		if got, err := w.MarkDone(seq); err != nil || got != seq {
			t.Fatal("MarkDone failed")
		}
	})
	if allocs != 0 {
		t.Errorf("Alloc+MarkPublished+MarkReaped+MarkDone allocate %v times, want 0", allocs)
	}
}
