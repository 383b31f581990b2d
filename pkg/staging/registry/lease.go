// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// PeerLink is this rank's lease on a peer (the relay): one claimed inbound
// lane of the peer, held by an open connection to the peer's arena
// socket, with this process's mappings of the claim's blocks (the sender
// block read-write, the relay block read-only) and of the lane's staging
// memory (by ShareLaneFD: that lane alone; by ShareIPCHandle: the whole
// arena). The peer's control file is never mapped: its header and the
// lane's summary are read by pread. The mappings live exactly as long as
// the claim, and while the claim stands the relay keeps its arena
// allocated.
type PeerLink struct {
	rank      *Rank
	peer      PeerInfo
	lane      int
	laneEpoch atomic.Uint64
	// ctlFd is the peer's control file, open read-only for pread; view is
	// the last copy read of it (viewMu).
	ctlFd  int
	viewMu sync.Mutex
	view   staging.ControlBlock
	// leaseFd is the claim's connection to the relay's arena socket.
	leaseFd int
	blocks  *heldBlocks
	waker   *staging.LaneWaker
	arena   staging.PeerArena
	// stagingBase is the claimed lane's staging memory in this process:
	// every address the sender forms into the relay's memory is within
	// LaneBytes of it.
	stagingBase uintptr
	// share is how the arena was mapped (staging.ShareLaneFD or
	// staging.ShareIPCHandle).
	share uint32
	// hbSeen and hbSince: the relay's heartbeat as Health last saw it
	// change, and when (MonoNanos), for a relay of another namespace.
	hbSeen  atomic.Uint64
	hbSince atomic.Int64
	// sender is the lane's endpoint, owned by whoever uses the lane.
	sender *staging.SenderLane

	mu     sync.Mutex
	closed bool
}

// read copies the peer's control block by pread into view; a short file
// (truncated by its owner) is an error, never a fault. The caller holds
// viewMu or is the link's only user.
func (l *PeerLink) read() error {
	b := unsafe.Slice((*byte)(unsafe.Pointer(&l.view)), staging.ControlSize)
	if err := folder.PreadFull(l.ctlFd, b, 0); err != nil {
		return fmt.Errorf("%w: %s: %w: %v", ErrPeerGone, l.peer.Name, errControlUnreadable, err)
	}
	return nil
}

// errControlUnreadable: a peer's control file no longer reads whole.
var errControlUnreadable = errors.New("control file unreadable")

func (l *PeerLink) closeControl() {
	if l.ctlFd >= 0 {
		unix.Close(l.ctlFd)
		l.ctlFd = -1
	}
}

// ownerStale says why a lane owner no longer holds its lease, or "" while
// it does (or that cannot be proven): its process exited or its pid was
// reused (only for an owner in this rank's PID namespace, ns), its
// registration is gone, or its heartbeat is older than the timeout and no
// process holds its liveness lock. A live owner whose heartbeat is late
// (stopped, frozen, starved) keeps its lane: its copies may still land in
// the lane's slots once it runs again.
func (r *Rank) ownerStale(owner staging.Identity, ns staging.PidNS, now int64) string {
	if ns == r.ns {
		if why := folder.GoneReason(owner.Pid, owner.StartTime); why != "" {
			return why
		}
	}
	h, err := folder.ReadHeaderFile(r.d.fd(), r.d.path, folder.RankFileName(owner), r.d.uid)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("sender %v is no longer registered", owner)
	case err != nil:
		return ""
	case !folder.HeartbeatStale(h.Heartbeat, now, r.opts.HeartbeatTimeout):
		return ""
	}
	if held, found := folder.Liveness(r.d.fd(), owner); held && found {
		return ""
	}
	return fmt.Sprintf("sender %v: heartbeat %v old and its liveness lock free", owner, time.Duration(now-int64(h.Heartbeat)).Round(time.Millisecond))
}

// Leases lists the inbound lanes of this rank whose holder holds a live
// lease. The arena is not freed while the list is not empty. It reads
// the claims under the lock under which they are made, so that a claim
// made before the rank began closing is seen here.
func (r *Rank) Leases() []int {
	var held []int
	now := staging.MonoNanos()
	r.laneMu.Lock()
	defer r.laneMu.Unlock()
	for i, c := range r.claims {
		if c != nil && r.ownerStale(c.owner, c.ns, now) == "" {
			held = append(held, i)
		}
	}
	return held
}

