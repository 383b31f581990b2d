// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"errors"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
)

// inflightRec is one relayed Piece in the second hop. It comes from the
// relayer's pool and owns its write vector until the last write completes and
// the hop has taken every write.
type inflightRec struct {
	lane      int
	epoch     uint64
	seq       uint64
	remaining int
	bytes     uint64
	failed    bool
	// timedOut is set when a failed write timed out (ErrTimedOut).
	timedOut bool
	route    *route
	ops      []WriteOp
	// unsent are the ops the hop has not taken yet.
	unsent []WriteOp
	// sending is set while the rec is being handed to the hop or waits in
	// the relayer's unsent queue: it may not return to the pool then.
	sending bool
	// closing is set when the relay closed before the writes finished.
	closing bool
	// times is the Piece's place in the relay's time ring.
	times uint64
	// token is the hop token of the writes in unsent when the hop takes
	// Pieces whole (PieceHop): one per hand-over the hop accepts, 0 once
	// it has; each write carries its own token otherwise.
	token uint64
	// partEnds[p] is where part p of the Piece ends in ops (the Desc's
	// part ends, then len(ops)); nparts counts the parts, landed those in
	// the slot, whose writes have been released to the hop.
	partEnds [staging.MaxParts]int
	nparts   int
	landed   int
	// waiting is set while parts of the Piece are still being copied into
	// the slot: the rec is on the relayer's waiting list and is not
	// completed, whatever its writes do, until the rest lands, the
	// sender's ring ends or partsWaitLimit passes (waitSince).
	waiting   bool
	waitSince time.Time
}

// setParts records the Piece's parts from its validated part ends.
func (rec *inflightRec) setParts(ends []uint32) {
	rec.nparts = len(ends) + 1
	for p, e := range ends {
		rec.partEnds[p] = int(e)
	}
	rec.partEnds[len(ends)] = len(rec.ops)
	rec.landed = 0
}

// released is how many of rec's writes, from the first, have been
// released to the hop: those of the parts landed.
func (rec *inflightRec) released() int {
	if rec.landed == 0 {
		return 0
	}
	return rec.partEnds[rec.landed-1]
}

// errLaneEnded fails a relayed Piece whose sender's ring ended while its
// later parts were still being copied.
var errLaneEnded = errors.New("the sender's lane ended before the piece landed whole")

// errPartsLate fails a relayed Piece whose later parts did not land
// within partsWaitLimit: the writes of the parts that landed have ended,
// those of the rest never began.
var errPartsLate = errors.New("the piece's later parts did not land in time")

// inLane is the relayer's state of one of this rank's inbound lanes.
type inLane struct {
	rx *staging.RelayLane
	// commitWait is when the current ticket's doorbell was first seen with
	// its Desc not yet committed.
	commitWait time.Time
	// unsettled counts the Pieces taken from the lane whose second-hop
	// writes have not all ended: while it is not 0 no new epoch of the
	// lane is opened, since their writes still read its slots.
	unsettled int
	// waiting is the lane's Piece whose later parts are still landing, if
	// any: the lane gives no further ticket meanwhile.
	waiting *inflightRec
}

// commitWaitLimit bounds how long a rung doorbell may wait for its Desc.
const commitWaitLimit = 100 * time.Millisecond

// partsWaitLimit bounds how long a Piece taken on its first part may wait
// for the rest: a gather that hangs, or a sender that never signals the
// rest, fails that Piece and frees its lane's turn.
const partsWaitLimit = time.Second

// fill builds the rec's second-hop writes, one per plan entry, from the
// Piece's bytes at src. It returns the index of the first entry whose
// destination is not inside one of the route's ranges, or -1 when all are.
//
// A vector too small for the Piece is replaced by one of MaxPlans ops, so
// that a rec grows once, whatever sizes of Piece it carries later.
func (rec *inflightRec) fill(rt *route, plans []staging.PlanEntry, src uintptr) int {
	if cap(rec.ops) < len(plans) {
		rec.ops = make([]WriteOp, 0, max(len(plans), staging.MaxPlans))
	}
	ops := rec.ops[:0]
	for k, pe := range plans {
		r := rt.find(pe.Dst, pe.Len)
		if r < 0 {
			clear(ops)
			rec.ops = ops[:0]
			return k
		}
		ops = append(ops, WriteOp{Src: src, Len: pe.Len, Target: rt.session, Dst: pe.Dst, Route: rt.handle, Key: rt.ranges[r].Key})
		src += uintptr(pe.Len)
	}
	rec.ops = ops
	return -1
}

// errRelayClosing ends the second hop of a relayed Piece that was still in
// flight when the relay's drain ran out.
var errRelayClosing = errors.New("relay closed before the second hop finished")
