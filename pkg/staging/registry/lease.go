// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
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
// and arena. The mappings live exactly as long as the claim, and while the
// claim stands the relay keeps its arena allocated.
type PeerLink struct {
	rank      *Rank
	peer      PeerInfo
	lane      int
	laneEpoch atomic.Uint64
	ctlMem    []byte
	ctl       *staging.ControlBlock
	arena     staging.PeerArena
	arenaBase uintptr
	// share is how the arena was mapped (staging.ShareFD or
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
		return nil, fmt.Errorf("pxn: attach to %s: %w", name, err)
	}
	// The claim is the lease: the relay keeps its arena while it stands, so
	// the arena can be mapped outside the lock. The relay's socket checks
	// the claim before it hands out a descriptor.
	p := &pendingAttach{link: l, handle: h.IPCHandle, shares: h.ArenaShares}
	if _, ok := r.opts.Arenas.(staging.FDArenaProvider); ok && h.ArenaShares&staging.ShareFD != 0 {
		q := fdRequest{Lane: uint32(l.lane), SenderEpoch: r.id.Epoch, LaneEpoch: l.laneEpoch.Load()}
		p.client, p.fdErr = dialArenaSocket(r.d, folder.SockFileName(peer.Identity), q, staging.MonoNanos())
		if p.fdErr == nil {
			return r.finishPending(ctx, p, wait)
		}
	}
	return r.mapByHandle(p, wait)
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
	// client is the request to the relay's arena socket, nil when the
	// arena is mapped by handle; fdErr is why the descriptor way failed.
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
	if size < staging.ArenaSize {
		p.fdErr = fmt.Errorf("arena socket %s: arena of %d bytes, want at least %d", p.client.name, size, uint64(staging.ArenaSize))
		return r.mapByHandle(p, wait)
	}
	pa, err := r.opts.Arenas.(staging.FDArenaProvider).OpenFD(fd, size)
	if err != nil {
		err = fmt.Errorf("pxn: attach to %s: map arena by descriptor: %w", name, err)
		r.importFailure(name, err)
		return nil, errors.Join(err, p.link.releaseLane(wait))
	}
	return r.finishLink(p, pa, staging.ShareFD, wait)
}

// mapByHandle maps the arena from the handle in the relay's header, when
// the relay offers one.
func (r *Rank) mapByHandle(p *pendingAttach, wait bool) (*PeerLink, error) {
	name := p.link.peer.Name
	if p.shares&staging.ShareIPCHandle == 0 {
		err := fmt.Errorf("pxn: attach to %s: the relay offers no handle, and its descriptor: %w", name, p.fdErr)
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
	l.arena, l.arenaBase, l.share = pa, pa.Base(), share
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

// ownerStale says why a lane owner no longer holds its lease, or "" while
// it does (or that cannot be proven): its process exited or its pid was
// reused (only for an owner in this rank's PID namespace, ns), its
// registration is gone, or its heartbeat is older than the timeout.
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
	case folder.HeartbeatStale(h.Heartbeat, now, r.opts.HeartbeatTimeout):
		return fmt.Sprintf("sender %v: heartbeat %v old", owner, time.Duration(now-int64(h.Heartbeat)).Round(time.Millisecond))
	}
	return ""
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
// Lane, ArenaBase and StagingBase are invalid afterwards.
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

// ArenaShare says how the peer's arena was mapped: staging.ShareFD (a
// descriptor from the peer's arena socket) or staging.ShareIPCHandle.
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

// ArenaBase is the peer's arena as mapped in this process.
func (l *PeerLink) ArenaBase() uintptr { return l.arenaBase }

// StagingBase is the claimed lane's staging memory in the peer's arena:
// slot s starts at StagingBase() + s*SlotSize.
func (l *PeerLink) StagingBase() uintptr { return l.arenaBase + uintptr(staging.LaneOffset(l.lane)) }

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
	j := judge{timeout: l.rank.opts.HeartbeatTimeout, obs: linkObserver{l}}
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
