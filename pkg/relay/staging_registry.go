package relay

import (
	"context"
	"errors"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
)

// StagingRegistry adapts a rank of the shared-memory registry to the
// engine's Registry.
type StagingRegistry struct {
	rank *staging.Rank
	ctx  context.Context
}

// NewStagingRegistry wraps r; the engine's Close closes it.
func NewStagingRegistry(r *staging.Rank) *StagingRegistry {
	return &StagingRegistry{rank: r, ctx: context.Background()}
}

// Rank returns the wrapped rank.
func (s *StagingRegistry) Rank() *staging.Rank { return s.rank }

func (s *StagingRegistry) Control() *staging.ControlBlock { return s.rank.Control() }

func (s *StagingRegistry) ArenaBase() uintptr { return s.rank.Arena().Base() }

func (s *StagingRegistry) Heartbeat(time.Time) { s.rank.Heartbeat(staging.MonoNanos()) }

func (s *StagingRegistry) Peers() ([]Peer, error) {
	ps, err := s.rank.Peers(s.ctx)
	if err != nil {
		if errors.Is(err, staging.ErrTooManyPeers) {
			return nil, errors.Join(ErrTooManyPeers, err)
		}
		return nil, err
	}
	out := make([]Peer, 0, len(ps))
	for _, p := range ps {
		if p.Refused != nil || p.State != staging.StateReady {
			continue
		}
		out = append(out, Peer{Pid: p.Pid, Epoch: p.Epoch, Rail: p.Rail, HCA: p.HCA})
	}
	return out, nil
}

func (s *StagingRegistry) Attach(p Peer) (Link, error) {
	ps, err := s.rank.Peers(s.ctx)
	if err != nil {
		return nil, err
	}
	for _, info := range ps {
		if info.Pid == p.Pid && info.Epoch == p.Epoch {
			l, err := s.rank.Attach(s.ctx, info)
			if err != nil {
				return nil, err
			}
			return stagingLink{l}, nil
		}
	}
	return nil, staging.ErrPeerGone
}

func (s *StagingRegistry) Close(ctx context.Context) error { return s.rank.Close(ctx) }

type stagingLink struct{ l *staging.PeerLink }

func (l stagingLink) Lane() *staging.Lane { return l.l.Lane() }
func (l stagingLink) LaneIndex() int      { return l.l.LaneIndex() }
func (l stagingLink) LaneEpoch() uint64   { return l.l.LaneEpoch() }
func (l stagingLink) Staging() uintptr    { return l.l.StagingBase() }
func (l stagingLink) Close() error        { return l.l.Close() }

func (l stagingLink) Health(time.Time) Health {
	err := l.l.Health(staging.MonoNanos())
	switch {
	case err == nil:
		return Live
	case errors.Is(err, staging.ErrPeerStale):
		return Stale
	}
	return Gone
}
