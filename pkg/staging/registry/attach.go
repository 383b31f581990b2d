// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// Attach claims a lane on peer over the peer's arena socket and maps the
// claim's blocks and the lane's staging memory. The peer's header is read
// by pread, never through a mapping; the relay decides the claim and
// refuses it once it began closing. The link is closed by PeerLink.Close
// or by the rank's Close.
func (r *Rank) Attach(ctx context.Context, peer PeerInfo) (*PeerLink, error) {
	return r.attach(ctx, peer, true)
}

// TryAttach is Attach for a caller that must never wait on another
// process (the pump): when the relay's answer is not in at once it
// returns an error wrapping ErrAttachPending, and the caller tries again
// later.
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
	l := &PeerLink{rank: r, peer: peer, ctlFd: -1, leaseFd: -1}
	fd, st, err := folder.OpenPrivate(r.d.fd(), r.d.path, name, unix.O_RDONLY, r.d.uid)
	if errors.Is(err, fs.ErrNotExist) {
		err = ErrPeerGone
	}
	if err == nil {
		l.ctlFd = fd
		if err = folder.CheckControlSize(name, st.Size); err == nil {
			err = l.read()
		}
	}
	var h staging.Header
	if err == nil {
		h, err = r.checkRelay(&l.view.Header, peer.Identity)
	}
	if err == nil && !r.canMap(h.ArenaShares) {
		err = fmt.Errorf("%w: the relay offers its arena by %s", errNoWayToMap, sharesNames(h.ArenaShares))
	}
	if err != nil {
		l.closeControl()
		err = fmt.Errorf("pxn: attach to %s: %w", name, err)
		if errors.Is(err, errNoWayToMap) {
			r.importFailure(name, err)
		}
		return nil, err
	}
	p := &pendingAttach{link: l, handle: h.IPCHandle, shares: h.ArenaShares}
	// Only in one PID namespace does the socket's pid name the relay.
	relayPid := 0
	if folder.HeaderNS(&h) == r.ns {
		relayPid = peer.Identity.Pid
	}
	q := fdRequest{Owner: r.id, NS: r.ns}
	p.client, err = dialArenaSocket(r.d, folder.SockFileName(peer.Identity), q, relayPid, staging.MonoNanos())
	if err != nil {
		l.closeControl()
		return nil, fmt.Errorf("pxn: attach to %s: %w", name, err)
	}
	return r.finishPending(ctx, p, wait)
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

// ErrAttachPending: TryAttach asked the relay's arena socket for a lane
// and the answer has not come yet. The caller tries again later; the
// request is kept meanwhile, and dropped if the answer does not come
// within its deadline.
var ErrAttachPending = errors.New("waiting for the relay's answer to a claim")

// pendingAttach is an attach between its request and its answer.
type pendingAttach struct {
	link   *PeerLink
	handle [staging.ArenaHandleSize]byte
	shares uint32
	// client is the claim on the relay's arena socket.
	client *fdClient
}

func (r *Rank) takePending(id staging.Identity) *pendingAttach {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pending[id]
	delete(r.pending, id)
	return p
}

