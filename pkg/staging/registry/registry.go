// SPDX-License-Identifier: Apache-2.0

// Package registry is how the ranks of one job on one node find each other:
// a private directory per group, a control file per rank (the shared-memory
// ABI of package staging) and a staging arena, published READY once whole.
// A Rank lists its peers, claims a lane on a peer (PeerLink, which hands out
// the lane's staging.SenderLane) and hands out the staging.RelayLane of each
// of its own inbound lanes. See docs/registry.md.
package registry

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

const (
	// heartbeatPeriod is how often Heartbeat stamps the control file.
	heartbeatPeriod = 100 * time.Millisecond
	// registryHeartbeatTimeout and registryDrainTimeout are the defaults of
	// Options.HeartbeatTimeout and Options.DrainTimeout.
	registryHeartbeatTimeout = 3000 * time.Millisecond
	registryDrainTimeout     = 10 * time.Second
	// leasePoll is how often Close looks at its inbound lanes while it
	// waits for their leases to end.
	leasePoll = 10 * time.Millisecond
)

var (
	// ErrTooManyPeers: the group holds more valid ranks than a relay has
	// lanes. PXN is off for the process that sees it; it sends direct.
	ErrTooManyPeers = errors.New("more valid peers than a relay has lanes")
	// ErrNoFreeLane: every lane of the peer is held by a live sender.
	ErrNoFreeLane = errors.New("no free lane on the peer")
	// ErrLaneHeld: the peer still counts a lane as this rank's: its
	// earlier lease has not ended, or the peer has not seen it end yet
	// (the release is on its way). The caller asks again later.
	ErrLaneHeld = errors.New("this rank still holds a lane of the peer")
	// ErrPeerGone: the peer revoked READY, restarted or disappeared.
	ErrPeerGone = errors.New("peer is closing or gone")
	// ErrLeaseHeld: Close gave up waiting for live senders to release
	// their lanes; the arena stays allocated until the process exits.
	ErrLeaseHeld = errors.New("inbound lanes are still leased")
	// ErrRankClosed: the Rank was closed.
	ErrRankClosed = errors.New("rank is closed")
	// ErrLockBusy: a no-wait call (TryAppendPeers) found the registry lock
	// held by someone else and did nothing that needs it; the caller tries
	// again later.
	ErrLockBusy = errors.New("registry lock is busy")
)

// Options configures Register.
type Options struct {
	// Root holds the group directories (MC_PXN_REGISTRY_ROOT).
	Root string
	// Group names the job (MC_PXN_GROUP_ID).
	Group string
	// UID must be the process's effective uid: the directory is named after
	// it, and everything in it must be owned by it.
	UID int
	// Rail is this rank's canonical rail, 1..48 bytes; HCA its NIC, up to
	// 56 bytes.
	Rail string
	HCA  string
	// HeartbeatTimeout makes a peer (and a lane owner) stale when its
	// heartbeat is older; default 3 s, at least 200 ms.
	HeartbeatTimeout time.Duration
	// DrainTimeout bounds how long Close waits for senders to release the
	// lanes they hold on this rank; default 10 s.
	DrainTimeout time.Duration
	// Arenas allocates this rank's arena and maps peers'; default
	// HostArenas.
	Arenas staging.ArenaProvider
	// Memory, when set, registers the arena with the NIC after allocation.
	Memory staging.MemoryRegistrar
	// NoArenaSocket keeps the rank from handing out descriptors of its
	// arena's lanes even when the arena can: peers then map it by its
	// handle only. The arena socket still serves claims, which is the
	// only way to a lane.
	NoArenaSocket bool
	// Device names the memory the arena lives in, up to 48 bytes (a GPU's
	// PCI bus id or UUID), for the rank's counters block. Empty: the
	// provider's name for it (DeviceNamer), else "host" for host memory.
	Device string
	// Logger receives the registry's few log lines (one per event: a rank
	// published, PXN turned off, a peer refused, a lane reclaimed); the
	// zero Logger discards them.
	Logger klog.Logger
}

