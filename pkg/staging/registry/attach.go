// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// Attach claims a lane on peer and maps its control file and arena. The
// peer is re-read and re-validated under the registry lock, the same lock
// under which a closing relay revokes READY: a relay that began closing is
// never attached to. A lane whose owner is stale is reclaimed. The link is
// closed by PeerLink.Close or by the rank's Close.
func (r *Rank) Attach(ctx context.Context, peer PeerInfo) (*PeerLink, error) {
	return r.attach(ctx, peer, true)
}

// TryAttach is Attach for a caller that must never wait on another process
// (the pump): when the registry lock is not free at once it claims nothing
// and returns an error wrapping ErrLockBusy, and the caller tries again
// later. A claim it must undo is released the same way (see CloseNoWait).
func (r *Rank) TryAttach(peer PeerInfo) (*PeerLink, error) {
	return r.attach(context.Background(), peer, false)
}

func (r *Rank) attach(ctx context.Context, peer PeerInfo, wait bool) (*PeerLink, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	if peer.Refused != nil {
		return nil, peer.Refused
	}
	name := folder.RankFileName(peer.Identity)
	if peer.Identity == r.id {
		return nil, fmt.Errorf("pxn: attach to %s: a rank has no lane on itself", name)
	}
	if p := r.takePending(peer.Identity); p != nil {
		return r.finishPending(ctx, p, wait)
	}
	r.mu.Lock()
	failed := r.importFailed[name]
	r.mu.Unlock()
	if failed != nil {
		return nil, failed
	}
	l := &PeerLink{rank: r, peer: peer}
	var h staging.Header
	err := r.d.lockFor(ctx, wait, func() error {
		mem, err := folder.MapPrivate(r.d.fd(), r.d.path, name, r.d.uid, int(staging.ControlSize), true)
		if errors.Is(err, fs.ErrNotExist) {
			return ErrPeerGone
		}
		if err != nil {
			return err
		}
		ctl := (*staging.ControlBlock)(unsafe.Pointer(&mem[0]))
		h, err = r.checkRelay(ctl, peer.Identity)
		if err == nil && !r.canMap(h.ArenaShares) {
			err = fmt.Errorf("%w: the relay offers its arena by %s", errNoWayToMap, sharesNames(h.ArenaShares))
		}
		var epoch uint64
		if err == nil {
			l.lane, epoch, err = r.claimLane(ctl, name)
		}
		if err == nil {
			l.sender, err = staging.NewSenderLane(&ctl.Lanes[l.lane], epoch)
		}
		if err != nil {
			unix.Munmap(mem)
			return err
		}
		l.ctlMem, l.ctl = mem, ctl
		l.laneEpoch.Store(epoch)
		return nil
	})
	if err != nil {
		err = fmt.Errorf("pxn: attach to %s: %w", name, err)
		if errors.Is(err, errNoWayToMap) {
			r.importFailure(name, err)
		}
		return nil, err
	}
	// The claim is the lease: the relay keeps its arena while it stands, so
	// the arena can be mapped outside the lock. The relay's socket checks
	// the claim before it hands out a descriptor.
	p := &pendingAttach{link: l, handle: h.IPCHandle, shares: h.ArenaShares}
	if r.byLane(h.ArenaShares) {
		q := fdRequest{Lane: uint32(l.lane), SenderEpoch: r.id.Epoch, LaneEpoch: l.laneEpoch.Load()}
		// Only in one PID namespace does the socket's pid name the relay.
		relayPid := 0
		if folder.HeaderNS(&h) == r.ns {
			relayPid = peer.Identity.Pid
		}
		p.client, p.fdErr = dialArenaSocket(r.d, folder.SockFileName(peer.Identity), q, relayPid, staging.MonoNanos())
		if p.fdErr == nil {
			return r.finishPending(ctx, p, wait)
		}
	}
	return r.mapByHandle(p, wait)
}

// errNoWayToMap: a relay offers its arena in no way this rank maps (a
// whole arena by descriptor, say, which no rank maps any more). It will
// not change for that registration: the relay is not attached to again.
var errNoWayToMap = errors.New("no way to map the relay's arena")

// byLane reports whether this rank maps a relay's lane by descriptor when
// the relay offers shares.
func (r *Rank) byLane(shares uint32) bool {
	_, ok := r.opts.Arenas.(staging.LaneFDArenaProvider)
	return ok && shares&staging.ShareLaneFD != 0
}

// canMap reports whether this rank can map a relay's arena that offers
// shares, one way or another.
func (r *Rank) canMap(shares uint32) bool {
	return r.byLane(shares) || shares&staging.ShareIPCHandle != 0
}

