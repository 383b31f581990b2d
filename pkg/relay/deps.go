// SPDX-License-Identifier: Apache-2.0

// Package relay is the engine's data path: classification of requests, the
// sender pipeline that stages cross-rail pieces in a relay's ring, the relay
// pipeline that forwards them on its own rail, and the pump that drives both.
package relay

import (
	"errors"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
)

// Kind says where a memory range lives.
type Kind int

const (
	// Host is ordinary host memory: always sent direct.
	Host Kind = iota
	// Device is accelerator memory (or, on the host path, memory registered
	// as simulated device memory): cross-rail writes from it go through PXN.
	Device
)

// Event is a first-hop ordering token: a source-ready event recorded on the
// caller's stream, or a copy-complete event on a lane stream. Zero is "no
// event" (already ready).
type Event uint64

// CopyEntry is one contiguous copy of the first hop: Len bytes from Src (local
// address) to Dst (an address in a peer's mapped arena).
type CopyEntry struct {
	Src uintptr
	Dst uintptr
	Len uint64
}

// RangeClassifier is a Copier that can also say which allocation a device
// address lies in. Submit then asks once per allocation of a call instead
// of once per request: a KV-cache transfer is thousands of blocks of one
// pool. The answer is used only within the Submit call that asked, while
// the caller keeps its buffers alive.
type RangeClassifier interface {
	// ClassifyRange is Classify and, for Device, the allocation
	// [start, start+size) holding addr..addr+n.
	ClassifyRange(addr uintptr, n uint64) (k Kind, start uintptr, size uint64)
}

// Copier moves Pieces over the first hop (NVLink on GPUs, memcpy on the host
// path). All methods are called from the pump except Classify and
// RecordReady, which run on the caller's thread and must not block.
type Copier interface {
	// Classify reports whether addr..addr+n is device or host memory.
	Classify(addr uintptr, n uint64) Kind
	// RecordReady records a source-ready event on the caller's stream
	// (0 = the default stream of the calling thread).
	RecordReady(stream uintptr) (Event, error)
	// Query reports whether an event has completed, without blocking.
	Query(ev Event) (bool, error)
	// Release returns an event to the copier.
	Release(ev Event)
	// Copy enqueues, on lane's stream, a wait for ready, the copies, and
	// then the doorbell: a 64-bit store of seq at doorbell (an address in a
	// claimed lane's sender block). It returns without waiting, and reads
	// entries only during the call: the pump reuses the slice. An error
	// means nothing was enqueued after the point of failure and the doorbell
	// was not submitted.
	Copy(lane int, ready Event, entries []CopyEntry, doorbell *uint64, seq uint64) error
	// Close waits for enqueued work and frees the copier's resources.
	Close() error
}

// WriteOp is one transfer of the direct path or of a relay's second hop: Len
// bytes from local Src to Dst in Target, or, when Read is set, from Dst in
// Target to local Src. Token is opaque to the hop and comes back in its
// completion. A hop that cannot read fails read ops through Poll.
type WriteOp struct {
	Src    uintptr
	Len    uint64
	Target string
	Dst    uint64
	Token  uint64
	Read   bool
	// Route and Key are filled on the relay's second hop from its route
	// cache: Route is what the hop's Router returned for Target, Key the
	// Key of the registered range that holds Dst..Dst+Len. A hop may use
	// them instead of looking Target and Dst up again, and must check a
	// handle it no longer honours (a target removed since) by failing the
	// op, not by writing elsewhere. Both are zero on the direct path, and
	// a hop must accept ops without them.
	Route any
	Key   uint64
}

// HopCompletion reports the end of one WriteOp.
type HopCompletion struct {
	Token uint64
	Err   error
}

// Hop is the host's RDMA transport (or a stand-in): the direct path and the
// relay's second hop. Submit and Poll never block; the hop keeps its own
// queueing and back-pressure (Submit returns ErrHopBusy when full).
type Hop interface {
	Submit(ops []WriteOp) error
	Poll(out []HopCompletion) int
}

// PieceHop is an optional capability of a Hop, found by type assertion: it
// takes a relayed Piece's writes whole. SubmitPiece takes every op of ops
// in one call, or none (ErrHopBusy: the relay tries the whole Piece again
// later; any other error fails the Piece), and reports their end with one
// HopCompletion whose Token is token and whose Err is the first write's
// failure. The ops' own Token fields are unused. A hop with it counts a
// Piece, not its writes, toward its queue bound, so that a Piece of up to
// MaxPlans writes is never refused for its size. It reads ops only during
// the call. The relay then takes one token, one hop call and one
// completion per Piece instead of one per write.
type PieceHop interface {
	SubmitPiece(ops []WriteOp, token uint64) error
}

// ErrTimedOut marks a failure that is a timeout: a hop completion whose
// error matches it (errors.Is) timed out, and a task that failed with it
// timed out, on the direct path, in a relay's second hop, or waiting for a
// relay that made no progress.
var ErrTimedOut = errors.New("timed out")

