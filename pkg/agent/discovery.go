// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// discoveryLoop runs discovery at start, every resync and whenever the
// host's fingerprint changes, keeps the latest result, and tells the
// controller through events.
type discoveryLoop struct {
	opts    Options
	metrics *metrics
	events  chan event.TypedGenericEvent[struct{}]
	log     klog.Logger

	mu      sync.Mutex
	last    *Discovery // last successful discovery; nil before the first
	lastErr error      // error of the most recent discovery; nil when it succeeded
}

func newDiscoveryLoop(opts Options, m *metrics, log klog.Logger) *discoveryLoop {
	return &discoveryLoop{opts: opts, metrics: m, log: log, events: make(chan event.TypedGenericEvent[struct{}], 1)}
}

// snapshot returns the last successful discovery and the latest error.
func (l *discoveryLoop) snapshot() (*Discovery, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last, l.lastErr
}

// Start implements manager.Runnable.
func (l *discoveryLoop) Start(ctx context.Context) error {
	fp := l.discover(ctx)
	resync := time.NewTicker(l.opts.Resync)
	defer resync.Stop()
	poll := time.NewTicker(l.opts.PollInterval)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-resync.C:
			fp = l.discover(ctx)
		case <-poll.C:
			now, err := l.opts.Discoverer.Fingerprint()
			if err != nil {
				l.log.Error(err, "fingerprint failed")
				continue
			}
			if now != fp {
				l.log.Info("host changed, rediscovering")
				fp = l.discover(ctx)
			}
		}
	}
}

// discover runs one discovery and returns the fingerprint taken just before
// it, so that a change racing with the discovery is seen by the next poll.
func (l *discoveryLoop) discover(ctx context.Context) string {
	fp, err := l.opts.Discoverer.Fingerprint()
	if err != nil {
		l.log.Error(err, "fingerprint failed")
	}
	d, err := l.opts.Discoverer.Discover(ctx)
	l.metrics.discoveries.Inc()
	l.mu.Lock()
	l.lastErr = err
	if err == nil {
		l.last = d
	}
	l.mu.Unlock()
	if err != nil {
		l.metrics.errors.WithLabelValues("discover").Inc()
		l.log.Error(err, "discovery failed")
	} else {
		l.metrics.rails.Set(float64(d.Layout.Rails))
		for _, w := range d.Warnings {
			l.log.Info("discovery warning", "warning", w)
		}
	}
	select {
	case l.events <- event.TypedGenericEvent[struct{}]{}:
	default: // a wake-up is already pending; it will read the newest result
	}
	return fp
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every node
// runs its own agent.
func (l *discoveryLoop) NeedLeaderElection() bool { return false }
