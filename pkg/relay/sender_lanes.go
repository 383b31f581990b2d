// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"errors"
	"fmt"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
)

// checkLanes reads the health of the relays behind the outbound lanes
// from their control files (one pread each): stale ones stop taking
// tickets, gone ones fail what they had.
func (sn *sender) checkLanes() {
	s := sn.s
	if sn.peersOff || sn.noSend {
		return
	}
	changed := false
	now := time.Now()
	live := sn.lanes[:0]
	for _, sl := range sn.lanes {
		h := sl.link.Health(now)
		if h == Gone {
			sn.retire(sl, errRelayGone, staging.FallbackRelayGone)
			changed = true
			continue
		}
		if h == Closing {
			// The relay completes or fails what was published; the lane
			// goes back as soon as nothing is left, so that its close
			// need not wait for us.
			if !sl.tx.InFlight() {
				sn.retire(sl, nil, staging.FallbackRelayGone)
				changed = true
				continue
			}
			h = Stale
		}
		if stale := h == Stale; stale != sl.stale.Load() {
			sl.stale.Store(stale)
			changed = true
		}
		if d := sn.ticketTimeout(); sl.tx.InFlight() && now.Sub(sl.progressAt) > d {
			// The lane's claim stays with the zombie until the copier has
			// drained, and hasLane keeps it from being claimed anew
			// meanwhile: this relay gets no more tickets from us.
			s.log.Error(errTicketTimeout, "published tickets failed; relay not used again", "relayPid", sl.peer.Pid, "lane", sl.link.LaneIndex(), "seq", sl.tx.Reaped()+1, "timeout", d)
			s.counters.laneQuarantine.Add(1)
			sl.keepClaim = true
			sn.retire(sl, fmt.Errorf("%w within %v", errTicketTimeout, d), staging.FallbackLaneBroken)
			changed = true
			continue
		}
		if sl.broken && !sl.tx.InFlight() {
			sn.retire(sl, nil, staging.FallbackLaneBroken)
			changed = true
			continue
		}
		if s.exhausted(sl) && !sl.tx.InFlight() {
			// Sequence space spent and drained: a new claim gives the lane
			// a new epoch and restarts at seq 1.
			sn.retire(sl, nil, staging.FallbackNoLane)
			changed = true
			continue
		}
		live = append(live, sl)
	}
	sn.lanes = live
	sn.releaseDrained()
	if changed {
		sn.publishRoutes()
	}
}

// listPeers lists the group (a registry scan): new relays get a lane, and
// more peers than lanes turn PXN off.
func (sn *sender) listPeers() {
	s := sn.s
	sn.attachPending = false
	peers, err := sn.reg.Peers()
	if err != nil {
		if errors.Is(err, ErrTooManyPeers) {
			if !sn.peersOff {
				sn.peersOff = true
				s.log.Info("more than 7 peers in the group; PXN off, sending direct", "err", err.Error())
			}
			s.pxn.Store(false)
			for _, sl := range sn.lanes {
				sn.retire(sl, errRelayGone, staging.FallbackNoLane)
			}
			sn.lanes = nil
			s.routes.Store(&routeTable{})
			return
		}
		s.log.Error(err, "registry scan failed")
		return
	}
	if sn.peersOff || sn.noSend {
		return
	}
	changed := false
	for _, pr := range peers {
		if pr.Rail == s.localRail || pr.Rail == "" {
			continue
		}
		if sn.hasLane(pr) {
			continue
		}
		if sl := sn.attach(pr); sl != nil {
			sn.lanes = append(sn.lanes, sl)
			changed = true
		}
	}
	if changed {
		sn.publishRoutes()
	}
}

// attach claims a lane on relay pr and registers its words for doorbells.
func (sn *sender) attach(pr Peer) *senderLane {
	s := sn.s
	link, err := sn.reg.Attach(pr)
	if err != nil {
		// A busy registry is retried at the next heartbeat interval,
		// silently.
		if errors.Is(err, ErrRegistryBusy) {
			sn.attachPending = true
		} else {
			s.log.V(1).Info("cannot attach to relay", "pid", pr.Pid, "rail", pr.Rail, "err", err.Error())
		}
		return nil
	}
	sl := &senderLane{outLane: &outLane{peer: pr}, link: link, tx: link.Sender(), relayWake: link.Wake(), copierLane: sn.freeCopierLane()}
	if hr, ok := s.copier.(HostRegistrar); ok {
		unreg, err := hr.RegisterHost(sl.tx.Words())
		if err != nil {
			s.log.Error(err, "cannot register a relay's lane for doorbells", "pid", pr.Pid, "rail", pr.Rail)
			_ = link.Close()
			return nil
		}
		sl.unreg = unreg
	}
	if as, ok := link.(ArenaSharer); ok {
		switch as.ArenaShare() {
		case staging.ShareLaneFD:
			s.counters.arenaByFD.Add(1)
		case staging.ShareIPCHandle:
			s.counters.arenaByHandle.Add(1)
		}
	}
	// The relay opens the lane's epoch before it takes a ticket: wake it
	// now rather than at its next idle beat.
	sl.relayWake.Wake()
	return sl
}