// finishPending waits for the relay's answer (without wait, only looks),
// maps the claim's blocks and the lane's staging memory, from the lane's
// descriptor or else by handle.
func (r *Rank) finishPending(ctx context.Context, p *pendingAttach, wait bool) (*PeerLink, error) {
	name := p.link.peer.Name
	var ans fdAnswer
	var fds []int
	var done bool
	var err error
	for {
		now := staging.MonoNanos()
		var d time.Duration
		if wait {
			d = min(time.Duration(p.client.deadline-now), 10*time.Millisecond)
		}
		ans, fds, done, err = p.client.poll(d)
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
				p.link.closeControl()
				return nil, ErrRankClosed
			}
			return nil, fmt.Errorf("pxn: attach to %s: %w", name, ErrAttachPending)
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("arena socket %s: %w", p.client.name, ctx.Err())
			break
		}
	}
	l := p.link
	if err != nil {
		p.client.close()
		l.closeControl()
		return nil, fmt.Errorf("pxn: attach to %s: %w", name, err)
	}
	// From here the connection is the lease: closing it gives the lane
	// back.
	l.leaseFd = p.client.take()
	l.lane = int(ans.Lane)
	l.laneEpoch.Store(ans.LaneEpoch)
	closeFDs := func() {
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
	l.blocks, err = mapHeldBlocks(fds[0], fds[1], fds[2])
	fds[2] = -1
	if err == nil {
		l.sender, err = staging.NewSenderLane(l.blocks.sender(), l.blocks.relay(), ans.LaneEpoch)
	}
	if err != nil {
		closeFDs()
		err = fmt.Errorf("pxn: attach to %s: lane %d: %w", name, l.lane, err)
		r.importFailure(name, err)
		return nil, errors.Join(err, l.releaseLane())
	}
	l.waker = staging.NewLaneWaker(l.sender, l.blocks.wakeFD)
	if len(fds) < 4 || !r.byLane(p.shares) {
		closeFDs()
		return r.mapByHandle(p, errors.New("the relay sent no descriptor of the lane's staging memory"))
	}
	laneFD := fds[3]
	fds[3] = -1
	closeFDs()
	defer unix.Close(laneFD)
	if ans.LaneBytes != staging.LaneBytes {
		return r.mapByHandle(p, fmt.Errorf("arena socket %s: lane %d of %d bytes, want %d", p.client.name, l.lane, ans.LaneBytes, uint64(staging.LaneBytes)))
	}
	pl, err := r.opts.Arenas.(staging.LaneFDArenaProvider).OpenLaneFD(laneFD, l.lane)
	if err == nil && pl.Lane() != l.lane {
		err = errors.Join(fmt.Errorf("lane %d mapped as lane %d", l.lane, pl.Lane()), pl.Close())
	}
	if err != nil {
		err = fmt.Errorf("pxn: attach to %s: map arena by descriptor: %w", name, err)
		r.importFailure(name, err)
		return nil, errors.Join(err, l.releaseLane())
	}
	return r.finishLink(p, pl, staging.ShareLaneFD, nil)
}

// mapByHandle maps the arena from the handle in the relay's header, when
// the relay offers one; fdErr is why the lane's descriptor was not used.
func (r *Rank) mapByHandle(p *pendingAttach, fdErr error) (*PeerLink, error) {
	name := p.link.peer.Name
	if p.shares&staging.ShareIPCHandle == 0 {
		err := fmt.Errorf("pxn: attach to %s: no handle, and by descriptor: %w", name, fdErr)
		return nil, errors.Join(err, p.link.releaseLane())
	}
	pa, err := r.opts.Arenas.Open(r.d.dir, p.handle)
	if err != nil {
		err = fmt.Errorf("pxn: attach to %s: map arena: %w", name, err)
		// The handle was the way to map this relay's arena, and it
		// fails: it will fail again.
		r.importFailure(name, err)
		return nil, errors.Join(err, p.link.releaseLane())
	}
	if p.shares&staging.ShareLaneFD == 0 || !r.byLane(p.shares) {
		fdErr = nil
	}
	return r.finishLink(p, pa, staging.ShareIPCHandle, fdErr)
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
func (r *Rank) finishLink(p *pendingAttach, pa staging.PeerArena, share uint32, fdErr error) (*PeerLink, error) {
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
		return nil, errors.Join(ErrRankClosed, l.Close())
	}
	if say {
		kv := []any{"registry", r.d.path, "peer", l.peer.Name, "share", folder.ShareName(share)}
		if fdErr != nil {
			kv = append(kv, "descriptor", fdErr.Error())
		}
		r.opts.Logger.Info("pxn mapped a relay's arena", kv...)
	}
	return l, nil
}

// expirePending drops the pending attaches whose answer is overdue, or
// all of them: closing a request's connection withdraws the claim.
func (r *Rank) expirePending(all bool) {
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
	for _, p := range due {
		p.client.close()
		p.link.closeControl()
	}
}

// checkRelay validates a copy of the peer's header, read by pread, and
// returns it.
func (r *Rank) checkRelay(hdr *staging.Header, want staging.Identity) (staging.Header, error) {
	h := *hdr
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
	if s := h.State; s != staging.StateReady {
		return h, fmt.Errorf("%w: state %s", ErrPeerGone, folder.StateName(s))
	}
	if folder.HeartbeatStale(h.Heartbeat, now, r.opts.HeartbeatTimeout) {
		return h, fmt.Errorf("%w: heartbeat older than %v", ErrPeerGone, r.opts.HeartbeatTimeout)
	}
	return h, nil
}
