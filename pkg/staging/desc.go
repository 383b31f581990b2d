// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
)

// Sentinel errors of Desc validation, one per rule. A *DescError unwraps to
// exactly one of them.
var (
	ErrDescSeq       = errors.New("desc commit seq")
	ErrDescEpoch     = errors.New("desc epoch")
	ErrDescPieceLen  = errors.New("desc piece length")
	ErrDescPlanCount = errors.New("desc plan count")
	ErrDescSession   = errors.New("desc session length")
	ErrDescPlanLen   = errors.New("desc plan length")
	ErrDescOverflow  = errors.New("desc plan address overflow")
	ErrDescPlanSum   = errors.New("desc plan sum")
	ErrDescParts     = errors.New("desc parts")
)

// DescErrorKind names the Desc rule that failed.
type DescErrorKind uint8

// The Desc rules, in the order ValidateDesc checks them.
const (
	DescSeq DescErrorKind = iota + 1
	DescEpoch
	DescPieceLen
	DescPlanCount
	DescSession
	DescPlanLen
	DescOverflow
	DescPlanSum
	DescParts
)

var descSentinels = [...]error{
	DescSeq:       ErrDescSeq,
	DescEpoch:     ErrDescEpoch,
	DescPieceLen:  ErrDescPieceLen,
	DescPlanCount: ErrDescPlanCount,
	DescSession:   ErrDescSession,
	DescPlanLen:   ErrDescPlanLen,
	DescOverflow:  ErrDescOverflow,
	DescPlanSum:   ErrDescPlanSum,
	DescParts:     ErrDescParts,
}

// DescError reports a Desc that breaks one rule, with the offending value.
type DescError struct {
	Kind DescErrorKind
	// Field is the Desc field at fault: "commit_seq", "epoch", "piece_len",
	// "plan_count", "session_len", "plans.len", "plans.dst", "plans",
	// "parts" or "part_ends".
	Field string
	// Plan is the index of the offending plan entry (of part_ends for a
	// DescParts error), or -1.
	Plan int
	// Value is the offending value.
	Value uint64
	// Want is the expected value or the limit Value broke; its meaning per
	// Kind is spelled out by Error.
	Want uint64
}

func (e *DescError) Error() string {
	switch e.Kind {
	case DescSeq:
		if e.Value == 0 {
			return fmt.Sprintf("invalid desc: commit_seq 0 is never published (want %d)", e.Want)
		}
		return fmt.Sprintf("invalid desc: commit_seq %d, want %d", e.Value, e.Want)
	case DescEpoch:
		if e.Value == 0 {
			return "invalid desc: epoch 0 is reserved for an unclaimed lane"
		}
		return fmt.Sprintf("invalid desc: epoch %#x, want %#x", e.Value, e.Want)
	case DescPieceLen, DescPlanCount, DescSession:
		return fmt.Sprintf("invalid desc: %s %d out of range 1..%d", e.Field, e.Value, e.Want)
	case DescPlanLen:
		return fmt.Sprintf("invalid desc: plans[%d].len 0: a plan entry carries at least one byte", e.Plan)
	case DescOverflow:
		return fmt.Sprintf("invalid desc: plans[%d].dst %#x: dst+len does not fit in 64 bits (largest dst for this len %#x)", e.Plan, e.Value, e.Want)
	case DescPlanSum:
		if e.Plan >= 0 {
			return fmt.Sprintf("invalid desc: plans[%d].len %d exceeds the %d bytes of the piece left", e.Plan, e.Value, e.Want)
		}
		return fmt.Sprintf("invalid desc: plan lengths sum to %d, want piece_len %d", e.Value, e.Want)
	case DescParts:
		if e.Plan < 0 {
			return fmt.Sprintf("invalid desc: parts %d out of range 0..%d", e.Value, e.Want)
		}
		return fmt.Sprintf("invalid desc: part_ends[%d] %d: want more than the part before and less than %d", e.Plan, e.Value, e.Want)
	}
	return fmt.Sprintf("invalid desc: %s %d (kind %d)", e.Field, e.Value, e.Kind)
}

// Unwrap returns the sentinel of e's Kind, so errors.Is(err, ErrDescEpoch)
// and the like work.
func (e *DescError) Unwrap() error {
	if int(e.Kind) < len(descSentinels) {
		return descSentinels[e.Kind]
	}
	return nil
}

// DescExpect is what the relay knows independently of the Desc it is about
// to consume: the lane's epoch and the seq it waits for.
type DescExpect struct {
	Epoch uint64
	Seq   uint64
}

// DescHeader is a one-time copy of a Desc's fixed fields.
type DescHeader struct {
	CommitSeq  uint64
	Epoch      uint64
	PieceLen   uint64
	PlanCount  uint32
	SessionLen uint32
	Parts      uint32
	PartEnds   [MaxParts - 1]uint32
}