func (o *Options) fill() error {
	switch {
	case o.Root == "":
		return errors.New("registry root is empty")
	case o.UID != os.Geteuid():
		return fmt.Errorf("uid %d is not the effective uid %d", o.UID, os.Geteuid())
	case o.Rail == "" || len(o.Rail) > len(staging.Header{}.Rail) || strings.IndexByte(o.Rail, 0) >= 0:
		return fmt.Errorf("rail %q: want 1..%d bytes, no NUL", o.Rail, len(staging.Header{}.Rail))
	case len(o.HCA) > len(staging.Header{}.HCA) || strings.IndexByte(o.HCA, 0) >= 0:
		return fmt.Errorf("HCA %q: want at most %d bytes, no NUL", o.HCA, len(staging.Header{}.HCA))
	case o.HeartbeatTimeout < 0 || o.HeartbeatTimeout > 0 && o.HeartbeatTimeout < 2*heartbeatPeriod:
		return fmt.Errorf("heartbeat timeout %v: want at least %v", o.HeartbeatTimeout, 2*heartbeatPeriod)
	case o.DrainTimeout < 0:
		return fmt.Errorf("drain timeout %v is negative", o.DrainTimeout)
	case len(o.Device) > len(staging.RankStats{}.Device) || strings.IndexByte(o.Device, 0) >= 0:
		return fmt.Errorf("device %q: want at most %d bytes, no NUL", o.Device, len(staging.RankStats{}.Device))
	}
	if err := checkGroupName(o.Group); err != nil {
		return err
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = registryHeartbeatTimeout
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = registryDrainTimeout
	}
	if o.Arenas == nil {
		o.Arenas = HostArenas{}
	}
	return nil
}

// Rank is this process's registration in its group: the registry
// directory, the staging arena and the control file that peers map.
type Rank struct {
	id staging.Identity
	// ns is the PID namespace id's pid and start time belong to.
	ns    staging.PidNS
	opts  Options
	d     *registryDir
	arena staging.Arena
	// ctl points into ctlMem, memory of this process alone; flushControl
	// writes it through ctlFd into the control file, where other processes
	// read it by pread: the header's State and Heartbeat, the counters and
	// the lane summaries.
	ctlMem      []byte
	ctl         *staging.ControlBlock
	ctlFd       int
	flushFailed atomic.Bool
	// liveFd is the control file, open from its creation until it is
	// removed, holding the rank's liveness lock (folder.HoldLiveness).
	liveFd int
	// inbound are the relay endpoints of this rank's lanes; their user
	// (the pump) owns them, and claims are offered to them.
	inbound [staging.LaneCount]*staging.RelayLane
	// waiter is the pump's sleep over its own eventfd and its lanes'.
	waiter *staging.EventWaiter
	// laneMu guards claims, the record of who holds each inbound lane,
	// and the owner words of the lane summaries; only this process
	// writes them.
	laneMu sync.Mutex
	claims [staging.LaneCount]*inboundClaim
	// lanesClosed: Close is about to free what the claims use; nothing
	// ends a claim afterwards.
	lanesClosed bool
	// accepting: the rank is READY and takes claims. The header's state
	// says the same to peers, but the header is in a file any member can
	// write; claims are decided by this word alone.
	accepting bool
	// laneArena hands out the lanes' staging memory with their claims;
	// nil when peers map the arena by its handle. renewer is laneArena
	// when it can give a lane new memory, else nil.
	laneArena staging.LaneFDArena
	renewer   staging.LaneRenewer
	// granted marks the lanes handed out at least once: a claim of one of
	// them brings new staging memory (renewer). retired says why a lane
	// is never granted again, "" for a usable one. registered marks the
	// lanes registered with Options.Memory. All three under laneMu.
	granted    [staging.LaneCount]bool
	retired    [staging.LaneCount]string
	registered [staging.LaneCount]bool
	// undo holds the teardown of each completed init step, in order.
	// Register and Close run it backwards from one goroutine.
	undo        []func() error
	quarantined atomic.Bool
	lastBeat    atomic.Int64
	// server decides claims of this rank's lanes.
	server *arenaServer

	mu      sync.Mutex
	closed  bool
	off     error
	links   map[*PeerLink]struct{}
	refused map[string]bool
	// shareSaid names the peers whose arena mapping was logged;
	// importFailed holds, per peer, why its arena could not be mapped
	// the way it should be: that peer is not attached to again.
	shareSaid    map[string]bool
	importFailed map[string]error
	// pending are attaches waiting for a peer's answer.
	pending map[staging.Identity]*pendingAttach

	// scanMu serializes Peers calls and guards what they keep in scan.
	scanMu sync.Mutex
	scan   peerScan

	// beats are the inbound lanes' senders' control files, open for
	// LateSenders; only the pump uses them, and Close closes them.
	beats [staging.LaneCount]senderBeat

	// hooks is nil in production.
	hooks *hooks
}

