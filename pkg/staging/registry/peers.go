// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// PeerInfo is a validated copy of another rank's header.
type PeerInfo struct {
	// Name is the peer's control file in the registry directory.
	Name string
	staging.Identity
	Rail      string
	HCA       string
	State     uint32
	ArenaKind uint32
	// PidNS is the PID namespace the peer's pid and start time belong to.
	PidNS staging.PidNS
	// ArenaShares says how the peer's arena may be mapped
	// (staging.ShareIPCHandle, staging.ShareFD, staging.ShareLaneFD).
	ArenaShares uint32
	// HeartbeatAge is how old the peer's heartbeat was when read.
	HeartbeatAge time.Duration
	// Refused is non-nil for a peer that must not be used, and says why:
	// a *MismatchError for other engine numbers, ErrCorruptEntry for
	// garbage. Traffic to its rail goes direct.
	Refused error
}

// Peers lists the other published ranks of the group. Stale ones (exited,
// pid reused) are left out and their files removed; ranks whose heartbeat is
// older than the timeout are left out but keep their files. Inbound lanes
// of this rank whose sender exited are freed.
// More than LaneCount usable peers, or an unsafe registry, turn PXN off for
// the process: Peers then returns that error, now and later.
func (r *Rank) Peers(ctx context.Context) ([]PeerInfo, error) {
	return r.AppendPeers(ctx, nil)
}

// AppendPeers is Peers appending to dst; on error dst comes back as it was.
// While the group does not change it allocates nothing once dst has room:
// it stats the directory, reads each peer's header through a descriptor
// kept open and polls the peers' processes, and lists the directory again
// only when its stat moved, or at least every second. Calls are
// serialized.
func (r *Rank) AppendPeers(ctx context.Context, dst []PeerInfo) ([]PeerInfo, error) {
	return r.appendPeers(ctx, dst, true)
}

// TryAppendPeers is AppendPeers for a caller that must never wait on
// another process (the pump): the stale cleanup runs only when the
// registry lock is free at once, and is otherwise left for a later call;
// the list itself needs no lock. It also gives up the claims whose answer
// is overdue.
func (r *Rank) TryAppendPeers(dst []PeerInfo) ([]PeerInfo, error) {
	r.expirePending(false)
	return r.appendPeers(context.Background(), dst, false)
}

func (r *Rank) appendPeers(ctx context.Context, dst []PeerInfo, wait bool) ([]PeerInfo, error) {
	r.scanMu.Lock()
	defer r.scanMu.Unlock()
	s := &r.scan
	start := len(dst)
	if err := r.usable(); err != nil {
		s.release()
		return dst, err
	}
	if err := s.refresh(r.d, r.id); err != nil {
		s.release()
		return dst, r.turnOff(err)
	}
	deadOwner := s.checkProcs(r.d, r.ctl, r.opts.HeartbeatTimeout)
	now := staging.MonoNanos()
	sawStale := false
	for _, e := range s.entries {
		if e.proc == nil {
			// This rank's own entries, the lock, other names.
			continue
		}
		if e.proc.gone != "" {
			// A control file, an arena or a .tmp left by an exited process
			// (a relay whose close gave up on a lease, a rank killed
			// during init).
			sawStale = true
			continue
		}
		if e.kind != folder.EntryRank {
			continue
		}
		p, late, ok := r.readEntry(e, now)
		switch {
		case !ok || late:
		case p.Refused != nil || p.State == staging.StateReady:
			dst = append(dst, p)
		}
	}
	if sawStale || deadOwner {
		j := judge{self: r.ns, timeout: r.opts.HeartbeatTimeout, obs: s, d: r.d}
		err := r.d.lockFor(ctx, wait, func() error {
			r.freeDeadLanes(j)
			removed, why, err := r.d.cleanStale(r.id, j)
			if len(removed) > 0 {
				r.opts.Logger.Info("pxn removed stale registry entries", "registry", r.d.path, "entries", removed, "reasons", why)
			}
			return err
		})
		s.trusted = false
		var unsafeErr *UnsafeError
		if errors.As(err, &unsafeErr) {
			s.release()
			return dst[:start], r.turnOff(err)
		}
		if err != nil && err != ErrLockBusy {
			r.opts.Logger.V(2).Info("pxn stale cleanup deferred", "registry", r.d.path, "err", err)
		}
	}
	usable := 0
	for _, p := range dst[start:] {
		if p.Refused == nil {
			usable++
		} else {
			r.sayRefused(p)
		}
	}
	if usable > staging.LaneCount {
		s.release()
		return dst[:start], r.turnOff(fmt.Errorf("%w: %d valid peers in %s, at most %d", ErrTooManyPeers, usable, r.d.path, staging.LaneCount))
	}
	return dst, nil
}

