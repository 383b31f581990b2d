package relay

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
)

// inflightRec is one relayed Piece in the second hop. It owns its write
// vector until the last write completes.
type inflightRec struct {
	lane      int
	epoch     uint64
	seq       uint64
	remaining int
	bytes     uint64
	failed    bool
	ops       []WriteOp
	// unsent are the ops the hop has not taken yet.
	unsent []WriteOp
}

// inLane is the relay side of one of this rank's inbound lanes. Pump only.
type inLane struct {
	epoch  uint64
	next   uint64
	window staging.CompletionWindow
	status [staging.SlotsPerLane]int32
	// commitWait is when the current ticket's doorbell was first seen with
	// its Desc not yet committed.
	commitWait time.Time
}

// commitWaitLimit bounds how long a rung doorbell may wait for its Desc.
const commitWaitLimit = 100 * time.Millisecond

// consume takes at most one ticket from inbound lane i. It returns true when
// it made progress.
func (e *Engine) consume(i int) bool {
	ctl := e.reg.Control()
	lane := &ctl.Lanes[i]
	il := &e.pump.in[i]
	epoch := atomic.LoadUint64(&lane.Owner.LaneEpoch)
	if epoch == 0 {
		return false
	}
	if epoch != il.epoch {
		first := il.epoch == 0
		il.epoch = epoch
		il.next = 1
		il.window = staging.CompletionWindow{}
		il.commitWait = time.Time{}
		if s := e.hooks.firstSeq; first && s > 1 {
			il.next, il.window = s, staging.CompletionWindowAt(s-1)
		}
	}
	if e.pump.relayInflight >= e.cfg.InflightDepth {
		return false
	}
	seq := il.next
	if seq-il.window.Completed() > staging.SlotsPerLane {
		// Credit, enforced here too: a sender that ignores it cannot give
		// the relay a ticket whose slot an earlier one still uses.
		return false
	}
	slot := staging.SlotOf(seq)
	if atomic.LoadUint64(&lane.Ready[slot].Seq) != seq {
		return false
	}
	d := &lane.Descs[slot]
	if staging.LoadCommitSeq(d) != seq {
		// The doorbell can become visible before the Desc's commit seq
		// (a GPU store against a CPU store): not ready yet. A commit seq
		// that never comes is a broken sender; after a bound the ticket is
		// validated as it is, fails, and the credit returns.
		now := time.Now()
		if il.commitWait.IsZero() {
			il.commitWait = now
			return false
		}
		if now.Sub(il.commitWait) < commitWaitLimit {
			return false
		}
	}
	il.commitWait = time.Time{}
	vd := &e.pump.vd
	if err := staging.ValidateDesc(d, staging.DescExpect{Epoch: epoch, Seq: seq}, vd); err != nil {
		e.counters.invalidDescs.Add(1)
		e.log.V(2).Info("invalid descriptor", "lane", i, "seq", seq, "err", err)
		il.next++
		e.complete(i, seq, staging.CompletionInvalidDesc)
		return true
	}
	session := string(vd.Session())
	plans := vd.Plans()
	t, err := e.dir.Resolve(session, plans[0].Dst)
	if err != nil || len(t.HCAs) != 1 || staging.CanonicalRail(e.cfg.RailMap, t.HCAs[0]) != e.localRail {
		il.next++
		e.complete(i, seq, staging.CompletionUnresolved)
		return true
	}
	rec := &inflightRec{lane: i, epoch: epoch, seq: seq, remaining: len(plans), bytes: vd.PieceLen()}
	rec.ops = make([]WriteOp, len(plans))
	src := e.reg.ArenaBase() + uintptr(staging.SlotOffset(i, slot))
	for k, pe := range plans {
		rec.ops[k] = WriteOp{Src: src, Len: pe.Len, Target: session, Dst: pe.Dst}
		src += uintptr(pe.Len)
	}
	for k := range rec.ops {
		rec.ops[k].Token = e.tokens.add(tokenEntry{kind: tokRelay, rec: rec})
	}
	il.next++
	e.pump.relayInflight++
	rec.unsent = rec.ops
	e.pump.sendRecord(rec)
	return true
}

// finishRelayWrite counts one second-hop write of a relayed Piece; the last
// one completes the Piece.
func (e *Engine) finishRelayWrite(rec *inflightRec, err error) {
	if err != nil && !rec.failed {
		rec.failed = true
		e.log.V(2).Info("second hop failed", "lane", rec.lane, "seq", rec.seq, "err", err)
	}
	rec.remaining--
	if rec.remaining > 0 {
		return
	}
	e.pump.relayInflight--
	status := int32(staging.CompletionOK)
	if rec.failed {
		status = staging.CompletionSecondHop
		e.counters.secondHopFails.Add(1)
	} else {
		e.counters.forwardedBytes.Add(rec.bytes)
		e.counters.forwardedPiece.Add(1)
	}
	rec.ops, rec.unsent = nil, nil
	if e.pump.in[rec.lane].epoch != rec.epoch {
		// The lane was claimed anew meanwhile: the old sender is gone and
		// the new one must not see this completion.
		return
	}
	e.complete(rec.lane, rec.seq, status)
}

// complete records the end of seq on inbound lane i and publishes every
// completion that is now contiguous: status first, seq last.
func (e *Engine) complete(i int, seq uint64, status int32) {
	lane := &e.reg.Control().Lanes[i]
	il := &e.pump.in[i]
	before := il.window.Completed()
	il.status[staging.SlotOf(seq)] = status
	after, err := il.window.MarkDone(seq)
	if err != nil {
		e.log.Error(err, "completion out of window", "lane", i)
		return
	}
	for s := before + 1; s <= after; s++ {
		c := &lane.Completions[staging.SlotOf(s)]
		atomic.StoreInt32(&c.Status, il.status[staging.SlotOf(s)])
		atomic.StoreUint64(&c.Seq, s)
	}
	if after != before {
		atomic.StoreUint64(&lane.Relay.CompletedSeq, after)
	}
}

func (r *inflightRec) String() string {
	return fmt.Sprintf("lane %d seq %d", r.lane, r.seq)
}
