// SPDX-License-Identifier: Apache-2.0

package registry

import (
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
}

// claim decides a claim that arrived on the arena socket, on the socket's
// goroutine: the asker must be the rank it names (within this rank's PID
// namespace, the kernel's pid of the connection is its pid; an asker of
// this namespace cannot name a rank of another), and gets the first free
// lane, with new blocks and a new eventfd. A lane is free only once its
// last lease has ended: the holder closed the connection, or exited,
// which closes it, or is proven gone (freeDeadLanes). A holder that is
// stopped, however late its heartbeat, keeps its lane, so whatever it
// writes when it runs again lands in its own lane. The owner words of the
// control file are this rank's record of the claim, written under laneMu
// alone.
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
	if st := r.ctl.Header.LoadState(); st != staging.StateReady {
		return fdAnswer{Status: fdNotReady}, nil, nil
	}
	now := staging.MonoNanos()
	free := -1
	for i, c := range r.claims {
		switch {
		case c == nil:
			if free < 0 {
				free = i
			}
		case c.owner == q.Owner:
			// Until the end of its lease is seen, the rank may still
			// write its lane: it gets no second one, nor that one anew.
			return fdAnswer{Status: fdHeld}, nil, nil
		}
	}
	if free < 0 {
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
		fd, err := r.laneArena.ExportLaneFD(free)
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
	c := &inboundClaim{lane: free, owner: q.Owner, ns: q.NS, epoch: epoch}
	summary.Claim(q.Owner, q.NS, epoch, now)
	r.inbound[free].Offer(b.words)
	r.claims[free] = c
	if r.waiter != nil {
		r.waiter.WakeAlways()
	}
	return fdAnswer{Status: fdOK, Lane: uint32(free), LaneEpoch: epoch, LaneBytes: staging.LaneBytes}, fds, c
}

// release ends claim c when it is still its lane's: its lease is over.
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
	r.inbound[i].Withdraw()
}
