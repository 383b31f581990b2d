// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// inboundClaim is the relay's record of one claim of one of its lanes:
// whom it gave the lane to, under which epoch. Its lease is the claim's
// socket connection, which the arena socket holds.
type inboundClaim struct {
	lane  int
	owner staging.Identity
	ns    staging.PidNS
	epoch uint64
	// lapsed: the lease ended without the holder's release while the
	// holder still lived (it closed the connection by mistake, or is on
	// its way out); the lane stays its until it is gone. Under laneMu.
	lapsed bool
}

// claim decides a claim that arrived on the arena socket, on the socket's
// goroutine: the asker must be the rank it names (within this rank's PID
// namespace, the kernel's pid of the connection is its pid; an asker of
// this namespace cannot name a rank of another), and gets the first free
// lane, with new blocks and a new eventfd. A lane is free only once its
// last lease has ended: the holder released it (it unmapped the lane, then
// said so on the connection and closed it), or its connection ended and
// the holder is gone (holderGone). A holder that is stopped, however late
// its heartbeat, keeps its lane, and so does one that closed its
// connection without a release and still lives: whatever it writes when
// it runs again lands in its own lane, never in another holder's. The
// owner words of the control file are this rank's record of the claim,
// written under laneMu alone.
func (r *Rank) claim(cred *unix.Ucred, q fdRequest) (fdAnswer, []int, *inboundClaim) {
	switch {
	case q.NS == r.ns && int(cred.Pid) != q.Owner.Pid:
		return fdAnswer{Status: fdNotHolder}, nil, nil
	case q.NS != r.ns && inOwnNS(cred, r.ns):
		return fdAnswer{Status: fdNotHolder}, nil, nil
	case q.Owner == r.id:
		return fdAnswer{Status: fdNotHolder}, nil, nil
	}
	r.laneMu.Lock()
	defer r.laneMu.Unlock()
	if !r.accepting || r.lanesClosed {
		return fdAnswer{Status: fdNotReady}, nil, nil
	}
	now := staging.MonoNanos()
	free, retired := -1, -1
	for i, c := range r.claims {
		switch {
		case c == nil && r.retired[i] != "":
			retired = i
		case c == nil:
			if free < 0 {
				free = i
			}
		case c.lapsed && r.holderGone(c) != "":
			r.endClaim(i, "its holder is gone")
			if free < 0 {
				free = i
			}
		case c.owner == q.Owner:
			// Until the end of its lease is seen, the rank may still
			// write its lane: it gets no second one, nor that one anew.
			return fdAnswer{Status: fdHeld}, nil, nil
		}
	}
	switch {
	case free < 0 && retired >= 0:
		r.opts.Logger.V(2).Info("pxn refused a claim: its free lanes are retired", "registry", r.d.path, "lane", retired, "reason", r.retired[retired])
		return fdAnswer{Status: fdLaneRetired}, nil, nil
	case free < 0:
		return fdAnswer{Status: fdNoFreeLane}, nil, nil
	}
	summary := &r.ctl.Lanes[free]
	var epoch uint64
	for epoch == 0 || epoch == summary.Epoch() {
		var err error
		if epoch, err = folder.RandomEpoch(); err != nil {
			r.opts.Logger.Error(err, "pxn could not draw a lane epoch", "registry", r.d.path)
			return fdAnswer{Status: fdExportFailed}, nil, nil
		}
	}
	b, err := newLaneBlocks(r.Name(), free, epoch)
	if err != nil {
		r.opts.Logger.Error(err, "pxn could not make a lane's blocks", "registry", r.d.path, "lane", free)
		return fdAnswer{Status: fdExportFailed}, nil, nil
	}
	wake, err := unix.FcntlInt(uintptr(b.words.WakeFD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		b.closeFDs()
		b.words.Free()
		r.opts.Logger.Error(err, "pxn could not share a lane's eventfd", "registry", r.d.path, "lane", free)
		return fdAnswer{Status: fdExportFailed}, nil, nil
	}
	fds := []int{b.senderFD, b.relayFD, wake}
	b.senderFD, b.relayFD = -1, -1
	if r.laneArena != nil {
		fd, err := r.exportLane(free, b.words)
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			b.words.Free()
			r.opts.Logger.Error(err, "pxn arena socket could not export the arena", "registry", r.d.path, "lane", free)
			return fdAnswer{Status: fdExportFailed}, nil, nil
		}
		fds = append(fds, fd)
	}
	r.granted[free] = true
	c := &inboundClaim{lane: free, owner: q.Owner, ns: q.NS, epoch: epoch}
	summary.Claim(q.Owner, q.NS, epoch, now)
	// The holder checks its claim in the file's summary: it is there
	// before the answer is.
	r.flushControl()
	r.inbound[free].Offer(b.words)
	r.claims[free] = c
	if r.waiter != nil {
		r.waiter.WakeAlways()
	}
	return fdAnswer{Status: fdOK, Lane: uint32(free), LaneEpoch: epoch, LaneBytes: staging.LaneBytes}, fds, c
}

