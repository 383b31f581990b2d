// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"context"
	"errors"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
)

// Peer is another usable rank of the group as the registry reports it.
type Peer struct {
	Pid   int
	Epoch uint64
	Rail  string
	HCA   string
}

// Health is what a sender knows of the relay behind one of its lanes.
type Health int

const (
	// Live: new tickets may go to the relay.
	Live Health = iota
	// Stale: the relay's heartbeat is older than the timeout. No new
	// tickets go to it; published ones still complete.
	Stale
	// Gone: the relay exited, restarted (new epoch), or the lane was
	// taken from us. Published tickets fail.
	Gone
	// Closing: the relay is closing gracefully. No new tickets go to it;
	// it completes or fails the published ones, and the sender releases
	// the lane as soon as none is left.
	Closing
)

// Link is a sender's claim of one inbound lane on a relay, with the
// claim's blocks and the lane's staging memory mapped. Everything it points
// to stays valid until Close.
type Link interface {
	// Sender is the lane's endpoint: the pump publishes and reaps through
	// it, and no one else uses it.
	Sender() *staging.SenderLane
	LaneIndex() int
	// Staging is the local address of the lane's first slot in the relay's
	// arena as mapped by this process.
	Staging() uintptr
	// Health reads the relay's liveness from its control file.
	Health(now time.Time) Health
	// Wake wakes the relay's pump, through the lane's eventfd, after the
	// sender published a ticket.
	Wake() Waker
	// Close releases the claim. It never waits on another process: a
	// release that needs a busy lock is finished later by the registry.
	Close() error
}

// Waker wakes a pump; it reports whether it made a system call (the pump
// had announced its sleep).
type Waker interface {
	Wake() bool
}

// Waiter is a pump's sleep and its process's wake of it, with the rule of
// staging.WakeWord: Announce, check for work once more, then Sleep (or
// Retract when work was found); a waker makes its work visible, then
// calls Wake. *staging.WakeWord and *staging.EventWaiter are Waiters.
type Waiter interface {
	Waker
	Announce() uint32
	Retract()
	Sleep(seen uint32, timeout time.Duration) (woken bool)
}

// ArenaSharer is a Link that says how the relay's arena was mapped:
// staging.ShareLaneFD (a descriptor of the lane alone from the relay's
// arena socket) or staging.ShareIPCHandle (the whole arena).
type ArenaSharer interface {
	ArenaShare() uint32
}

// Registry is what the engine needs of its rank in the shared-memory
// registry: the endpoints of its own inbound lanes (the relay side), the
// peers, and lane claims on them (the sender side). It is used by the pump
// only, except Close.
type Registry interface {
	// Inbound is the relay endpoint of inbound lane i, 0 ≤ i < LaneCount.
	Inbound(i int) *staging.RelayLane
	// ArenaBase is the local address of this rank's own staging arena.
	ArenaBase() uintptr
	// Wake is what the pump sleeps on: the engine's callers wake it
	// through it, the senders of other ranks through their lanes'
	// eventfds. Nil: the engine keeps a wake word of its own.
	Wake() Waiter
	Heartbeat(now time.Time)
	// Peers lists the other ranks of the group. The slice stays valid
	// until the next call of Peers, which may reuse it. It fails with an
	// error wrapping ErrTooManyPeers when more than LaneCount are valid.
	// It never waits on another process: housekeeping that needs a lock
	// held elsewhere is left for a later call.
	Peers() ([]Peer, error)
	// Attach claims a lane on p. It never waits on another process: a
	// relay's answer not in yet, or a relay that has not yet seen this
	// rank's earlier lease end, fails it with an error wrapping
	// ErrRegistryBusy, and the pump tries again at a later refresh.
	Attach(p Peer) (Link, error)
	// BeginClose tells the group that this rank is closing, before its
	// pump drains: senders publish no new tickets to it and release their
	// lanes once their published tickets have completed.
	BeginClose()
	// Leased reports whether a live sender still holds one of this rank's
	// inbound lanes. It reads the lanes' owners, and /proc for each.
	Leased() bool
	Close(ctx context.Context) error
}

// StatsPublisher is a Registry that carries the rank's counters to readers
// outside the process (the node agent's metrics, inspect). The pump fills
// st and calls PublishStats with its heartbeat, never more often; it must
// not wait on anything.
type StatsPublisher interface {
	PublishStats(st *staging.RankStats)
}

// LateSenders is a Registry that knows whether the senders of its inbound
// lanes still beat. The pump asks with its heartbeat and takes no new
// ticket from a lane marked late until its sender beats again; Pieces
// already taken go on. It must not wait on anything.
type LateSenders interface {
	LateSenders(late *[staging.LaneCount]bool)
}

// ErrRegistryBusy means a registry operation needed a lock that another
// process holds; the pump never waits for it and tries again later.
var ErrRegistryBusy = errors.New("registry busy")

// ErrTooManyPeers means the group holds more valid ranks than a relay has
// lanes: PXN turns off for this process and everything goes direct.
var ErrTooManyPeers = errors.New("more valid peers than inbound lanes")
