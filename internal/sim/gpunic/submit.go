// SPDX-License-Identifier: Apache-2.0

package gpunic

import (
	"errors"
	"fmt"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
)

// errNICRead fails read ops: the emulated NIC only writes.
var errNICRead = errors.New("gpunic: the emulated NIC cannot read")

// Submit accepts every op or, when the queue has no room for all of them,
// none and returns relay.ErrHopBusy. An op that cannot be performed
// (unknown session, range outside the target, a read) is accepted and
// completes with an error. A batch the ops fill is started at once, the
// rest once due (see NIC).
func (n *NIC) Submit(ops []relay.WriteOp) error {
	n.mu.Lock()
	wake, err := n.submit(ops)
	n.mu.Unlock()
	if wake {
		n.wake()
	}
	return err
}

func (n *NIC) submit(ops []relay.WriteOp) (wake bool, err error) {
	if n.closed {
		return false, errors.New("gpunic: closed")
	}
	if len(ops) > n.depth {
		return false, fmt.Errorf("gpunic: batch of %d ops, more than the queue depth %d", len(ops), n.depth)
	}
	if need := batchesFor(ops); need > nicBatches {
		return false, fmt.Errorf("gpunic: batch of %d ops may need %d GPU operations, more than the %d a NIC has", len(ops), need, nicBatches)
	} else if n.opN+len(ops) > n.depth || n.bN+need > nicBatches {
		return false, relay.ErrHopBusy
	}
	now := n.clock()
	for i := range ops {
		op := &ops[i]
		o := nicOp{token: op.Token, batch: -1}
		dst, err := n.check(op)
		if err != nil {
			o.failed, n.errs[n.opTail] = true, err
		} else {
			var start int64
			start, o.finish = n.pace(now, op.Len)
			if op.Len > 0 {
				if n.cur >= 0 {
					if b := &n.batches[n.cur]; b.sealed || len(b.entries) == batchOps || b.bytes >= ceBatchBytes || (b.bytes >= batchBytes && b.bytes < gpu.GatherThreshold*uint64(len(b.entries))) {
						n.closeCur()
						wake = true
					}
				}
				if n.cur < 0 {
					n.open(start)
				}
				b := &n.batches[n.cur]
				b.entries = append(b.entries, cuda.BatchEntry{Src: uint64(op.Src), Dst: uint64(dst), Len: op.Len})
				b.bytes += op.Len
				b.ops++
				o.batch = int32(n.cur)
			}
		}
		n.ops[n.opTail] = o
		if n.opTail++; n.opTail == n.depth {
			n.opTail = 0
		}
		n.opN++
	}
	return wake, nil
}

// SubmitPiece takes all of a relayed Piece's writes (at most
// staging.MaxPlans) as one GPU operation of their own and reports their
// end as one completion with token, whose error is the first write's
// failure, once the wire has sent the last of them and the GPU is done. It
// takes the Piece whole while the queue has room for one more Piece (a
// Piece counts as one toward the queue's depth), else none and returns
// relay.ErrHopBusy. The ops' own tokens are unused.
func (n *NIC) SubmitPiece(ops []relay.WriteOp, token uint64) error {
	n.mu.Lock()
	wake, err := n.submitPiece(ops, token)
	n.mu.Unlock()
	if wake {
		n.wake()
	}
	return err
}

func (n *NIC) submitPiece(ops []relay.WriteOp, token uint64) (wake bool, err error) {
	if n.closed {
		return false, errors.New("gpunic: closed")
	}
	if len(ops) == 0 || len(ops) > batchOps {
		return false, fmt.Errorf("gpunic: Piece %d of %d writes, want 1 to %d", token, len(ops), batchOps)
	}
	if n.opN == n.depth || n.bN+2 > nicBatches {
		return false, relay.ErrHopBusy
	}
	now := n.clock()
	o := nicOp{token: token, batch: -1}
	for i := range ops {
		op := &ops[i]
		dst, err := n.check(op)
		if err != nil {
			if !o.failed {
				o.failed, n.errs[n.opTail] = true, fmt.Errorf("gpunic: Piece %d, write %d: %w", token, i, err)
			}
			continue
		}
		var start int64
		start, o.finish = n.pace(now, op.Len)
		if op.Len == 0 {
			continue
		}
		if o.batch < 0 {
			if n.cur >= 0 {
				n.closeCur()
				wake = true
			}
			n.open(start)
			n.batches[n.cur].sealed = true
			n.batches[n.cur].ops = 1
			o.batch = int32(n.cur)
		}
		b := &n.batches[n.cur]
		b.entries = append(b.entries, cuda.BatchEntry{Src: uint64(op.Src), Dst: uint64(dst), Len: op.Len})
		b.bytes += op.Len
	}
	n.ops[n.opTail] = o
	if n.opTail++; n.opTail == n.depth {
		n.opTail = 0
	}
	n.opN++
	return wake, nil
}

// check returns where op writes in this process, or why it cannot.
func (n *NIC) check(op *relay.WriteOp) (cuda.DevicePtr, error) {
	if end := op.Dst + op.Len; !op.Read && n.tg.len != 0 && op.Target == n.tg.session && op.Dst >= n.tg.addr && end >= op.Dst && end <= n.tg.addr+n.tg.len && (op.Src != 0 || op.Len == 0) {
		return n.tg.base + cuda.DevicePtr(op.Dst-n.tg.addr), nil
	}
	if op.Read {
		return 0, fmt.Errorf("token %d: %w", op.Token, errNICRead)
	}
	dst, err := n.targets.translate(op.Target, op.Dst, op.Len, &n.hint)
	if err == nil && op.Len > 0 && op.Src == 0 {
		err = fmt.Errorf("gpunic: token %d has no source", op.Token)
	}
	if err == nil {
		n.tg = n.targets.list[n.hint]
	}
	return dst, err
}

// closeCur closes the open batch: it is ready for a starter.
func (n *NIC) closeCur() {
	n.batches[n.cur].state = batchReady
	n.cur = -1
}

// batchesFor bounds the batches a Submit of ops opens: the open batch is
// closed once it holds batchOps ops, ceBatchBytes bytes, or batchBytes
// bytes in ops shorter on average than gpu.GatherThreshold (so at least
// minByBytes of them), and one more opens after the last close.
func batchesFor(ops []relay.WriteOp) int {
	const minByBytes = batchBytes / gpu.GatherThreshold
	var total uint64
	for i := range ops {
		if total += ops[i].Len; total < ops[i].Len {
			total = ^uint64(0)
		}
	}
	byBytes := min(total/batchBytes, uint64(len(ops)/minByBytes)+total/ceBatchBytes, uint64(len(ops)))
	return 2 + len(ops)/batchOps + int(byBytes)
}
