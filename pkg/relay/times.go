// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"sync"
	"sync/atomic"
	"time"
)

// PieceTimes are the moments one Piece passed the steps of its way, in
// Unix nanoseconds of this host's clock, which every process of a group
// reads alike. A sender fills Submit, Copy and Reaped; a relay Seen,
// Posted and Done. A step not reached is 0. Lane is the Piece's lane at its
// relay and Seq its sequence number there, so a sender's and its relay's
// records of one Piece can be matched.
type PieceTimes struct {
	Lane  int    `json:"lane"`
	Seq   uint64 `json:"seq"`
	Bytes uint64 `json:"bytes"`
	// Submit is when the Submit chunk that planned the Piece began; Copy
	// when the sender began to enqueue its first-hop copy and doorbell
	// (the copy may land before that call returns); Reaped when the sender
	// saw the relay's completion.
	Submit int64 `json:"submit,omitempty"`
	Copy   int64 `json:"copy,omitempty"`
	Reaped int64 `json:"reaped,omitempty"`
	// Seen is when the relay found the doorbell rung; Posted when it had
	// handed the second hop's writes to its hop; Done when the last of
	// them completed, just before the completion was written.
	Seen   int64 `json:"seen,omitempty"`
	Posted int64 `json:"posted,omitempty"`
	Done   int64 `json:"done,omitempty"`
}

// timesLen is how many Pieces' times an engine keeps, each side: the last
// ones, for a benchmark to take a path apart step by step.
const timesLen = 1024

// timeRing holds the times of the last timesLen Pieces a side saw. The
// pump writes it; PieceTimes reads it from any goroutine.
type timeRing struct {
	// on is set while someone wants the times (Engine.KeepPieceTimes):
	// off, the ring costs a Piece one atomic load a step.
	on  atomic.Bool
	mu  sync.Mutex
	buf [timesLen]PieceTimes
	n   uint64
}

// notKept is the place add returns while the ring is off: set ignores it.
const notKept = ^uint64(0)

// now is the time to record for a step, 0 while the ring is off.
func (r *timeRing) now() int64 {
	if !r.on.Load() {
		return 0
	}
	return unixNow()
}

// add records a new Piece and returns its place for set.
func (r *timeRing) add(t PieceTimes) uint64 {
	if !r.on.Load() {
		return notKept
	}
	r.mu.Lock()
	at := r.n
	r.buf[at%timesLen] = t
	r.n++
	r.mu.Unlock()
	return at
}

// Steps that set records after add.
const (
	stepReaped = iota
	stepPosted
	stepDone
)

// set records now as the time of step for the Piece recorded at place at,
// unless newer Pieces have overwritten it since or the ring was off when
// the Piece began.
func (r *timeRing) set(at uint64, step int) {
	if at == notKept || !r.on.Load() {
		return
	}
	t := unixNow()
	r.mu.Lock()
	if at < r.n && r.n-at <= timesLen {
		p := &r.buf[at%timesLen]
		switch step {
		case stepReaped:
			p.Reaped = t
		case stepPosted:
			p.Posted = t
		case stepDone:
			p.Done = t
		}
	}
	r.mu.Unlock()
}

// appendTo appends the kept Pieces to dst, oldest first.
func (r *timeRing) appendTo(dst []PieceTimes) []PieceTimes {
	r.mu.Lock()
	defer r.mu.Unlock()
	from := uint64(0)
	if r.n > timesLen {
		from = r.n - timesLen
	}
	for i := from; i < r.n; i++ {
		dst = append(dst, r.buf[i%timesLen])
	}
	return dst
}

// KeepPieceTimes turns the recording of Piece times on or off; it is off
// when an engine opens, since only benchmarks and diagnosis read them.
// Pieces begun while it was off are not recorded.
func (e *Engine) KeepPieceTimes(on bool) {
	e.sentTimes.on.Store(on)
	e.relayedTimes.on.Store(on)
}

// PieceTimes appends the times of the last Pieces this engine sent
// through relays (Submit, Copy, Reaped) and of the last it relayed
// (Seen, Posted, Done) to dst, oldest first, each side at most 1024, as
// far as KeepPieceTimes had them kept.
func (e *Engine) PieceTimes(dst []PieceTimes) []PieceTimes {
	dst = e.sentTimes.appendTo(dst)
	return e.relayedTimes.appendTo(dst)
}

func unixNow() int64 { return time.Now().UnixNano() }