// LoadDescHeader reads each fixed field of d exactly once. CommitSeq is loaded
// first, with acquire, so that the other fields are at least as new as the
// commit; the caller validates and uses only the returned copy, because a
// peer may rewrite d at any time.
func LoadDescHeader(d *Desc) DescHeader {
	var h DescHeader
	h.CommitSeq = atomic.LoadUint64(&d.CommitSeq)
	h.Epoch = atomic.LoadUint64(&d.Epoch)
	h.PieceLen = atomic.LoadUint64(&d.PieceLen)
	h.PlanCount = atomic.LoadUint32(&d.PlanCount)
	h.SessionLen = atomic.LoadUint32(&d.SessionLen)
	h.Parts = atomic.LoadUint32(&d.Parts)
	for p := range h.PartEnds {
		h.PartEnds[p] = atomic.LoadUint32(&d.PartEnds[p])
	}
	return h
}

// LoadCommitSeq acquire-loads d's commit seq.
func LoadCommitSeq(d *Desc) uint64 { return atomic.LoadUint64(&d.CommitSeq) }

// PublishDesc release-stores seq into d's commit seq. Every other field of d
// must have been written before; none may be written after until the slot
// is reaped.
func PublishDesc(d *Desc, seq uint64) { atomic.StoreUint64(&d.CommitSeq, seq) }

// ValidDesc is a relay-owned copy of a Desc that passed ValidateDesc. It is
// large (the plans of a full Piece): keep one and reuse it.
type ValidDesc struct {
	hdr     DescHeader
	session [MaxSession]byte
	plans   [MaxPlans]PlanEntry
}

// Seq is the validated commit seq.
func (v *ValidDesc) Seq() uint64 { return v.hdr.CommitSeq }

// Epoch is the validated lane epoch.
func (v *ValidDesc) Epoch() uint64 { return v.hdr.Epoch }

// PieceLen is the number of staged bytes, the sum of Plans' lengths.
func (v *ValidDesc) PieceLen() uint64 { return v.hdr.PieceLen }

// Session is the target session name. It aliases v.
func (v *ValidDesc) Session() []byte { return v.session[:v.hdr.SessionLen] }

// Plans are the validated plan entries, in slot order. They alias v.
func (v *ValidDesc) Plans() []PlanEntry { return v.plans[:v.hdr.PlanCount] }

// PartEnds are the plan-entry ends of every part but the last, increasing
// and below the plan count: empty for a Piece of one part. They alias v.
func (v *ValidDesc) PartEnds() []uint32 {
	if v.hdr.Parts < 2 {
		return nil
	}
	return v.hdr.PartEnds[:v.hdr.Parts-1]
}

// ValidateDesc copies d, which lives in shared memory and may change under
// it, into out and checks the copy against want. On success out holds the
// Desc; on failure out is empty and the error is a *DescError.
func ValidateDesc(d *Desc, want DescExpect, out *ValidDesc) error {
	out.hdr = DescHeader{}
	h := LoadDescHeader(d)
	if err := checkSeqEpoch(h, want); err != nil {
		return err
	}
	if err := checkShape(h.PieceLen, uint64(h.PlanCount), uint64(h.SessionLen)); err != nil {
		return err
	}
	copy(out.session[:h.SessionLen], d.Session[:h.SessionLen])
	plans := out.plans[:h.PlanCount]
	copy(plans, d.Plans[:h.PlanCount])
	if err := checkPlans(plans, h.PieceLen); err != nil {
		return err
	}
	if err := checkParts(h.Parts, h.PartEnds[:], h.PlanCount); err != nil {
		return err
	}
	out.hdr = h
	return nil
}

// Fill writes a Desc for one Piece: everything but CommitSeq, which
// PublishDesc stores once the Desc is complete. partEnds are the plan-entry
// ends of every part but the last (nil: one part; see Desc.Parts). It
// checks the same rules as ValidateDesc and leaves d untouched when one
// fails.
func (d *Desc) Fill(epoch uint64, session string, plans []PlanEntry, pieceLen uint64, partEnds []uint32) error {
	if epoch == 0 {
		return &DescError{Kind: DescEpoch, Field: "epoch", Plan: -1}
	}
	if err := checkShape(pieceLen, uint64(len(plans)), uint64(len(session))); err != nil {
		return err
	}
	if err := checkPlans(plans, pieceLen); err != nil {
		return err
	}
	if err := CheckPartEnds(partEnds, len(plans)); err != nil {
		return err
	}
	var ends [MaxParts - 1]uint32
	copy(ends[:], partEnds)
	parts := uint32(len(partEnds) + 1)
	d.Epoch = epoch
	d.PieceLen = pieceLen
	d.PlanCount = uint32(len(plans))
	d.SessionLen = uint32(len(session))
	n := copy(d.Session[:], session)
	clear(d.Session[n:])
	copy(d.Plans[:], plans)
	d.Parts = parts
	d.PartEnds = ends
	return nil
}

