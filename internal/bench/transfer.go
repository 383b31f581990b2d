// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"errors"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
)

// spinBatch is how many requests a spinning rank submits at a time.
const spinBatch = 16

// maxRequest keeps every request under the TCP hop's frame limit (64 MiB);
// an RDMA transport would slice a large write itself.
const maxRequest = 32 << 20

// submitBatch is how many of n requests a caller hands over in one call:
// perSubmit when set, else spinBatch on a spinning device, else all.
func submitBatch(n int, spin bool, perSubmit int) int {
	switch {
	case perSubmit > 0:
		return min(n, perSubmit)
	case spin:
		return min(n, spinBatch)
	}
	return n
}

func requests(mine []transfer, base uintptr) ([]relay.Request, uint64) {
	var reqs []relay.Request
	var total uint64
	for _, t := range mine {
		block := min(t.Block, maxRequest)
		for off := uint64(0); off < t.Len; off += block {
			n := min(block, t.Len-off)
			reqs = append(reqs, relay.Request{Op: relay.Write, Src: base + uintptr(t.Src+off), Len: n, Target: t.Remote, Dst: targetBase + t.Dst + off})
			total += n
		}
	}
	return reqs, total
}

// transferEngine moves a rank's requests through the engine. With spin it
// submits them in batches of spinBatch, so that planning the later ones
// overlaps the transfer of the first (a pipelined caller), and polls Done
// without sleeping (on GPUs, where a sleep is a visible part of a short
// run).
func transferEngine(eng *relay.Engine, mine []transfer, base uintptr, spin bool, perSubmit int) (*rankResult, error) {
	reqs, total := requests(mine, base)
	batch := submitBatch(len(reqs), spin, perSubmit)
	res := &rankResult{Bytes: total, Requests: len(reqs)}
	cost := startCost(eng)
	start := time.Now()
	var batches []*relay.Batch
	for i := 0; i < len(reqs) || i == 0; i += max(batch, 1) {
		b, err := eng.Submit(reqs[i:min(i+batch, len(reqs))])
		if err != nil {
			return nil, err
		}
		batches = append(batches, b)
	}
	prog := progress{batches: batches, samples: []progressSample{{Ns: start.UnixNano()}}}
	for _, b := range batches {
		for !b.Done() {
			prog.sample(time.Now())
			pause(spin)
		}
	}
	end := time.Now()
	prog.last = time.Time{}
	prog.sample(end)
	cost.record(res)
	res.Seconds = end.Sub(start).Seconds()
	res.StartNs, res.EndNs, res.Progress = start.UnixNano(), end.UnixNano(), prog.samples
	defer func() {
		for _, b := range batches {
			_ = b.Release()
		}
	}()
	for _, b := range batches {
		for i := 0; i < b.Len(); i++ {
			if st, _ := b.Status(i); st.State != relay.Completed {
				res.fail(st.Err)
			}
		}
	}
	return res, nil
}

func diffCounters(a, b relay.CounterSnapshot) relay.CounterSnapshot {
	d := relay.CounterSnapshot{
		RelayedBytes: a.RelayedBytes - b.RelayedBytes, RelayedPieces: a.RelayedPieces - b.RelayedPieces,
		FallbackBytes: a.FallbackBytes - b.FallbackBytes, FallbackPieces: a.FallbackPieces - b.FallbackPieces,
		DirectBytes: a.DirectBytes - b.DirectBytes, CreditWaits: a.CreditWaits - b.CreditWaits,
		SecondHopFailures: a.SecondHopFailures - b.SecondHopFailures,
		ForwardedBytes:    a.ForwardedBytes - b.ForwardedBytes, ForwardedPieces: a.ForwardedPieces - b.ForwardedPieces,
		InvalidDescs: a.InvalidDescs - b.InvalidDescs, FailedPieces: a.FailedPieces - b.FailedPieces,
		LaneQuarantines: a.LaneQuarantines - b.LaneQuarantines,
		PumpSleeps:      a.PumpSleeps - b.PumpSleeps, PumpWakes: a.PumpWakes - b.PumpWakes,
		InboundContended: a.InboundContended - b.InboundContended, InboundOutOfTurn: a.InboundOutOfTurn - b.InboundOutOfTurn,
	}
	for r := range d.FallbackBytesByReason {
		d.FallbackBytesByReason[r] = a.FallbackBytesByReason[r] - b.FallbackBytesByReason[r]
		d.FallbackPiecesByReason[r] = a.FallbackPiecesByReason[r] - b.FallbackPiecesByReason[r]
	}
	return d
}

// hopChunk is how many ops the engine hands its hop in one Submit (the
// relay package's drainOps); the direct paths below post in the same
// chunks.
const hopChunk = 32

// transferBare moves the same requests through the hop alone: the baseline
// a host gets without the engine, posted as the engine posts direct
// writes. Every call of submitBatch requests is handed over at once, as
// transferEngine's Submits are; a call's writes go to the hop in Submits
// of at most hopChunk while the hop has room, and what it refuses waits,
// in order, for the next round, as the engine's backlog does. Each write
// is one op whatever its length (the engine does not cut a direct write),
// and an idle round pauses as the engine's caller does. Posting one write
// a Submit instead made the emulated NIC start one GPU operation an 8 MiB
// write and measured that, not the hop.
func transferBare(hop relay.Hop, mine []transfer, base uintptr, spin bool, perSubmit int) (*rankResult, error) {
	reqs, total := requests(mine, base)
	batch := max(submitBatch(len(reqs), spin, perSubmit), 1)
	ops := make([]relay.WriteOp, len(reqs))
	for i, r := range reqs {
		ops[i] = relay.WriteOp{Src: r.Src, Len: r.Len, Target: r.Target, Dst: r.Dst, Token: uint64(i)}
	}
	proc0, _ := cpuTime(0)
	start := time.Now()
	res := &rankResult{Bytes: total, Requests: len(reqs)}
	var done [256]relay.HopCompletion
	// posted ops went to the hop; handed ops are the caller's calls so
	// far (all of them at once, as transferEngine submits).
	posted, finished := 0, 0
	drain := func(end int) error {
		for posted < end {
			n := min(hopChunk, end-posted)
			err := hop.Submit(ops[posted : posted+n])
			if errors.Is(err, relay.ErrHopBusy) {
				return nil
			}
			if err != nil {
				return err
			}
			posted += n
		}
		return nil
	}
	// A call drains its own writes while nothing waits before them, in
	// chunks that end at the call's end, as the engine's Submit does.
	for handed := 0; handed < len(ops); handed = min(handed+batch, len(ops)) {
		if posted == handed {
			if err := drain(min(handed+batch, len(ops))); err != nil {
				return nil, err
			}
		}
	}
	for finished < len(reqs) {
		if err := drain(len(ops)); err != nil {
			return nil, err
		}
		n := hop.Poll(done[:])
		for _, c := range done[:n] {
			finished++
			if c.Err != nil {
				res.fail(c.Err)
			}
		}
		if n == 0 {
			pause(spin)
		}
	}
	end := time.Now()
	res.Seconds = end.Sub(start).Seconds()
	res.StartNs, res.EndNs = start.UnixNano(), end.UnixNano()
	proc1, _ := cpuTime(0)
	res.ProcessCPU = proc1 - proc0
	res.Counters.DirectBytes = total
	return res, nil
}