// ServeStats counts what this rank's arena socket did; zero when it
// serves none.
func (r *Rank) ServeStats() ServeStats {
	if r.server == nil {
		return ServeStats{}
	}
	return r.server.stats()
}

// Identity is this registration's identity.
func (r *Rank) Identity() staging.Identity { return r.id }

// Name is the published name of this rank's control file.
func (r *Rank) Name() string { return folder.RankFileName(r.id) }

// Dir is the path of the group's registry directory.
func (r *Rank) Dir() string { return r.d.path }

// Inbound is the relay endpoint of this rank's inbound lane i, valid until
// Close. One goroutine (the pump) uses it.
func (r *Rank) Inbound(i int) *staging.RelayLane { return r.inbound[i] }

// Header is this rank's header inside Control.
func (r *Rank) Header() *staging.Header { return &r.ctl.Header }

// Wake is the pump's sleep and this process's wake of it: its own
// eventfd and its lanes' (staging.EventWaiter).
func (r *Rank) Wake() *staging.EventWaiter { return r.waiter }

// Arena is this rank's staging arena, freed by Close.
func (r *Rank) Arena() staging.Arena { return r.arena }

// Heartbeat stamps the header with now, a MonoNanos reading, unless the last
// stamp is younger than 100 ms; it reports whether it wrote. The pump calls
// it every round, never concurrently with or after Close.
func (r *Rank) Heartbeat(now int64) bool {
	if now-r.lastBeat.Load() < int64(heartbeatPeriod) {
		return false
	}
	r.copyLaneProgress()
	r.beat(now)
	return true
}

// beat stamps the heartbeat and writes the control block into the file.
func (r *Rank) beat(now int64) {
	r.lastBeat.Store(now)
	r.ctl.Header.StoreHeartbeat(uint64(now))
	r.flushControl()
}

// copyLaneProgress copies the progress words of the claims the pump
// follows into the lane summaries, for inspect: a claim's, held or since
// released, until the lane's next claim. Only the pump calls it.
func (r *Rank) copyLaneProgress() {
	for i, l := range r.inbound {
		if w := l.Words(); w != nil && w.Epoch == r.ctl.Lanes[i].Epoch() {
			r.ctl.Lanes[i].CopyProgress(w.Sender, w.Relay)
		}
	}
}

// Off returns why PXN is off for this process (an unsafe registry, more
// valid peers than lanes), or nil while it is on.
func (r *Rank) Off() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.off
}

// turnOff records the first reason PXN goes off, says so once, and returns
// that first reason.
func (r *Rank) turnOff(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.off == nil {
		r.off = err
		r.opts.Logger.Error(err, "PXN off for this process, sending direct", "registry", r.d.path, "rank", r.Name())
	}
	return r.off
}

func (r *Rank) usable() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrRankClosed
	}
	return r.off
}
