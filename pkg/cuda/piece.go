// SPDX-License-Identifier: Apache-2.0

package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// BatchEntry is one contiguous copy of a Piece's batch: Len bytes from Src
// to Dst, both addresses in the unified address space. Its layout is that
// of relay.CopyEntry, so a slice of one can be viewed as the other.
type BatchEntry struct {
	Src uint64
	Dst uint64
	Len uint64
}

var (
	_ [unsafe.Sizeof(BatchEntry{}) - unsafe.Sizeof(C.pxn_copy_entry{})]struct{}
	_ [unsafe.Sizeof(C.pxn_copy_entry{}) - unsafe.Sizeof(BatchEntry{})]struct{}
)

// CopyMode selects how a Piece's entries are submitted.
type CopyMode int

const (
	// CopyPerEntry is one cuMemcpyAsync per entry.
	CopyPerEntry CopyMode = C.PXN_COPY_PER_ENTRY
	// CopyBatchV13000 is the 8-argument cuMemcpyBatchAsync of CUDA 13.0.
	CopyBatchV13000 CopyMode = C.PXN_COPY_BATCH_V13000
	// CopyBatchV12080 is the 9-argument cuMemcpyBatchAsync of CUDA 12.8,
	// which reports the failing index.
	CopyBatchV12080 CopyMode = C.PXN_COPY_BATCH_V12080
	// CopyGather uploads the entries as a plan and launches a gather
	// kernel (Piece.Gather) that copies them with the SMs.
	CopyGather CopyMode = C.PXN_COPY_GATHER
)

// PlanBytes is the size of a gather plan of n entries: the entries, then
// n+1 prefix sums of their lengths (see Gather).
func PlanBytes(n int) uint64 { return uint64(C.pxn_plan_bytes(C.size_t(n))) }

func (m CopyMode) String() string {
	switch m {
	case CopyPerEntry:
		return "per-entry cuMemcpyAsync"
	case CopyBatchV13000:
		return "cuMemcpyBatchAsync (13.0, 8 arguments)"
	case CopyBatchV12080:
		return "cuMemcpyBatchAsync (12.8, 9 arguments)"
	case CopyGather:
		return "SM gather kernel"
	}
	return fmt.Sprintf("copy mode %d", int(m))
}

// BestCopyMode is the batch form the driver offers (13.0 first), or
// CopyPerEntry.
func (d *Driver) BestCopyMode() CopyMode {
	switch {
	case d.version >= 13000 && d.HasBatchV13000():
		return CopyBatchV13000
	case d.version >= 12080 && d.HasBatchV12080():
		return CopyBatchV12080
	}
	return CopyPerEntry
}

// Supports reports whether the driver has the entry point mode needs.
func (d *Driver) Supports(mode CopyMode) bool {
	switch mode {
	case CopyPerEntry:
		return d.has(C.PXN_cuMemcpyAsync)
	case CopyBatchV13000:
		return d.HasBatchV13000()
	case CopyBatchV12080:
		return d.HasBatchV12080()
	}
	return false
}

// CopyOp submits Pieces: a wait, the copies, a doorbell and a completion
// record, in one call into C. It owns C memory for its batch arrays and is
// reused for every Piece of one submitter; it is not safe for concurrent
// use.
type CopyOp struct {
	d   *Driver
	c   *C.pxn_piece_op
	s   *C.pxn_copy_scratch
	cap int
}

// NewCopyOp allocates an op for Pieces of at most maxEntries entries.
func (d *Driver) NewCopyOp(maxEntries int) (*CopyOp, error) {
	if maxEntries <= 0 {
		return nil, fmt.Errorf("cuda: copy op for %d entries", maxEntries)
	}
	c := (*C.pxn_piece_op)(C.calloc(1, C.size_t(unsafe.Sizeof(C.pxn_piece_op{}))))
	s := C.pxn_scratch_new(C.size_t(maxEntries))
	if c == nil || s == nil {
		C.free(unsafe.Pointer(c))
		C.pxn_scratch_free(s)
		return nil, fmt.Errorf("cuda: out of memory for a copy op of %d entries", maxEntries)
	}
	c.scratch = s
	return &CopyOp{d: d, c: c, s: s, cap: maxEntries}, nil
}

// Free releases the op's C memory.
func (o *CopyOp) Free() {
	if o.c == nil {
		return
	}
	C.pxn_scratch_free(o.s)
	C.free(unsafe.Pointer(o.c))
	o.c, o.s = nil, nil
}

