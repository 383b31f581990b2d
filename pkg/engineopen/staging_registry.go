// SPDX-License-Identifier: Apache-2.0

package engineopen

import (
	"context"
	"errors"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// StagingRegistry adapts a rank of the shared-memory registry to the
// engine's relay.Registry. Peers reuses its buffers, so that the pump's refresh
// allocates nothing while the group stays the same. What the pump calls
// never waits on another process: the registry lock is only tried, and
// whatever needs it and finds it busy is retried at a later refresh.
type StagingRegistry struct {
	rank *registry.Rank
	// infos is the rank's last answer, for Peers and Attach; peers is
	// what Peers returned last, which Attach leaves alone.
	infos []registry.PeerInfo
	peers []relay.Peer
	// offErr is the rank's last ErrTooManyPeers error and offJoined the
	// error Peers made of it.
	offErr, offJoined error
}

// NewStagingRegistry wraps r; the engine's Close closes it.
func NewStagingRegistry(r *registry.Rank) *StagingRegistry {
	return &StagingRegistry{rank: r}
}

// Rank returns the wrapped rank.
func (s *StagingRegistry) Rank() *registry.Rank { return s.rank }

func (s *StagingRegistry) Inbound(i int) *staging.RelayLane { return s.rank.Inbound(i) }

func (s *StagingRegistry) ArenaBase() uintptr { return s.rank.Arena().Base() }

func (s *StagingRegistry) Wake() relay.Waiter {
	if w := s.rank.Wake(); w != nil {
		return w
	}
	return nil
}

func (s *StagingRegistry) Heartbeat(time.Time) { s.rank.Heartbeat(staging.MonoNanos()) }

// PublishStats writes st into the rank's control file (registry.Rank.PublishStats).
func (s *StagingRegistry) PublishStats(st *staging.RankStats) {
	s.rank.PublishStats(st, staging.MonoNanos())
}

// LateSenders marks the inbound lanes whose sender is late (registry.Rank.LateSenders).
func (s *StagingRegistry) LateSenders(late *[staging.LaneCount]bool) {
	s.rank.LateSenders(staging.MonoNanos(), late)
}

// Peers returns a slice of its own, valid until the next call of Peers.
func (s *StagingRegistry) Peers() ([]relay.Peer, error) {
	var err error
	s.infos, err = s.rank.TryAppendPeers(s.infos[:0])
	if err != nil {
		if errors.Is(err, registry.ErrTooManyPeers) {
			if err != s.offErr {
				s.offErr, s.offJoined = err, errors.Join(relay.ErrTooManyPeers, err)
			}
			return nil, s.offJoined
		}
		return nil, err
	}
	s.peers = s.peers[:0]
	for _, p := range s.infos {
		if p.Refused != nil || p.State != staging.StateReady {
			continue
		}
		s.peers = append(s.peers, relay.Peer{Pid: p.Pid, Epoch: p.Epoch, Rail: p.Rail, HCA: p.HCA})
	}
	return s.peers, nil
}

// Attach lists the peers again, so that it sees a peer as it is now; the
// slice Peers returned stays as it was.
func (s *StagingRegistry) Attach(p relay.Peer) (relay.Link, error) {
	var err error
	s.infos, err = s.rank.TryAppendPeers(s.infos[:0])
	if err != nil {
		return nil, err
	}
	for _, info := range s.infos {
		if info.Pid == p.Pid && info.Epoch == p.Epoch {
			l, err := s.rank.TryAttach(info)
			if errors.Is(err, registry.ErrLockBusy) || errors.Is(err, registry.ErrAttachPending) || errors.Is(err, registry.ErrLaneHeld) {
				return nil, relay.ErrRegistryBusy
			}
			if err != nil {
				return nil, err
			}
			return stagingLink{l}, nil
		}
	}
	return nil, registry.ErrPeerGone
}

func (s *StagingRegistry) BeginClose() { s.rank.BeginClose() }

func (s *StagingRegistry) Leased() bool { return len(s.rank.Leases()) > 0 }

func (s *StagingRegistry) Close(ctx context.Context) error { return s.rank.Close(ctx) }

type stagingLink struct{ l *registry.PeerLink }

func (l stagingLink) Sender() *staging.SenderLane { return l.l.Sender() }
func (l stagingLink) LaneIndex() int              { return l.l.LaneIndex() }
func (l stagingLink) Staging() uintptr            { return l.l.StagingBase() }
func (l stagingLink) Close() error                { return l.l.CloseNoWait() }
func (l stagingLink) Wake() relay.Waker           { return l.l.Wake() }
func (l stagingLink) ArenaShare() uint32          { return l.l.ArenaShare() }

func (l stagingLink) Health(time.Time) relay.Health {
	err := l.l.Health(staging.MonoNanos())
	switch {
	case err == nil:
		return relay.Live
	case errors.Is(err, registry.ErrPeerStale):
		return relay.Stale
	case errors.Is(err, registry.ErrPeerClosing):
		return relay.Closing
	}
	return relay.Gone
}
