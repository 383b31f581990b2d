// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// orderHop records the destination of every write the relay submits, in
// order.
type orderHop struct {
	*fabric.Loopback
	dsts []uint64
}

func (h *orderHop) Submit(ops []relay.WriteOp) error {
	if err := h.Loopback.Submit(ops); err != nil {
		return err
	}
	for _, op := range ops {
		h.dsts = append(h.dsts, op.Dst)
	}
	return nil
}

func (h *orderHop) SubmitPiece(ops []relay.WriteOp, token uint64) error {
	if err := h.Loopback.SubmitPiece(ops, token); err != nil {
		return err
	}
	for _, op := range ops {
		h.dsts = append(h.dsts, op.Dst)
	}
	return nil
}

// Seven lanes with tickets waiting, under an inflight cap of 1 and of 4:
// the relay serves them strictly in turn, the lane after the last served
// first when the cap frees a slot, never lane 0 again.
func TestInboundLanesServedInTurnAcrossTheCap(t *testing.T) {
	const perLane, size = 3, 64
	for _, depth := range []int{1, 4} {
		t.Run(fmt.Sprint("inflight depth ", depth), func(t *testing.T) {
			g := newMemGroup(t)
			rank := g.add("rail1", "mlx5_1")
			hop := &orderHop{Loopback: fabric.NewLoopback(fabric.LoopbackOptions{})}
			if err := hop.AddTarget(sessRail1, "rmlx5_1", mapAnon(t, staging.LaneCount*perLane*size), tgtBase); err != nil {
				t.Fatal(err)
			}
			cfg := enabledConfig()
			cfg.InflightDepth = depth
			e, err := relay.OpenWithFaultHooks(cfg, relay.Deps{Hop: hop, Directory: hop, Copier: cpucopy.NewHostCopier(),
				Registry: rank, LocalHCA: "mlx5_1"}, relay.FaultHooks{ManualPump: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close(context.Background()) })
			var txs []*staging.SenderLane
			for i := range staging.LaneCount {
				tx, _, closeWake := rank.claim(i, staging.Identity{Pid: 2000 + i, StartTime: 1, Epoch: uint64(i + 1)}, uint64(0x100+i))
				t.Cleanup(closeWake)
				txs = append(txs, tx)
			}
			// The relay opens the claimed lanes in its next round.
			e.RunRound()
			// The relay learns the session's route from one Piece on the
			// last lane first: the order is the turn's, not that of the
			// lookups' answers, and the next turn is lane 0's.
			warmRoute(t, e, txs[staging.LaneCount-1], tgtBase, size)
			hop.dsts = hop.dsts[:0]
			for i, tx := range txs {
				for k := range perLane {
					seq, ok := tx.Ticket()
					if !ok {
						t.Fatal("no credit on a fresh lane")
					}
					dst := tgtBase + uint64(i*perLane+k)*size
					if err := tx.Commit(seq, sessRail1, []staging.PlanEntry{{Dst: dst, Len: size}}, size, nil); err != nil {
						t.Fatal(err)
					}
					staging.RingDoorbell(tx.ReadyWord(seq), seq)
					if err := tx.Publish(seq); err != nil {
						t.Fatal(err)
					}
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for len(hop.dsts) < staging.LaneCount*perLane {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d tickets served", len(hop.dsts), staging.LaneCount*perLane)
				}
				e.RunRound()
			}
			for n, dst := range hop.dsts {
				if lane := int(dst-tgtBase) / size / perLane; lane != n%staging.LaneCount {
					t.Fatalf("ticket %d served came from lane %d, want lane %d (lanes in service order: %v)", n, lane, n%staging.LaneCount, lanesOf(hop.dsts, perLane, size))
				}
			}
			// Every ticket but the last was taken while another lane had
			// one ready, and none out of turn.
			if c := e.Counters(); c.InboundContended != staging.LaneCount*perLane-1 || c.InboundOutOfTurn != 0 {
				t.Errorf("inbound contended %d, out of turn %d; want %d and 0", c.InboundContended, c.InboundOutOfTurn, staging.LaneCount*perLane-1)
			}
			for e.RunRound() {
			}
			for i, tx := range txs {
				for range perLane {
					if _, st, ok := tx.Reap(); !ok || st != staging.CompletionOK {
						t.Fatalf("lane %d: completion ok %v status %d", i, ok, st)
					}
				}
			}
		})
	}
}

// warmRoute sends one Piece of n bytes to dst of sessRail1 on tx and runs
// e's rounds until the relay completes it.
func warmRoute(t *testing.T, e *relay.Engine, tx *staging.SenderLane, dst uint64, n int) {
	t.Helper()
	seq, ok := tx.Ticket()
	if !ok {
		t.Fatal("no credit on a fresh lane")
	}
	if err := tx.Commit(seq, sessRail1, []staging.PlanEntry{{Dst: dst, Len: uint64(n)}}, uint64(n), nil); err != nil {
		t.Fatal(err)
	}
	staging.RingDoorbell(tx.ReadyWord(seq), seq)
	if err := tx.Publish(seq); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, st, ok := tx.Reap(); ok {
			if got != seq || st != staging.CompletionOK {
				t.Fatalf("warm-up Piece: seq %d status %d, want seq %d OK", got, st, seq)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("warm-up Piece not completed")
		}
		e.RunRound()
	}
}

func lanesOf(dsts []uint64, perLane, size int) []int {
	var out []int
	for _, d := range dsts {
		out = append(out, int(d-tgtBase)/size/perLane)
	}
	return out
}