// LateSenders marks the inbound lanes whose sender's heartbeat is older
// than the timeout, or whose sender's registration was gone when the relay
// first looked. Such a sender keeps its lane while it lives (ownerStale),
// but its relay takes no new ticket from it until it beats again: a
// stopped or starved process may be in any state, and what it rings
// meanwhile waits. Only the pump calls it: it keeps each lane's sender's
// control file open between calls and reads the heartbeat word alone, so a
// call allocates nothing once the lanes' senders are known.
func (r *Rank) LateSenders(now int64, late *[staging.LaneCount]bool) {
	// The holders as this rank recorded them, not as its control file,
	// which any member can write, shows them.
	var owners [staging.LaneCount]staging.Identity
	var held [staging.LaneCount]bool
	r.laneMu.Lock()
	for i, c := range r.claims {
		if c != nil {
			owners[i], held[i] = c.owner, true
		}
	}
	r.laneMu.Unlock()
	for i := range owners {
		late[i] = false
		b := &r.beats[i]
		owner, ok := owners[i], held[i]
		if !ok {
			b.drop()
			continue
		}
		if !b.open || b.owner != owner {
			b.drop()
			name := folder.RankFileName(owner)
			fd, st, err := folder.OpenPrivate(r.d.fd(), r.d.path, name, unix.O_RDONLY, r.d.uid)
			if errors.Is(err, fs.ErrNotExist) {
				late[i] = true
				continue
			}
			if err != nil {
				continue
			}
			if folder.CheckControlSize(name, st.Size) != nil {
				unix.Close(fd)
				continue
			}
			b.owner, b.fd, b.open = owner, fd, true
		}
		if folder.PreadFull(b.fd, b.buf[:], heartbeatOffset) != nil {
			continue
		}
		late[i] = folder.HeartbeatStale(binary.NativeEndian.Uint64(b.buf[:]), now, r.opts.HeartbeatTimeout)
	}
}

// heartbeatOffset is where a control file holds its rank's heartbeat.
const heartbeatOffset = int64(unsafe.Offsetof(staging.ControlBlock{}.Header) + unsafe.Offsetof(staging.Header{}.Heartbeat))

// senderBeat is a relay's open control file of one inbound lane's sender
// (LateSenders).
type senderBeat struct {
	owner staging.Identity
	fd    int
	open  bool
	buf   [8]byte
}

func (b *senderBeat) drop() {
	if b.open {
		unix.Close(b.fd)
		b.open = false
	}
}

// ownsLane reports whether the lane still belongs to this link in the
// copy last read: same owner, same lane epoch.
func (l *PeerLink) ownsLane() bool {
	return l.view.Lanes[l.lane].Owned(l.rank.id, l.laneEpoch.Load())
}

// freeDeadLanes frees every inbound lane of this rank whose sender j
// proves gone, so the relay shows it free at once rather than when its
// lease's end is seen or the next sender claims it.
func (r *Rank) freeDeadLanes(j judge) {
	now := staging.MonoNanos()
	r.laneMu.Lock()
	defer r.laneMu.Unlock()
	for i, c := range r.claims {
		if c == nil {
			continue
		}
		if why := j.ownerGone(r.d, c.owner, c.ns, now); why != "" {
			r.endClaim(i, why)
			r.opts.Logger.Info("pxn freed the lane of a sender that is gone", "registry", r.d.path, "lane", i, "reason", why)
		}
	}
}

// Close unmaps the peer's arena and the claim's blocks and ends the lease
// by closing its connection, in that order. If the arena cannot be
// unmapped the lease stays, so the relay keeps its memory until this
// process exits. Lane and StagingBase are invalid afterwards. It never
// waits on another process.
func (l *PeerLink) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	r := l.rank
	r.mu.Lock()
	delete(r.links, l)
	r.mu.Unlock()
	if err := l.arena.Close(); err != nil {
		l.closeControl()
		return fmt.Errorf("pxn: unmap arena of %s: %w; lane %d stays claimed", l.peer.Name, err, l.lane)
	}
	return l.releaseLane()
}

// CloseNoWait is Close; it is kept for callers that must never wait on
// another process (the pump), which Close never does.
func (l *PeerLink) CloseNoWait() error { return l.Close() }

// releaseLane unmaps the claim's blocks and ends the lease.
func (l *PeerLink) releaseLane() error {
	var err error
	if l.blocks != nil {
		if err = l.blocks.close(); err != nil {
			err = fmt.Errorf("pxn: lane %d of %s: %w", l.lane, l.peer.Name, err)
		}
		l.blocks = nil
	}
	if l.leaseFd >= 0 {
		// Nothing of the lane is mapped any more: the relay may give it
		// to the next holder.
		sendRelease(l.leaseFd)
		unix.Close(l.leaseFd)
		l.leaseFd = -1
	}
	l.closeControl()
	return err
}

// Peer is the peer as it was listed.
func (l *PeerLink) Peer() PeerInfo { return l.peer }

// ArenaShare says how the peer's arena was mapped: staging.ShareLaneFD (a
// descriptor of the lane alone from the peer's arena socket) or
// staging.ShareIPCHandle (the whole arena).
func (l *PeerLink) ArenaShare() uint32 { return l.share }

