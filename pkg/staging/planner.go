// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"errors"
	"fmt"
	"iter"
	"math"
)

// MaxRequestBytes is the most bytes one Plan call accepts. Every slice of a
// request is created before its first Piece is enqueued, so the planner's
// memory grows with the request; this bound keeps a corrupt length from
// turning into an unbounded allocation. 1 TiB is 131072 Pieces.
const MaxRequestBytes = 1 << 40

// Planner errors, wrapped with the offending block and values.
var (
	ErrAddressOverflow = errors.New("address range passes the end of the 64-bit address space")
	ErrTaskRange       = errors.New("task index out of range")
	ErrRequestTooLarge = fmt.Errorf("request exceeds %d bytes", uint64(MaxRequestBytes))
)

// Block is one write to the target session: Len bytes at Src go to Dst in the
// target's address space. Task is the index of the task that owns it.
type Block struct {
	Src  uint64
	Dst  uint64
	Len  uint64
	Task int
}

// Slice is the part of a Block that one Piece carries: Len bytes from Src,
// staged at Offset in the slot, bound for Dst. The Piece's completion
// completes the Slice, which counts toward Task.
type Slice struct {
	Task   int
	Src    uint64
	Dst    uint64
	Len    uint64
	Offset uint64
	// Whole says the slice is its whole block: no Piece boundary cuts it.
	Whole bool
}

// Piece is the content of one slot: the plan's slices numbered
// [Start, End), in slot order, Len bytes in all. They begin at offset Off
// of block First (an offset at the block's end, or a block of no bytes,
// begins them at the next block that has bytes) and are walked with
// Plan.PieceSlices, which rebuilds them from the blocks: a plan keeps no
// per-slice array, so that planning a block costs a few additions.
type Piece struct {
	Start int
	End   int
	Len   uint64
	First int
	Off   uint64
}

// Plan is a request cut into Pieces. It is reused by the next Plan call
// that fills it: nothing read from a Plan may be kept past that call.
type Plan struct {
	Pieces []Piece
	Bytes  uint64
}

// PieceSlices walks the slices of Piece i in slot order. blocks must be the
// blocks the plan was made from, unchanged.
func (p *Plan) PieceSlices(blocks []Block, i int) SliceIter {
	pc := &p.Pieces[i]
	return SliceIter{blocks: blocks, k: pc.First, off: pc.Off, left: pc.Len}
}

// SliceIter walks the slices of one Piece. The zero value has none.
type SliceIter struct {
	blocks []Block
	k      int
	off    uint64
	left   uint64
	at     uint64
}

// Next returns the Piece's next slice; ok is false after the last.
func (it *SliceIter) Next() (s Slice, ok bool) {
	for it.left > 0 {
		b := &it.blocks[it.k]
		if it.off >= b.Len {
			it.k++
			it.off = 0
			continue
		}
		n := min(b.Len-it.off, it.left)
		s = Slice{Task: b.Task, Src: b.Src + it.off, Dst: b.Dst + it.off, Len: n, Offset: it.at, Whole: n == b.Len}
		it.off += n
		it.at += n
		it.left -= n
		return s, true
	}
	return Slice{}, false
}

// Reset empties p and keeps its memory.
func (p *Plan) Reset() {
	p.Pieces = p.Pieces[:0]
	p.Bytes = 0
}

// Splits yields the block that each Piece boundary cuts in two, in plan
// order, once per cut. A block yields as many slices as it is yielded, plus
// one if it has bytes, so a caller counts its tasks' slices at a cost per
// Piece instead of the planner's keeping a count per block.
func (p *Plan) Splits(blocks []Block) iter.Seq[int] {
	return func(yield func(int) bool) {
		for i := 1; i < len(p.Pieces); i++ {
			pc := &p.Pieces[i]
			if pc.Off > 0 && pc.Off < blocks[pc.First].Len && !yield(pc.First) {
				return
			}
		}
	}
}

