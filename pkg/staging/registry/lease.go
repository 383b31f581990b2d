// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
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
// lane of the peer, and this process's mappings of the peer's control file
// and of the lane's staging memory (by ShareLaneFD: that lane alone; by
// ShareIPCHandle: the whole arena). The mappings live exactly
// as long as the claim, and while the claim stands the relay keeps its
// arena allocated.
type PeerLink struct {
	rank      *Rank
	peer      PeerInfo
	lane      int
	laneEpoch atomic.Uint64
	ctlMem    []byte
	ctl       *staging.ControlBlock
	arena     staging.PeerArena
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

// Leases lists the inbound lanes of this rank whose owner holds a live
// lease. The arena is not freed while the list is not empty.
func (r *Rank) Leases() []int {
	var held []int
	now := staging.MonoNanos()
	for i := range r.ctl.Lanes {
		owner, ok := r.ctl.Lanes[i].Owner.Load()
		if ok && r.ownerStale(owner, r.ctl.Lanes[i].Owner.LoadNS(), now) == "" {
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
	for i := range r.ctl.Lanes {
		late[i] = false
		b := &r.beats[i]
		owner, ok := r.ctl.Lanes[i].Owner.Load()
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

// ownsLane reports whether the lane still belongs to this link: same owner,
// same lane epoch.
func (l *PeerLink) ownsLane() bool {
	return l.ctl.Lanes[l.lane].Owned(l.rank.id, l.laneEpoch.Load())
}

// release frees the lane if this link still owns it.
func (l *PeerLink) release(ctx context.Context) error {
	return l.rank.d.withLock(ctx, l.freeLane)
}

// freeDeadLanes frees every inbound lane of this rank whose sender j proves
// gone, so the relay shows it free at once rather than when the next
// sender claims it. Second-hop completions still in flight land in the
// lane's old ring, which a new claim resets. The caller holds the registry
// lock.
func (r *Rank) freeDeadLanes(j judge) {
	now := staging.MonoNanos()
	for i := range r.ctl.Lanes {
		lane := &r.ctl.Lanes[i]
		owner, held := lane.Owner.Load()
		if !held {
			continue
		}
		if why := j.ownerGone(r.d, owner, lane.Owner.LoadNS(), now); why != "" {
			lane.Free()
			r.opts.Logger.Info("pxn freed the lane of a sender that is gone", "registry", r.d.path, "lane", i, "reason", why)
		}
	}
}

// releaseBounded is release with its own bound on the lock wait, for paths
// that must release whatever their caller's context says.
func (l *PeerLink) releaseBounded() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.rank.opts.DrainTimeout)
	defer cancel()
	if err := l.release(ctx); err != nil {
		return fmt.Errorf("pxn: release lane %d of %s: %w", l.lane, l.peer.Name, err)
	}
	return nil
}

// Close unmaps the peer's arena, releases the lane and unmaps the peer's
// control file, in that order. If the arena cannot be unmapped the lane
// stays claimed, so the relay keeps its memory until this process is stale.
// Lane and StagingBase are invalid afterwards.
func (l *PeerLink) Close() error { return l.close(true) }

// CloseNoWait is Close for a caller that must never wait on another
// process (the pump): when the registry lock is busy, the lane's release
// and the control file's unmap are left to the rank's next TryAppendPeers
// or its Close.
func (l *PeerLink) CloseNoWait() error { return l.close(false) }

func (l *PeerLink) close(wait bool) error {
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
		err = fmt.Errorf("pxn: unmap arena of %s: %w; lane %d stays claimed", l.peer.Name, err, l.lane)
		return errors.Join(err, l.unmapControl())
	}
	return l.releaseLane(wait)
}

// releaseLane frees the lane and unmaps the peer's control file. Without
// wait, a busy lock queues the link on its rank instead, mapping and claim
// kept, for flushReleases.
func (l *PeerLink) releaseLane(wait bool) error {
	r := l.rank
	if !wait {
		err := r.d.tryLock(l.freeLane)
		if err == ErrLockBusy {
			r.mu.Lock()
			r.unreleased = append(r.unreleased, l)
			r.mu.Unlock()
			return nil
		}
		if err != nil {
			err = fmt.Errorf("pxn: release lane %d of %s: %w", l.lane, l.peer.Name, err)
		}
		return errors.Join(err, l.unmapControl())
	}
	return errors.Join(l.releaseBounded(), l.unmapControl())
}

// freeLane frees the lane if this link still owns it. The caller holds the
// registry lock.
func (l *PeerLink) freeLane() error {
	if l.ownsLane() {
		l.ctl.Lanes[l.lane].Free()
	}
	return nil
}

func (l *PeerLink) unmapControl() error {
	err := unix.Munmap(l.ctlMem)
	l.ctl, l.ctlMem = nil, nil
	if err != nil {
		return fmt.Errorf("pxn: unmap control file of %s: %w", l.peer.Name, err)
	}
	return nil
}

// flushReleases releases the lanes that CloseNoWait left claimed, waiting
// for the lock with wait set and only if it is free at once otherwise. A
// busy lock keeps them for a later call.
func (r *Rank) flushReleases(ctx context.Context, wait bool) error {
	r.mu.Lock()
	ls := r.unreleased
	r.unreleased = nil
	r.mu.Unlock()
	if len(ls) == 0 {
		return nil
	}
	err := r.d.lockFor(ctx, wait, func() error {
		for _, l := range ls {
			l.freeLane()
		}
		return nil
	})
	if err != nil {
		r.mu.Lock()
		r.unreleased = append(ls, r.unreleased...)
		r.mu.Unlock()
		if err == ErrLockBusy {
			return nil
		}
		return fmt.Errorf("pxn: release %d lanes of closed links: %w", len(ls), err)
	}
	var errs []error
	for _, l := range ls {
		errs = append(errs, l.unmapControl())
	}
	return errors.Join(errs...)
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

// Rollover gives the lane a new epoch, under the registry lock, when its
// seqs ran out (LaneSeq.NeedsRollover). The sender drains the lane first and
// restarts at seq 1 under the returned epoch; the relay notices the new
// epoch on its own. Call it from the goroutine that uses the lane.
func (l *PeerLink) Rollover(ctx context.Context) (uint64, error) {
	if !l.sender.Drained() {
		return 0, fmt.Errorf("pxn: roll lane %d of %s over: %w: published %d, reaped %d", l.lane, l.peer.Name, staging.ErrLaneNotDrained, l.sender.Published(), l.sender.Reaped())
	}
	var epoch uint64
	err := l.rank.d.withLock(ctx, func() error {
		if !l.ownsLane() {
			return fmt.Errorf("%w: lane %d of %s was reclaimed", ErrPeerGone, l.lane, l.peer.Name)
		}
		lane := &l.ctl.Lanes[l.lane]
		var err error
		if epoch, err = newLaneEpoch(lane); err != nil {
			return err
		}
		lane.Renew(epoch)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("pxn: roll lane %d of %s over: %w", l.lane, l.peer.Name, err)
	}
	l.laneEpoch.Store(epoch)
	if err := l.sender.Rollover(epoch); err != nil {
		return 0, fmt.Errorf("pxn: roll lane %d of %s over: %w", l.lane, l.peer.Name, err)
	}
	return epoch, nil
}

// Sender is the endpoint of the claimed lane, valid until Close.
func (l *PeerLink) Sender() *staging.SenderLane { return l.sender }

// Wake is the peer's wake word as mapped in this process, valid until
// Close.
func (l *PeerLink) Wake() *staging.WakeWord { return &l.ctl.Header.Wake }

// StagingBase is the claimed lane's staging memory as mapped in this
// process: slot s starts at StagingBase() + s*SlotSize, and the lane ends
// LaneBytes after it.
func (l *PeerLink) StagingBase() uintptr { return l.stagingBase }

// Live returns nil while the peer is READY with a fresh heartbeat at now
// (a MonoNanos reading) and the lane is still this link's; otherwise an
// ErrPeerGone saying which. It allocates nothing on success.
func (l *PeerLink) Live(now int64) error {
	h := &l.ctl.Header
	if s := h.LoadState(); s != staging.StateReady {
		return fmt.Errorf("%w: %s is %s", ErrPeerGone, l.peer.Name, folder.StateName(s))
	}
	if hb := h.LoadHeartbeat(); folder.HeartbeatStale(hb, now, l.rank.opts.HeartbeatTimeout) {
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
func (l *PeerLink) heartbeatGone(now int64) string {
	hb := l.ctl.Header.LoadHeartbeat()
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
	err := l.Live(now)
	if err == nil {
		return nil
	}
	state := l.ctl.Header.LoadState()
	if (state != staging.StateReady && state != staging.StateClosing) || !l.ownsLane() {
		return err
	}
	if l.peer.PidNS == l.rank.ns {
		if r := folder.GoneReason(l.peer.Pid, l.peer.StartTime); r != "" {
			return fmt.Errorf("%w: %s: %s", ErrPeerGone, l.peer.Name, r)
		}
	} else if r := l.heartbeatGone(now); r != "" {
		return fmt.Errorf("%w: %s: %s", ErrPeerGone, l.peer.Name, r)
	}
	if state == staging.StateClosing {
		return fmt.Errorf("%w: %s", ErrPeerClosing, l.peer.Name)
	}
	return fmt.Errorf("%w: %s heartbeat older than %v", ErrPeerStale, l.peer.Name, l.rank.opts.HeartbeatTimeout)
}