func (r *Rank) sayRefused(p PeerInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.refused[p.Name] {
		r.refused[p.Name] = true
		r.opts.Logger.Error(p.Refused, "pxn refusing peer; its rail goes direct", "registry", r.d.path, "peer", p.Name)
	}
}

// readEntry reads the header of the control file of e through the
// descriptor kept for it, opened on first sight, and validates it again
// only when its bytes changed. late reports a peer whose heartbeat is older
// than the timeout; !ok one whose file is gone.
func (r *Rank) readEntry(e *scanEntry, now int64) (p PeerInfo, late, ok bool) {
	s := &r.scan
	if e.fd < 0 && !e.final {
		fd, st, err := folder.OpenPrivate(r.d.fd(), r.d.path, e.name, unix.O_RDONLY, r.d.uid)
		if errors.Is(err, fs.ErrNotExist) {
			s.trusted = false
			return p, false, false
		}
		if err != nil {
			// Only another file under this name can end an unsafe type;
			// anything else is tried again next call.
			var unsafeErr *UnsafeError
			e.final = errors.As(err, &unsafeErr)
			e.info = PeerInfo{Name: e.name, Identity: e.id, Refused: fmt.Errorf("peer %s: %w", e.name, err)}
			return e.info, false, true
		}
		e.fd, e.ino, e.size, e.loaded = fd, st.Ino, st.Size, false
	}
	if e.fd < 0 {
		return e.info, false, true
	}
	s.hdr = staging.Header{}
	n, err := preadUpTo(e.fd, s.headerBytes())
	if err != nil {
		e.loaded = false
		err = fmt.Errorf("%w: %s: %v", ErrCorruptEntry, e.name, err)
		return PeerInfo{Name: e.name, Identity: e.id, Refused: fmt.Errorf("peer %s: %w", e.name, err)}, false, true
	}
	if !e.loaded || n != e.n || !sameHeader(&s.hdr, &e.hdr) {
		e.hdr, e.n, e.loaded = s.hdr, n, true
		e.info = r.peerInfo(e.name, e.id, e.size, s.headerBytes()[:n])
	}
	if e.info.Refused != nil {
		return e.info, false, true
	}
	hb := s.hdr.Heartbeat
	if folder.HeartbeatStale(hb, now, r.opts.HeartbeatTimeout) {
		return p, true, true
	}
	p = e.info
	p.HeartbeatAge = max(time.Duration(now-int64(hb)), 0)
	return p, false, true
}

// peerInfo validates the first bytes b of control file name, of size
// bytes, registered as id.
func (r *Rank) peerInfo(name string, id staging.Identity, size int64, b []byte) PeerInfo {
	p := PeerInfo{Name: name, Identity: id}
	var h staging.Header
	err := folder.CheckControlSize(name, size)
	if err == nil && len(b) < int(folder.HeaderSize) {
		err = fmt.Errorf("%w: %s: short read", ErrCorruptEntry, name)
	}
	if err == nil {
		h, err = folder.DecodeHeader(b)
	}
	switch {
	case err != nil:
	case folder.HeaderIdentity(&h) != id:
		err = fmt.Errorf("%w: header names %v", ErrCorruptEntry, folder.HeaderIdentity(&h))
	case int(h.UID) != r.d.uid:
		err = fmt.Errorf("%w: header uid %d in a registry of uid %d", ErrCorruptEntry, h.UID, r.d.uid)
	case h.ArenaKind != r.opts.Arenas.Kind():
		err = &MismatchError{Field: "arena kind", Theirs: uint64(h.ArenaKind), Ours: uint64(r.opts.Arenas.Kind())}
	}
	if err != nil {
		p.Refused = fmt.Errorf("peer %s: %w", name, err)
		return p
	}
	p.Rail, p.HCA = folder.HeaderRail(&h), folder.HeaderHCA(&h)
	p.State, p.ArenaKind = h.State, h.ArenaKind
	p.PidNS, p.ArenaShares = folder.HeaderNS(&h), h.ArenaShares
	return p
}
