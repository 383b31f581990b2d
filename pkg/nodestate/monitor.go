// SPDX-License-Identifier: Apache-2.0

// Package nodestate watches a node's rails: a Monitor re-discovers them on
// a timer, and at once when the host's fingerprint changes, and tells its
// readers when the outcome changes. The agent, the device plugin and the
// DRA driver all read the node through it.
package nodestate

import (
	"context"
	"reflect"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/rail"
)

// Discoverer reads the node's rail layout.
type Discoverer interface {
	Discover(ctx context.Context) (*rail.Layout, error)
}

// Fingerprinter is a Discoverer that can tell cheaply whether the host
// changed: a Monitor with a poll interval rediscovers as soon as the
// fingerprint differs from the one taken before the last discovery.
type Fingerprinter interface {
	Fingerprint() (string, error)
}

// Summary is a node's layout in counts and words.
type Summary struct {
	Rails, HCAs, GPUs int
	// Strategy is the rail strategy that named the rails.
	Strategy string
	// Detail says why the rails are or are not ready.
	Detail string
}

// NodeState is the outcome of the latest discovery.
type NodeState struct {
	// Discovered is false until the first discovery has finished.
	Discovered bool
	// Healthy is true when the latest discovery succeeded and found an ACTIVE
	// railed port.
	Healthy bool
	// RailMap is the rail map of the latest successful discovery: compact
	// JSON object, raw HCA name → canonical rail, the value of
	// contract.EnvRailMap; empty before one succeeded.
	RailMap string
	// Summary is the latest successful discovery's.
	Summary Summary
	// Layout is the latest successful discovery's layout, nil before one
	// succeeded. Every reader shares it: read it, never change it.
	Layout *rail.Layout
	// Err is the latest discovery's error.
	Err error
}

// Options configure a Monitor.
type Options struct {
	// Interval is the period of rediscovery.
	Interval time.Duration
	// PollInterval, when positive and the Discoverer is a Fingerprinter, is
	// the period of the fingerprint check.
	PollInterval time.Duration
	// Observe, when not nil, is called after every discovery with the state
	// it left, changed or not.
	Observe func(NodeState)
	// Logger receives a line per change of state.
	Logger klog.Logger
}

// Monitor re-discovers the node and publishes each changed state.
type Monitor struct {
	discoverer Discoverer
	opts       Options
	timeout    time.Duration

	mu      sync.Mutex
	state   NodeState
	changed chan struct{}
}

// NewMonitor returns a Monitor of d.
func NewMonitor(d Discoverer, o Options) *Monitor {
	timeout := max(o.Interval, 10*time.Second)
	return &Monitor{discoverer: d, opts: o, timeout: timeout, changed: make(chan struct{})}
}

// State returns the current state and a channel closed at the next change.
func (m *Monitor) State() (NodeState, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state, m.changed
}

// Run discovers at once, then every interval and whenever the fingerprint
// changes, until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	fp := m.discover(ctx)
	t := time.NewTicker(m.opts.Interval)
	defer t.Stop()
	var poll <-chan time.Time
	if f := m.fingerprinter(); f != nil {
		p := time.NewTicker(m.opts.PollInterval)
		defer p.Stop()
		poll = p.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fp = m.discover(ctx)
		case <-poll:
			now, err := m.fingerprinter().Fingerprint()
			if err != nil {
				m.opts.Logger.Error(err, "Fingerprint failed")
				continue
			}
			if now != fp {
				m.opts.Logger.Info("Host changed, rediscovering")
				fp = m.discover(ctx)
			}
		}
	}
}

// fingerprinter is the discoverer when the monitor polls its fingerprint,
// else nil.
func (m *Monitor) fingerprinter() Fingerprinter {
	f, ok := m.discoverer.(Fingerprinter)
	if !ok || m.opts.PollInterval <= 0 {
		return nil
	}
	return f
}

// discover runs one discovery and returns the fingerprint taken just before
// it, so that a change racing with the discovery is seen by the next poll.
func (m *Monitor) discover(ctx context.Context) string {
	var fp string
	if f := m.fingerprinter(); f != nil {
		var err error
		if fp, err = f.Fingerprint(); err != nil {
			m.opts.Logger.Error(err, "Fingerprint failed")
		}
	}
	m.discoverOnce(ctx)
	return fp
}

func (m *Monitor) discoverOnce(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, m.timeout)
	l, err := m.discoverer.Discover(dctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	m.update(l, err)
}

func (m *Monitor) update(l *rail.Layout, err error) {
	m.mu.Lock()
	prev := m.state
	next := NodeState{Discovered: true, RailMap: prev.RailMap, Summary: prev.Summary, Layout: prev.Layout, Err: err}
	if err == nil {
		_, detail := l.Ready()
		next.Healthy = l.Healthy()
		next.RailMap = l.RailMapJSON()
		next.Summary = Summary{Rails: l.Rails, HCAs: len(l.HCAs), GPUs: len(l.GPUs), Strategy: l.Strategy, Detail: detail}
		next.Layout = l
	}
	same := prev.Discovered && prev.Healthy == next.Healthy && errString(prev.Err) == errString(next.Err) &&
		reflect.DeepEqual(prev.Layout, next.Layout)
	if same {
		next = prev
	} else {
		m.state = next
		close(m.changed)
		m.changed = make(chan struct{})
	}
	m.mu.Unlock()

	if !same {
		m.logChange(prev, next)
	}
	if m.opts.Observe != nil {
		m.opts.Observe(next)
	}
}

func (m *Monitor) logChange(prev, next NodeState) {
	log := m.opts.Logger
	if next.Err == nil && (prev.Layout == nil || !slices.Equal(prev.Layout.Warnings, next.Layout.Warnings)) {
		for _, w := range next.Layout.Warnings {
			log.Info("Rail discovery warning", "warning", w)
		}
	}
	switch {
	case next.Err != nil:
		log.Error(next.Err, "Rail discovery failed; the node is unhealthy")
	case !next.Healthy:
		log.Info("No railed HCA port is ACTIVE; the node is unhealthy", "railMap", next.RailMap)
	default:
		log.Info("Rails discovered; the node is healthy", "railMap", next.RailMap, "rails", next.Summary.Rails,
			"recovered", prev.Discovered && !prev.Healthy)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