// lapse deals with a lease whose connection ended without a release: the
// claim ends when its holder is gone, and stays, lapsed, while it lives.
func (r *Rank) lapse(c *inboundClaim, why string) {
	r.laneMu.Lock()
	defer r.laneMu.Unlock()
	if r.claims[c.lane] != c {
		return
	}
	if gone := r.holderGone(c); gone != "" {
		r.endClaim(c.lane, gone)
		r.opts.Logger.V(2).Info("pxn lane freed", "registry", r.d.path, "lane", c.lane, "reason", why+"; "+gone)
		return
	}
	c.lapsed = true
	r.opts.Logger.Info("pxn lane kept for a holder that still lives", "registry", r.d.path, "lane", c.lane, "reason", why)
	r.watchLapsed(c, 10*time.Millisecond)
}

// watchLapsed looks again after d, and then less and less often, whether
// the holder of lapsed claim c is gone, and frees its lane once it is: a
// holder's exit ends its connection a moment before its pid is gone.
func (r *Rank) watchLapsed(c *inboundClaim, d time.Duration) {
	time.AfterFunc(d, func() {
		r.laneMu.Lock()
		defer r.laneMu.Unlock()
		if r.lanesClosed || r.claims[c.lane] != c {
			return
		}
		if gone := r.holderGone(c); gone != "" {
			r.endClaim(c.lane, gone)
			r.opts.Logger.V(2).Info("pxn lane freed", "registry", r.d.path, "lane", c.lane, "reason", gone)
			return
		}
		r.watchLapsed(c, min(2*d, time.Second))
	})
}

// holderGone says why c's holder is gone, or "" while it may live and
// still map the lane: in this rank's PID namespace its pid has exited or
// was reused; in another, its liveness lock is free or its registration
// is gone.
func (r *Rank) holderGone(c *inboundClaim) string {
	if c.ns == r.ns {
		return folder.GoneReason(c.owner.Pid, c.owner.StartTime)
	}
	switch held, found := folder.Liveness(r.d.fd(), c.owner); {
	case !found:
		return fmt.Sprintf("sender %v is no longer registered", c.owner)
	case !held:
		return fmt.Sprintf("sender %v: its liveness lock is free", c.owner)
	}
	return ""
}

// release ends claim c when it is still its lane's: its holder released
// it.
func (r *Rank) release(c *inboundClaim, why string) {
	r.laneMu.Lock()
	defer r.laneMu.Unlock()
	if r.claims[c.lane] != c {
		return
	}
	r.endClaim(c.lane, why)
	r.opts.Logger.V(2).Info("pxn lane released", "registry", r.d.path, "lane", c.lane, "reason", why)
}

// endClaim frees lane i: the summary shows it free, and the pump's ring of
// it is no longer Current. The caller holds laneMu.
func (r *Rank) endClaim(i int, _ string) {
	r.claims[i] = nil
	r.ctl.Lanes[i].Free()
	r.flushControl()
	r.inbound[i].Withdraw()
}

// exportLane returns the descriptor of the staging memory the claim of
// lane, whose words are w, hands its holder. A lane granted before gets
// new memory when the arena can make it (LaneRenewer): the relay puts it
// in place of the earlier holder's when the pump opens the claim's ring,
// once no second-hop write reads the lane (w.Install, renewLane), and
// frees it with w if that never happens. A lane never granted keeps its
// first memory. The caller holds laneMu.
func (r *Rank) exportLane(lane int, w *staging.LaneWords) (int, error) {
	if !r.granted[lane] || r.renewer == nil {
		return r.laneArena.ExportLaneFD(lane)
	}
	m, err := r.renewer.NewLaneMemory(lane)
	if err != nil {
		return -1, err
	}
	fd, err := m.ExportFD()
	if err != nil {
		return -1, errors.Join(err, m.Discard())
	}
	free := w.Free
	w.Free = func() {
		m.Discard()
		free()
	}
	epoch := w.Epoch
	w.Install = func() error { return r.renewLane(lane, epoch, m) }
	return fd, nil
}

// renewLane puts m in place of lane's staging memory for the claim of
// epoch, on the pump's goroutine once nothing reads the lane: the lane's
// NIC registration is dropped before and made again after. A failure
// retires the lane (never granted again) and ends the claim; one of the
// registration quarantines the arena as well (see
// staging.MemoryRegistrar).
func (r *Rank) renewLane(lane int, epoch uint64, m staging.LaneMemory) error {
	r.laneMu.Lock()
	reg := r.opts.Memory != nil && r.registered[lane]
	r.laneMu.Unlock()
	if reg {
		if err := r.deregisterLane(lane); err != nil {
			return r.retire(lane, epoch, fmt.Errorf("deregister lane %d for its new memory: %w (arena quarantined)", lane, err))
		}
	}
	if err := m.Install(); err != nil {
		return r.retire(lane, epoch, err)
	}
	if reg {
		if err := r.registerLane(lane); err != nil {
			return r.retire(lane, epoch, fmt.Errorf("register lane %d's new memory: %w (arena quarantined)", lane, err))
		}
	}
	return nil
}

// retire keeps lane from being granted again, for why, and ends its claim
// of epoch if that still stands; it returns why.
func (r *Rank) retire(lane int, epoch uint64, why error) error {
	r.laneMu.Lock()
	defer r.laneMu.Unlock()
	r.retired[lane] = why.Error()
	if c := r.claims[lane]; c != nil && c.epoch == epoch {
		r.endClaim(lane, why.Error())
	}
	r.opts.Logger.Error(why, "pxn lane retired: no sender is given it again", "registry", r.d.path, "lane", lane)
	return why
}