// sharesNames spells the ways of staging.Header.ArenaShares.
func sharesNames(shares uint32) string {
	var names []string
	for _, sh := range [...]uint32{staging.ShareLaneFD, staging.ShareFD, staging.ShareIPCHandle} {
		if shares&sh != 0 {
			names = append(names, folder.ShareName(sh))
		}
	}
	if len(names) == 0 {
		return "nothing"
	}
	return strings.Join(names, ", ")
}

// ErrAttachPending: TryAttach claimed a lane and asked the relay for a
// descriptor of its arena, and the answer has not come yet. The caller
// tries again later; the claim is kept meanwhile, and released if the
// answer does not come within its deadline.
var ErrAttachPending = errors.New("waiting for the relay's arena descriptor")

// pendingAttach is an attach between its claim and its arena mapping.
type pendingAttach struct {
	link   *PeerLink
	handle [staging.ArenaHandleSize]byte
	shares uint32
	// client is the request for the lane's descriptor to the relay's
	// arena socket, nil when the arena is mapped by handle; fdErr is why
	// the descriptor way failed.
	client *fdClient
	fdErr  error
}

func (r *Rank) takePending(id staging.Identity) *pendingAttach {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pending[id]
	delete(r.pending, id)
	return p
}

// finishPending waits for the relay's descriptor (without wait, only
// looks) and maps the arena from it, or else by handle.
func (r *Rank) finishPending(ctx context.Context, p *pendingAttach, wait bool) (*PeerLink, error) {
	name := p.link.peer.Name
	var fd int
	var size uint64
	var done bool
	var err error
	for {
		now := staging.MonoNanos()
		var d time.Duration
		if wait {
			d = min(time.Duration(p.client.deadline-now), 10*time.Millisecond)
		}
		fd, size, done, err = p.client.poll(d)
		if done {
			break
		}
		if now >= p.client.deadline {
			err = fmt.Errorf("arena socket %s: no answer within %v", p.client.name, sockClientTimeout)
			break
		}
		if !wait {
			r.mu.Lock()
			closed := r.closed
			if !closed {
				r.pending[p.link.peer.Identity] = p
			}
			r.mu.Unlock()
			if closed {
				p.client.close()
				return nil, errors.Join(ErrRankClosed, p.link.releaseLane(false))
			}
			return nil, fmt.Errorf("pxn: attach to %s: %w", name, ErrAttachPending)
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("arena socket %s: %w", p.client.name, ctx.Err())
			break
		}
	}
	p.client.close()
	if err != nil {
		p.fdErr = err
		return r.mapByHandle(p, wait)
	}
	defer unix.Close(fd)
	if size != staging.LaneBytes {
		p.fdErr = fmt.Errorf("arena socket %s: lane %d of %d bytes, want %d", p.client.name, p.link.lane, size, uint64(staging.LaneBytes))
		return r.mapByHandle(p, wait)
	}
	pl, err := r.opts.Arenas.(staging.LaneFDArenaProvider).OpenLaneFD(fd, p.link.lane)
	if err == nil && pl.Lane() != p.link.lane {
		err = errors.Join(fmt.Errorf("lane %d mapped as lane %d", p.link.lane, pl.Lane()), pl.Close())
	}
	if err != nil {
		err = fmt.Errorf("pxn: attach to %s: map arena by descriptor: %w", name, err)
		r.importFailure(name, err)
		return nil, errors.Join(err, p.link.releaseLane(wait))
	}
	return r.finishLink(p, pl, staging.ShareLaneFD, wait)
}

// mapByHandle maps the arena from the handle in the relay's header, when
// the relay offers one.
func (r *Rank) mapByHandle(p *pendingAttach, wait bool) (*PeerLink, error) {
	name := p.link.peer.Name
	if p.shares&staging.ShareIPCHandle == 0 {
		err := fmt.Errorf("pxn: attach to %s: no handle, and by descriptor: %w", name, p.fdErr)
		return nil, errors.Join(err, p.link.releaseLane(wait))
	}
	pa, err := r.opts.Arenas.Open(r.d.dir, p.handle)
	if err != nil {
		err = fmt.Errorf("pxn: attach to %s: map arena: %w", name, err)
		if p.fdErr == nil {
			// The handle was the way to map this relay's arena, and it
			// fails: it will fail again.
			r.importFailure(name, err)
		} else {
			err = errors.Join(err, fmt.Errorf("and by descriptor: %w", p.fdErr))
		}
		return nil, errors.Join(err, p.link.releaseLane(wait))
	}
	return r.finishLink(p, pa, staging.ShareIPCHandle, wait)
}

// importFailure remembers that the arena of peer name cannot be mapped,
// and says so once: that peer is not attached to again.
func (r *Rank) importFailure(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.importFailed[name] == nil {
		r.importFailed[name] = err
		r.opts.Logger.Error(err, "pxn cannot map a relay's arena; that relay is not used", "registry", r.d.path, "peer", name)
	}
}

