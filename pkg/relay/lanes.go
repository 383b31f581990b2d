// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/staging"
)

// outLane is the part of an outbound lane that callers reach: the relay it
// leads to, the queue of groups that Submit fills, and whether it takes
// them. The rest of the lane is the sender's (senderLane).
type outLane struct {
	peer Peer

	mu    sync.Mutex
	queue fifo[*group]
	// pieces counts the Pieces planned for this lane that have not been
	// finished or handed to the direct path.
	pieces atomic.Int64
	// reaps counts the completions the pump reaped on this lane; a group
	// notes it when queued (group.reaps).
	reaps atomic.Uint64

	// stale stops new tickets (heartbeat timeout); gone ends the lane.
	stale atomic.Bool
	gone  atomic.Bool
}

func (ol *outLane) accepting() bool { return !ol.stale.Load() && !ol.gone.Load() }

// enqueue queues g's Pieces and reports true, or reports false when the
// pump has retired the lane since Submit chose it: retire sets gone before
// it drains the queue under mu, so nothing is queued on a lane nobody serves.
func (ol *outLane) enqueue(g *group) bool {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.gone.Load() {
		return false
	}
	g.reaps = ol.reaps.Load()
	ol.queue.push(g)
	return true
}

// front returns the next Piece to publish; g is nil when none is queued.
func (ol *outLane) front() pieceRef {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.queue.len() == 0 {
		return pieceRef{}
	}
	g := *ol.queue.front()
	return pieceRef{g: g, i: g.next}
}

// pop takes the front Piece off the queue.
func (ol *outLane) pop() {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	g := *ol.queue.front()
	g.next++
	if g.next == len(g.plan.Pieces) {
		ol.queue.pop()
	}
}

// drainTo hands every queued Piece to fb, as gone direct for why.
func (ol *outLane) drainTo(fb *fallbackQueue, why fallbackReason) {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	for ol.queue.len() > 0 {
		g := ol.queue.pop()
		for i, n := g.next, len(g.plan.Pieces); i < n; i++ {
			fb.push(fallbackPiece{g: g, i: i, reason: why})
		}
	}
}

func (ol *outLane) queued() bool {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	return ol.queue.len() > 0
}

// slotPieces is what one published slot carries: the Piece published into
// it first (refs[0], whose times the slot's are) and the Pieces that joined
// it there (sender.join); empty while the slot holds nothing. unproven
// counts the joined Pieces that hold a ticket's credit (sender.held).
type slotPieces struct {
	refs     []pieceRef
	unproven int
}

// bytes is the slot's bytes.
func (sp *slotPieces) bytes() uint64 {
	var n uint64
	for _, pr := range sp.refs {
		n += pr.g.pieceLen(pr.i)
	}
	return n
}

// pieces is how many Pieces the slot carries.
func (sp *slotPieces) pieces() uint64 { return uint64(len(sp.refs)) }

// clear empties the slot and keeps its vector's memory.
func (sp *slotPieces) clear() {
	clear(sp.refs)
	sp.refs, sp.unproven = sp.refs[:0], 0
}

// senderLane is the sender's own state of one outbound lane: the claim, the
// lane's endpoint and the Pieces in its slots. Only the pump touches it.
type senderLane struct {
	*outLane
	link Link
	tx   *staging.SenderLane
	// relayWake wakes the relay, after each Publish.
	relayWake Waker
	inflight  [staging.SlotsPerLane]slotPieces
	broken    bool
	waitSince time.Time
	// progressAt is when the oldest published ticket became the oldest:
	// published, or the one before it reaped.
	progressAt time.Time
	unreg      func() error
	// copierLane is the lane this one's first-hop copies go on in the
	// copier (Copier.Copy): unique among this rank's outbound lanes. It is
	// not the lane's index at its relay, which two relays may both have
	// given this rank, and two outbound lanes on one copier lane would
	// share its streams and its gather plans slot by slot.
	copierLane int
	// keepClaim keeps a retired lane's claim until stop.
	keepClaim bool
}

func (sl *senderLane) release(log klog.Logger) {
	if sl.unreg != nil {
		if err := sl.unreg(); err != nil {
			log.Error(err, "unregistering a relay's lane", "relayPid", sl.peer.Pid)
		}
		sl.unreg = nil
	}
	if err := sl.link.Close(); err != nil {
		log.Error(err, "releasing lane", "relayPid", sl.peer.Pid)
	}
}