// Piece is what one Enqueue submits.
type Piece struct {
	// Ctx is made current for the call (and the previous one restored);
	// 0 uses whatever is current.
	Ctx    Context
	Stream Stream
	// Wait, when not 0, is waited for on Stream before the copies.
	Wait    Event
	Mode    CopyMode
	Entries []BatchEntry
	// Doorbell, when not 0, receives Seq by cuStreamWriteValue64 after the
	// copies (with the default memory barrier).
	Doorbell DevicePtr
	Seq      uint64
	// Done, when not 0, is recorded on Stream last.
	Done Event
	// Gather is what Mode CopyGather needs.
	Gather Gather
}

// Gather is one launch of a gather kernel with the signature
// (const entry *plan, const u64 *prefix, u32 n, const u64 *cuts, u32 parts,
// u32 *arrived, u64 *words, u64 seq): the Piece's non-empty
// entries are written to PlanHost with their n+1 exclusive prefix sums of
// lengths behind them, uploaded to PlanDev on Upload (PlanUp is recorded
// there and waited for on the Piece's stream), and the kernel is launched
// on Grid blocks of Block threads. PlanBusy is recorded after the launch;
// Enqueue refuses (ErrorNotReady, nothing enqueued) while it has not
// completed, because the upload of PlanHost may still be pending.
type Gather struct {
	Kernel      Function
	Grid, Block uint32
	// PlanHost is pinned host memory and PlanDev device memory, each of
	// PlanBytes(PlanCap) bytes.
	PlanHost uintptr
	PlanDev  DevicePtr
	PlanCap  int
	Upload   Stream
	PlanUp   Event
	PlanBusy Event
	// Cuts, for a Piece copied in parts, are the bytes where each part
	// ends, increasing, the last the Piece's length; at most MaxParts.
	// Every warp copies its span of a part before the next, and once part
	// p is written the kernel stores Seq at PartWords + 8p (a system-scope
	// fence first), for every part but the last, which the doorbell
	// covers. Empty: one part, no stores.
	Cuts      []uint64
	PartWords DevicePtr
	// Inline, when set, is a kernel taking the whole plan as its one
	// parameter (InlineEntries entries at most): a Piece that small is
	// launched with it, with no upload and no PlanUp or PlanBusy.
	Inline Function
	// Arrived is the device address of MaxParts u32 counters, zero
	// between launches, that both kernels count a part's warps in.
	Arrived DevicePtr
}

// InlineEntries is the most entries of a plan Gather.Inline takes, and
// InlinePlanBytes the size of the parameter it takes them in (the kernel's
// PTX declares the same size).
const (
	InlineEntries   = C.PXN_INLINE_ENTRIES
	InlinePlanBytes = C.sizeof_pxn_inline_plan
)

// MaxParts is the most parts a gather launch copies a Piece in.
const MaxParts = C.PXN_GATHER_MAX_PARTS

// PieceError is a failed Enqueue: the step that failed and the driver's
// error. Steps before it were enqueued; none after it.
type PieceError struct {
	Step string
	// Index is the failing entry (per-entry copies) or batch element
	// (12.8 form), or -1.
	Index int
	Err   error
}

func (e *PieceError) Error() string {
	if e.Index >= 0 {
		return fmt.Sprintf("%v (entry %d)", e.Err, e.Index)
	}
	return e.Err.Error()
}

func (e *PieceError) Unwrap() error { return e.Err }