// retire ends a lane: published Pieces fail with err (nil: the lane was
// drained), queued ones go direct for why. The claim and mappings are
// released now when the copier has finished every copy it was given for
// the lane, and otherwise once it has (releaseDrained) or after its Close.
// A relay's completion proves nothing here: a relay may complete a Piece
// that the copier is still writing.
func (sn *sender) retire(sl *senderLane, err error, why fallbackReason) {
	sl.gone.Store(true)
	if err != nil {
		sn.failPublished(sl, err)
	}
	sl.drainTo(&sn.s.fallbacks, why)
	if sl.keepClaim || !sn.copierDrained(sl) {
		sn.zombies = append(sn.zombies, sl)
		return
	}
	sl.release(sn.s.log)
}

// copierDrained reports whether the copier says that nothing it was given
// for sl can still write: its copier lane has drained. Without a
// CopyDrainer nobody can say, and the lane waits for the copier's Close.
func (sn *sender) copierDrained(sl *senderLane) bool {
	return sn.s.drainer != nil && sn.s.drainer.Drained(sl.copierLane)
}

// releaseDrained releases the retired lanes whose copier lane has drained.
// A lane kept for a relay that stopped making progress (keepClaim) waits
// for the copier's drain at stop, so that the relay gets no lane from us
// again.
func (sn *sender) releaseDrained() {
	kept := sn.zombies[:0]
	for _, sl := range sn.zombies {
		if !sl.keepClaim && sn.copierDrained(sl) {
			sl.release(sn.s.log)
			continue
		}
		kept = append(kept, sl)
	}
	clear(sn.zombies[len(kept):])
	sn.zombies = kept
}

// copierFailed handles a copier that can no longer ring doorbells: every
// lane stops taking tickets and fails what it published. The copies it was
// given may still write the relays' slots, and the relays may still send
// from them, so each claim is kept until the copier's drain at stop: a
// lane goes to another sender only once nothing of ours can write it.
func (sn *sender) copierFailed(err error) {
	s := sn.s
	if sn.noSend {
		return
	}
	// No lane is claimed with this copier again: Pieces go direct.
	sn.noSend = true
	s.log.Error(err, "copier failed; outbound lanes quarantined, sending direct")
	for _, sl := range sn.lanes {
		s.counters.laneQuarantine.Add(1)
		sl.broken, sl.keepClaim = true, true
		sn.retire(sl, fmt.Errorf("first hop failed: %w", err), staging.FallbackLaneBroken)
	}
	sn.lanes = sn.lanes[:0]
	sn.publishRoutes()
}

// freeCopierLane is the lowest copier lane no live outbound lane holds,
// preferring one no retired lane still drains through either. A rank has
// at most one outbound lane a rail, so with LaneCount+1 rails at most there
// is always one; beyond that, lanes share (their copies are ordered behind
// each other's, which is correct, only slower).
func (sn *sender) freeCopierLane() int {
	var live, draining [staging.LaneCount]bool
	for _, sl := range sn.lanes {
		live[sl.copierLane] = true
	}
	for _, sl := range sn.zombies {
		draining[sl.copierLane] = true
	}
	free := -1
	for i := range live {
		if live[i] {
			continue
		}
		if !draining[i] {
			return i
		}
		if free < 0 {
			free = i
		}
	}
	if free >= 0 {
		return free
	}
	return len(sn.lanes) % staging.LaneCount
}

func (sn *sender) hasLane(pr Peer) bool {
	for _, sl := range sn.lanes {
		if sl.peer.Pid == pr.Pid && sl.peer.Epoch == pr.Epoch {
			return true
		}
	}
	for _, sl := range sn.zombies {
		if sl.peer.Pid == pr.Pid && sl.peer.Epoch == pr.Epoch {
			return true
		}
	}
	return false
}

// publishRoutes rebuilds the rail → lane table. A rail with more than one
// relay is not unique and routes direct.
func (sn *sender) publishRoutes() {
	count := map[string]int{}
	for _, sl := range sn.lanes {
		count[sl.peer.Rail]++
	}
	rt := &routeTable{byRail: map[string]*outLane{}}
	for _, sl := range sn.lanes {
		if count[sl.peer.Rail] == 1 {
			rt.byRail[sl.peer.Rail] = sl.outLane
		}
	}
	sn.s.routes.Store(rt)
}