// finishLink completes an attach whose arena is mapped.
func (r *Rank) finishLink(p *pendingAttach, pa staging.PeerArena, share uint32, wait bool) (*PeerLink, error) {
	l := p.link
	l.arena, l.share = pa, share
	l.stagingBase = pa.Base()
	if share != staging.ShareLaneFD {
		l.stagingBase += uintptr(staging.LaneOffset(l.lane))
	}
	r.mu.Lock()
	closed := r.closed
	if !closed {
		r.links[l] = struct{}{}
	}
	say := !r.shareSaid[l.peer.Name]
	r.shareSaid[l.peer.Name] = true
	r.mu.Unlock()
	if closed {
		return nil, errors.Join(ErrRankClosed, l.close(wait))
	}
	if say {
		kv := []any{"registry", r.d.path, "peer", l.peer.Name, "share", folder.ShareName(share)}
		if p.fdErr != nil {
			kv = append(kv, "descriptor", p.fdErr.Error())
		}
		r.opts.Logger.Info("pxn mapped a relay's arena", kv...)
	}
	return l, nil
}

// expirePending drops the pending attaches whose answer is overdue, or
// all of them, releasing their claims; wait says how (see releaseLane).
func (r *Rank) expirePending(all, wait bool) error {
	now := staging.MonoNanos()
	var due []*pendingAttach
	r.mu.Lock()
	for id, p := range r.pending {
		if all || now >= p.client.deadline {
			due = append(due, p)
			delete(r.pending, id)
		}
	}
	r.mu.Unlock()
	var errs []error
	for _, p := range due {
		p.client.close()
		errs = append(errs, p.link.releaseLane(wait))
	}
	return errors.Join(errs...)
}

// checkRelay validates a copy of the mapped header of the peer we expect
// and returns it.
func (r *Rank) checkRelay(ctl *staging.ControlBlock, want staging.Identity) (staging.Header, error) {
	h := ctl.Header
	if err := folder.CheckHeader(&h); err != nil {
		return h, err
	}
	now := staging.MonoNanos()
	switch got := folder.HeaderIdentity(&h); {
	case got != want:
		return h, fmt.Errorf("%w: registered as %v", ErrPeerGone, got)
	case int(h.UID) != r.d.uid:
		return h, fmt.Errorf("%w: header uid %d in a registry of uid %d", ErrCorruptEntry, h.UID, r.d.uid)
	case h.ArenaKind != r.opts.Arenas.Kind():
		return h, &MismatchError{Field: "arena kind", Theirs: uint64(h.ArenaKind), Ours: uint64(r.opts.Arenas.Kind())}
	}
	if s := ctl.Header.LoadState(); s != staging.StateReady {
		return h, fmt.Errorf("%w: state %s", ErrPeerGone, folder.StateName(s))
	}
	if hb := ctl.Header.LoadHeartbeat(); folder.HeartbeatStale(hb, now, r.opts.HeartbeatTimeout) {
		return h, fmt.Errorf("%w: heartbeat older than %v", ErrPeerGone, r.opts.HeartbeatTimeout)
	}
	return h, nil
}

// claimLane takes the first free lane of ctl, or the first whose owner is
// stale. The caller holds the registry lock.
func (r *Rank) claimLane(ctl *staging.ControlBlock, name string) (int, uint64, error) {
	now := staging.MonoNanos()
	free, reclaimed := -1, ""
	for i := range ctl.Lanes {
		owner, held := ctl.Lanes[i].Owner.Load()
		switch {
		case !held:
			if free < 0 {
				free = i
			}
		case owner == r.id:
			return -1, 0, fmt.Errorf("this rank already holds lane %d", i)
		case free < 0:
			if why := r.ownerStale(owner, ctl.Lanes[i].Owner.LoadNS(), now); why != "" {
				free, reclaimed = i, why
			}
		}
	}
	if free < 0 {
		return -1, 0, ErrNoFreeLane
	}
	lane := &ctl.Lanes[free]
	epoch, err := newLaneEpoch(lane)
	if err != nil {
		return -1, 0, err
	}
	if reclaimed != "" {
		r.opts.Logger.Info("pxn reclaimed lane of a stale sender", "peer", name, "lane", free, "reason", reclaimed)
	}
	lane.Claim(r.id, r.ns, epoch, now)
	return free, epoch, nil
}

// newLaneEpoch draws a lane epoch other than the lane's current one.
func newLaneEpoch(lane *staging.Lane) (uint64, error) {
	for {
		epoch, err := folder.RandomEpoch()
		if err != nil || epoch != lane.Epoch() {
			return epoch, err
		}
	}
}