func checkSeqEpoch(h DescHeader, want DescExpect) error {
	if h.CommitSeq == 0 || h.CommitSeq > MaxLaneSeq || h.CommitSeq != want.Seq {
		return &DescError{Kind: DescSeq, Field: "commit_seq", Plan: -1, Value: h.CommitSeq, Want: want.Seq}
	}
	if h.Epoch == 0 || h.Epoch != want.Epoch {
		return &DescError{Kind: DescEpoch, Field: "epoch", Plan: -1, Value: h.Epoch, Want: want.Epoch}
	}
	return nil
}

func checkShape(pieceLen, planCount, sessionLen uint64) error {
	switch {
	case pieceLen == 0 || pieceLen > SlotSize:
		return &DescError{Kind: DescPieceLen, Field: "piece_len", Plan: -1, Value: pieceLen, Want: SlotSize}
	case planCount == 0 || planCount > MaxPlans:
		return &DescError{Kind: DescPlanCount, Field: "plan_count", Plan: -1, Value: planCount, Want: MaxPlans}
	case sessionLen == 0 || sessionLen > MaxSession:
		return &DescError{Kind: DescSession, Field: "session_len", Plan: -1, Value: sessionLen, Want: MaxSession}
	}
	return nil
}

// checkPlans requires every entry to be non-empty, to end at or below 2^64-1,
// and the lengths to add up to pieceLen exactly. The running remainder never
// underflows and no sum is formed that could wrap.
func checkPlans(plans []PlanEntry, pieceLen uint64) error {
	left := pieceLen
	for i, p := range plans {
		if p.Len == 0 {
			return &DescError{Kind: DescPlanLen, Field: "plans.len", Plan: i}
		}
		if p.Dst > math.MaxUint64-p.Len {
			return &DescError{Kind: DescOverflow, Field: "plans.dst", Plan: i, Value: p.Dst, Want: math.MaxUint64 - p.Len}
		}
		if p.Len > left {
			return &DescError{Kind: DescPlanSum, Field: "plans.len", Plan: i, Value: p.Len, Want: left}
		}
		left -= p.Len
	}
	if left != 0 {
		return &DescError{Kind: DescPlanSum, Field: "plans", Plan: -1, Value: pieceLen - left, Want: pieceLen}
	}
	return nil
}

// CutParts appends to out the plan-entry ends (Desc.PartEnds) of a Piece of
// plans, pieceLen bytes in all, cut into at most parts parts of about equal
// bytes: part p ends with the first entry that reaches (p+1)/parts of the
// Piece. Parts only end between entries, so a Piece of fewer entries, or
// with entries longer than a part, gets fewer parts; a Piece of one entry
// gets none (out unchanged). It allocates nothing when out has room.
func CutParts(out []uint32, plans []PlanEntry, pieceLen uint64, parts int) []uint32 {
	parts = min(parts, MaxParts)
	var sum uint64
	k := uint64(1)
	for i := 0; i+1 < len(plans) && k < uint64(parts); i++ {
		sum += plans[i].Len
		if sum*uint64(parts) < k*pieceLen {
			continue
		}
		out = append(out, uint32(i+1))
		for k < uint64(parts) && sum*uint64(parts) >= k*pieceLen {
			k++
		}
	}
	return out
}

// CheckPartEnds checks the part ends of a Piece of entries plan entries
// (Desc.PartEnds, the ends of every part but the last) by ValidateDesc's
// rules, for a copier handed them as well as for Fill.
func CheckPartEnds(ends []uint32, entries int) error {
	if len(ends) > MaxParts-1 {
		return &DescError{Kind: DescParts, Field: "parts", Plan: -1, Value: uint64(len(ends) + 1), Want: MaxParts}
	}
	return checkParts(uint32(len(ends)+1), ends, uint32(min(entries, math.MaxUint32)))
}

// checkParts requires 0..MaxParts parts and, for two or more, part ends
// that increase strictly, start above 0 and stay below the plan count, so
// that every part holds at least one plan entry.
func checkParts(parts uint32, ends []uint32, planCount uint32) error {
	if parts > MaxParts {
		return &DescError{Kind: DescParts, Field: "parts", Plan: -1, Value: uint64(parts), Want: MaxParts}
	}
	prev := uint32(0)
	for p := 0; p+1 < int(parts); p++ {
		if ends[p] <= prev || ends[p] >= planCount {
			return &DescError{Kind: DescParts, Field: "part_ends", Plan: p, Value: uint64(ends[p]), Want: uint64(planCount)}
		}
		prev = ends[p]
	}
	return nil
}