// LaneIndex is the claimed lane of the peer.
func (l *PeerLink) LaneIndex() int { return l.lane }

// LaneEpoch is the lane's epoch under this claim; every Desc carries it.
func (l *PeerLink) LaneEpoch() uint64 { return l.laneEpoch.Load() }

// Sender is the endpoint of the claimed lane, valid until Close.
func (l *PeerLink) Sender() *staging.SenderLane { return l.sender }

// Wake is the wake of the peer's pump through the claim's eventfd, valid
// until Close.
func (l *PeerLink) Wake() *staging.LaneWaker { return l.waker }

// StagingBase is the claimed lane's staging memory as mapped in this
// process: slot s starts at StagingBase() + s*SlotSize, and the lane ends
// LaneBytes after it.
func (l *PeerLink) StagingBase() uintptr { return l.stagingBase }

// Live returns nil while the peer is READY with a fresh heartbeat at now
// (a MonoNanos reading) and the lane is still this link's; otherwise an
// ErrPeerGone saying which. It reads the peer's control file by pread
// and allocates nothing on success.
func (l *PeerLink) Live(now int64) error {
	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	return l.live(now)
}

func (l *PeerLink) live(now int64) error {
	if err := l.read(); err != nil {
		return err
	}
	h := &l.view.Header
	if s := h.State; s != staging.StateReady {
		return fmt.Errorf("%w: %s is %s", ErrPeerGone, l.peer.Name, folder.StateName(s))
	}
	if folder.HeartbeatStale(h.Heartbeat, now, l.rank.opts.HeartbeatTimeout) {
		return fmt.Errorf("%w: %s heartbeat older than %v", ErrPeerGone, l.peer.Name, l.rank.opts.HeartbeatTimeout)
	}
	if !l.ownsLane() {
		return fmt.Errorf("%w: lane %d of %s was reclaimed", ErrPeerGone, l.lane, l.peer.Name)
	}
	return nil
}

// heartbeatGone judges a relay of another PID namespace by the heartbeat
// this link sees: gone once it has held one value for longer than the
// timeout (see judge).
func (l *PeerLink) heartbeatGone(hb uint64, now int64) string {
	if hb != l.hbSeen.Load() || l.hbSince.Load() == 0 {
		l.hbSeen.Store(hb)
		l.hbSince.Store(now)
	}
	j := judge{timeout: l.rank.opts.HeartbeatTimeout, obs: linkObserver{l}, d: l.rank.d}
	return j.heartbeatGone(l.peer.Identity, hb, l.peer.PidNS, now)
}

type linkObserver struct{ l *PeerLink }

func (o linkObserver) unchangedSince(_ staging.Identity, hb uint64) (int64, bool) {
	return o.l.hbSince.Load(), hb == o.l.hbSeen.Load()
}

// ErrPeerStale is wrapped by Health when the relay's heartbeat is late but
// nothing shows it gone: published tickets may still complete.
var ErrPeerStale = errors.New("peer heartbeat is late")

// ErrPeerClosing is wrapped by Health when the relay is closing but still
// runs and the lane is still ours: it takes no new tickets, completes or
// fails the published ones, and waits for the lane to be released.
var ErrPeerClosing = errors.New("peer is closing")

// Health is Live, except that a relay whose only fault is a late heartbeat
// (its process still runs, its header is READY and the lane still ours)
// returns an error wrapping ErrPeerStale instead of ErrPeerGone, and one
// that is closing (still running, the lane still ours) one wrapping
// ErrPeerClosing. A sender stops giving such a relay new tickets and keeps
// waiting for published ones. It takes no lock; it reads /proc only when
// the heartbeat is late or the relay is closing, and only for a relay of
// this rank's PID namespace: one of another is never judged by its pid.
func (l *PeerLink) Health(now int64) error {
	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	err := l.live(now)
	if err == nil {
		return nil
	}
	if errors.Is(err, errControlUnreadable) {
		return err
	}
	state := l.view.Header.State
	if (state != staging.StateReady && state != staging.StateClosing) || !l.ownsLane() {
		return err
	}
	if l.peer.PidNS == l.rank.ns {
		if r := folder.GoneReason(l.peer.Pid, l.peer.StartTime); r != "" {
			return fmt.Errorf("%w: %s: %s", ErrPeerGone, l.peer.Name, r)
		}
	} else if r := l.heartbeatGone(l.view.Header.Heartbeat, now); r != "" {
		return fmt.Errorf("%w: %s: %s", ErrPeerGone, l.peer.Name, r)
	}
	if state == staging.StateClosing {
		return fmt.Errorf("%w: %s", ErrPeerClosing, l.peer.Name)
	}
	return fmt.Errorf("%w: %s heartbeat older than %v", ErrPeerStale, l.peer.Name, l.rank.opts.HeartbeatTimeout)
}