// ErrWriteHeld marks a hop completion that is not final: the write timed
// out (its Err matches ErrTimedOut too) but the NIC may still hold it and
// read its source, and the hop reports the same token once more when the
// write is final (the NIC's completion or its queue pair's flush). A direct
// or fallback task ends at the first report; a relayed write keeps its
// slot, and its Piece its completion, until the final one, since a slot
// written again while a NIC still reads it would carry another Piece's
// bytes to this one's destination.
var ErrWriteHeld = errors.New("the write may still be in the NIC")

// ErrHopBusy is returned by Hop.Submit when the hop cannot take more work now;
// the caller retries later.
var ErrHopBusy = errors.New("second hop busy")

// Range is a registered memory range of a target session.
type Range struct {
	Addr uint64
	Len  uint64
	// Key is what the hop needs to address the range (on RDMA, the remote
	// key of its registration). Opaque to the engine, which only carries it
	// into WriteOp.Key.
	Key uint64
}

// Target describes a target session as a directory knows it: the raw HCA
// names of the NICs that serve the buffer and the registered ranges.
type Target struct {
	HCAs   []string
	Ranges []Range
}

// Directory resolves a target session (Mooncake's segment name) to what the
// engine needs to route a write to it.
type Directory interface {
	Resolve(session string, dst uint64) (Target, error)
}

// Router is an optional capability of a Hop, found by type assertion: Route
// resolves a target session to the hop's own handle for it (a connection, a
// queue pair set, a session record) once, when the relay's route cache first
// meets the session. The relay passes the handle back in WriteOp.Route. A
// route is dropped, and Route called again, after a second-hop failure to
// the session or Engine.InvalidateTarget.
type Router interface {
	Route(session string) (any, error)
}

// Optional capabilities of a Copier, found by type assertion.
type (
	// ThreadBinder prepares the pump's locked OS thread (a GPU copier makes
	// its CUDA context current there). Called once before the first round.
	ThreadBinder interface{ BindThread() error }
	// HostRegistrar makes a claimed lane's sender block (its ready and
	// part words) writable by the copier's doorbells. Called when a lane
	// is attached; unregister is called only once no doorbell into the
	// range can be pending.
	HostRegistrar interface {
		RegisterHost(ptr uintptr, n uint64) (unregister func() error, err error)
	}
	// CopyPoller completes copier work on the pump (CPU doorbells rung
	// after a copy's event). Called every round; an error means enqueued
	// copies will never ring their doorbells.
	CopyPoller interface{ Poll() (int, error) }
	// CopyDrainer says when a copier lane has drained: every copy
	// enqueued on lane before the call (Copy, CopyParts) has made its
	// last write, part words and doorbell included, so nothing the
	// copier was given for the lane can write memory any more. It answers
	// from the copier's own state, never from the words it wrote (which
	// the relay can write too), and must not block. The sender releases a
	// retired lane's claim and mappings only once its copier lane has
	// drained; with a copier without it, only after Close.
	CopyDrainer interface{ Drained(lane int) bool }
	// PollTuner replaces DefaultPollPolicy for the copier's engine.
	PollTuner interface{ PollPolicy() PollPolicy }
	// PartCopier copies a Piece in parts and says when each has landed,
	// so that the relay forwards the first parts while the later ones are
	// still copied (staging.Desc.Parts). CopyParts is Copy for a Piece
	// whose parts end at the entry indices partEnds (every part but the
	// last; the plan's entries and entries correspond one to one), and it
	// also stores seq into words[p] once part p is in the slot, before the
	// doorbell: a GPU store behind a system-scope fence, or a release
	// store. A copier may leave the words alone for a Piece it cannot
	// signal in parts: the doorbell then covers them all. The sender
	// calls it only on a lane with nothing else in flight.
	PartCopier interface {
		CopyParts(lane int, ready Event, entries []CopyEntry, partEnds []uint32, doorbell *uint64, words *[staging.MaxParts - 1]uint64, seq uint64) error
	}
)

// PollPolicy is how the pump waits for work in flight that wakes no one (a
// GPU doorbell, a completion in a claim's relay block, a hop
// completion). Spin is how long it polls without sleeping after a round
// that made progress, or after a wake, while at most one Piece moves
// through the rank (a transfer bound by latency). Otherwise it sleeps on
// its wake word, at most Nap while anything is in flight; with nothing in
// flight, until a waker or its next heartbeat. See docs/engine.md.
type PollPolicy struct {
	Spin, Nap time.Duration
	// TimerNap makes a nap a sleep on the Go runtime's timer instead of a
	// wait on the wake word: no waker ends it, it often lasts about a
	// millisecond whatever Nap says, and the runtime gets the thread's
	// processor back at once rather than after a blocking system call.
	// For copiers whose events come milliseconds apart and whose copies
	// share the CPU with the pump (the host path), where precise naps cost
	// the copies more CPU than their wake-ups save.
	TimerNap bool
}