// Enqueue submits p on p.Stream without waiting for it. It allocates
// nothing on success.
func (o *CopyOp) Enqueue(p *Piece) error {
	if len(p.Entries) > o.cap && p.Mode != CopyPerEntry {
		return &PieceError{Step: "copy", Index: -1, Err: fmt.Errorf("cuda: %v: %d entries, the op holds %d", p.Mode, len(p.Entries), o.cap)}
	}
	c := o.c
	c.ctx = C.pxn_handle(p.Ctx)
	c.stream = C.pxn_handle(p.Stream)
	c.wait = C.pxn_handle(p.Wait)
	c.mode = C.int(p.Mode)
	c.doorbell = C.CUdeviceptr(p.Doorbell)
	c.seq = C.uint64_t(p.Seq)
	c.done = C.pxn_handle(p.Done)
	c.gather_fn = C.pxn_handle(p.Gather.Kernel)
	c.grid = C.uint(p.Gather.Grid)
	c.block = C.uint(p.Gather.Block)
	c.plan_host = C.uintptr_t(p.Gather.PlanHost)
	c.plan_dev = C.CUdeviceptr(p.Gather.PlanDev)
	c.plan_cap = C.size_t(p.Gather.PlanCap)
	c.upload = C.pxn_handle(p.Gather.Upload)
	c.plan_up = C.pxn_handle(p.Gather.PlanUp)
	c.plan_busy = C.pxn_handle(p.Gather.PlanBusy)
	if len(p.Gather.Cuts) > MaxParts {
		return &PieceError{Step: "plan", Index: -1, Err: fmt.Errorf("cuda: %d parts, at most %d", len(p.Gather.Cuts), MaxParts)}
	}
	c.nparts = C.uint(len(p.Gather.Cuts))
	for i, cut := range p.Gather.Cuts {
		c.cuts[i] = C.uint64_t(cut)
	}
	c.part_words = C.CUdeviceptr(p.Gather.PartWords)
	c.gather_inline = C.pxn_handle(p.Gather.Inline)
	c.arrived = C.CUdeviceptr(p.Gather.Arrived)
	var ents *C.pxn_copy_entry
	if len(p.Entries) > 0 {
		ents = (*C.pxn_copy_entry)(unsafe.Pointer(&p.Entries[0]))
	}
	r := C.pxn_enqueue_piece(o.d.t, c, ents, C.size_t(len(p.Entries)))
	if r == 0 {
		return nil
	}
	return o.pieceError(Result(r), *p)
}

// pieceError takes the Piece by value so that Enqueue's argument does not
// escape on the success path.
func (o *CopyOp) pieceError(r Result, p Piece) error {
	idx := -1
	if fi := uint64(o.c.fail_idx); fi != ^uint64(0) {
		idx = int(fi)
	}
	var step string
	switch o.c.stage {
	case C.PXN_STAGE_CONTEXT:
		step = fmt.Sprintf("cuCtxSetCurrent(%#x)", uintptr(p.Ctx))
	case C.PXN_STAGE_WAIT:
		step = fmt.Sprintf("cuStreamWaitEvent(%#x)", uintptr(p.Wait))
	case C.PXN_STAGE_COPY:
		step = fmt.Sprintf("%v of %d entries", p.Mode, len(p.Entries))
	case C.PXN_STAGE_DOORBELL:
		step = fmt.Sprintf("cuStreamWriteValue64(%#x, seq %d)", uint64(p.Doorbell), p.Seq)
	case C.PXN_STAGE_RECORD:
		step = fmt.Sprintf("cuEventRecord(%#x)", uintptr(p.Done))
	case C.PXN_STAGE_PLAN:
		step = fmt.Sprintf("gather plan of %d entries (staging %#x, busy event %#x)", len(p.Entries), p.Gather.PlanHost, uintptr(p.Gather.PlanBusy))
	case C.PXN_STAGE_LAUNCH:
		step = fmt.Sprintf("cuLaunchKernel(gather, grid %d, block %d)", p.Gather.Grid, p.Gather.Block)
	default:
		step = "enqueue"
	}
	return &PieceError{Step: step, Index: idx, Err: o.d.errorf(r, step)}
}

// RecordEvent records e on s with ctx current for the call, restoring the
// thread's previous context. s 0 is the legacy default stream.
func (d *Driver) RecordEvent(ctx Context, e Event, s Stream) error {
	r := C.pxn_record_event(d.t, C.pxn_handle(ctx), C.pxn_handle(e), C.pxn_handle(s))
	if r == 0 {
		return nil
	}
	return d.errorf(Result(r), "cuEventRecord(%#x, stream %#x)", uintptr(e), uintptr(s))
}

// QueryEvent is EventQuery with ctx current for the call.
func (d *Driver) QueryEvent(ctx Context, e Event) (bool, error) {
	return d.queried(Result(C.pxn_query_event(d.t, C.pxn_handle(ctx), C.pxn_handle(e))), e)
}

// BindContext makes ctx current on the calling OS thread and leaves it so.
// The caller must hold the thread (runtime.LockOSThread).
func (d *Driver) BindContext(ctx Context) error {
	r := C.pxn_ensure_ctx(d.t, C.pxn_handle(ctx))
	if r == 0 {
		return nil
	}
	return d.errorf(Result(r), "cuCtxSetCurrent(%#x)", uintptr(ctx))
}