// Planner cuts requests into Pieces of at most SlotSize bytes and MaxPlans
// plan entries. The zero value is ready to use, holds no memory and cuts
// every Piece at the slot.
type Planner struct {
	// FirstPiece, when below the slot, caps a request's first Piece at
	// FirstPiece bytes and each later one at twice the cap before it, up
	// to the slot (the ramp): the relay forwards the first bytes while the
	// sender still copies the next. 0 (or SlotSize and more) is no ramp.
	FirstPiece uint64
	// pieceBytes and maxPlans, when set, replace SlotSize and MaxPlans so
	// that tests reach every cut rule with a few bytes.
	pieceBytes uint64
	maxPlans   int
}

// firstCut is the byte limit of a request's first Piece.
func (pl *Planner) firstCut(limit uint64) uint64 {
	if pl.FirstPiece != 0 && pl.FirstPiece < limit {
		return pl.FirstPiece
	}
	return limit
}

// nextCut is the byte limit of the Piece after one limited to cut.
func nextCut(cut, limit uint64) uint64 {
	if cut > limit/2 {
		return limit
	}
	return 2 * cut
}

// Plan fills out with the Pieces of blocks, whose Task fields lie in
// [0, tasks). Blocks are staged in order and never merged, so every non-empty
// block yields one slice per Piece it touches and the slices map back to
// their tasks exactly. A zero-length block yields no slice and no plan
// entry. On error out is empty.
//
// Plan allocates only when out's Pieces must grow beyond any earlier
// request.
func (pl *Planner) Plan(blocks []Block, tasks int, out *Plan) error {
	out.Reset()
	if tasks < 0 {
		return fmt.Errorf("task count %d: %w", tasks, ErrTaskRange)
	}
	limitBytes, limitPlans := uint64(SlotSize), MaxPlans
	if pl.pieceBytes != 0 {
		limitBytes, limitPlans = pl.pieceBytes, pl.maxPlans
	}

	// cut is the current Piece's byte limit: the ramp's, then the slot's.
	cut := pl.firstCut(limitBytes)
	pieces := out.Pieces
	var planned uint64
	piece := Piece{}
	for i := range blocks {
		b := &blocks[i]
		if uint(b.Task) >= uint(tasks) || b.Src > math.MaxUint64-b.Len || b.Dst > math.MaxUint64-b.Len || b.Len > MaxRequestBytes-planned {
			out.Pieces = pieces
			out.Reset()
			return blockError(i, b, tasks, planned)
		}
		planned += b.Len
		for left := b.Len; left > 0; {
			n := min(left, cut-piece.Len)
			piece.End++
			piece.Len += n
			left -= n
			if piece.Len == cut || piece.End-piece.Start == limitPlans {
				pieces = append(pieces, piece)
				piece = Piece{Start: piece.End, End: piece.End, First: i, Off: b.Len - left}
				cut = nextCut(cut, limitBytes)
			}
		}
	}
	if piece.End > piece.Start {
		pieces = append(pieces, piece)
	}
	out.Pieces, out.Bytes = pieces, planned
	return nil
}

// blockError says what is wrong with block i, which Plan refused.
func blockError(i int, b *Block, tasks int, planned uint64) error {
	switch {
	case b.Task < 0 || b.Task >= tasks:
		return fmt.Errorf("block %d: task %d not in [0, %d): %w", i, b.Task, tasks, ErrTaskRange)
	case b.Src > math.MaxUint64-b.Len:
		return fmt.Errorf("block %d: src %#x + len %#x: %w", i, b.Src, b.Len, ErrAddressOverflow)
	case b.Dst > math.MaxUint64-b.Len:
		return fmt.Errorf("block %d: dst %#x + len %#x: %w", i, b.Dst, b.Len, ErrAddressOverflow)
	}
	return fmt.Errorf("block %d: len %#x after %#x planned bytes: %w", i, b.Len, planned, ErrRequestTooLarge)
}
