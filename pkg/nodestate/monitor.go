// SPDX-License-Identifier: Apache-2.0

// Package nodestate watches a node's rails: a Monitor re-discovers them on
// a timer and tells its readers when the outcome changes.
package nodestate

import (
	"context"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Discoverer reads the node's rail layout.
type Discoverer interface {
	Discover(ctx context.Context) (Discovery, error)
}

// Discovery is what one successful discovery found.
type Discovery struct {
	// RailMap is the rail map: compact JSON object, raw HCA name →
	// canonical rail, the value of contract.EnvRailMap.
	RailMap string
	// Healthy is whether at least one railed HCA port is ACTIVE.
	Healthy bool
	// Summary describes the layout.
	Summary Summary
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
	// RailMap is the rail map of the latest successful discovery, empty
	// before one succeeded.
	RailMap string
	// Summary is the latest successful discovery's.
	Summary Summary
	// Err is the latest discovery's error.
	Err error
}

// Monitor re-discovers the node on a timer and publishes each changed state.
type Monitor struct {
	discoverer Discoverer
	interval   time.Duration
	timeout    time.Duration
	observe    func(NodeState)
	log        klog.Logger

	mu      sync.Mutex
	state   NodeState
	changed chan struct{}
}

// NewMonitor returns a Monitor that runs d every interval. observe, when not
// nil, is called with every changed state; log receives a line per change.
func NewMonitor(d Discoverer, interval time.Duration, observe func(NodeState), log klog.Logger) *Monitor {
	timeout := interval
	if timeout < 10*time.Second {
		timeout = 10 * time.Second
	}
	return &Monitor{discoverer: d, interval: interval, timeout: timeout, observe: observe, log: log, changed: make(chan struct{})}
}

// State returns the current state and a channel closed at the next change.
func (m *Monitor) State() (NodeState, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state, m.changed
}

// Run discovers at once, then every interval, until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		m.discoverOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Monitor) discoverOnce(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, m.timeout)
	d, err := m.discoverer.Discover(dctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	m.update(d, err)
}

func (m *Monitor) update(d Discovery, err error) {
	m.mu.Lock()
	prev := m.state
	next := NodeState{Discovered: true, Healthy: err == nil && d.Healthy, RailMap: prev.RailMap, Summary: prev.Summary, Err: err}
	if err == nil {
		next.RailMap, next.Summary = d.RailMap, d.Summary
	}
	same := prev.Discovered && prev.Healthy == next.Healthy && prev.RailMap == next.RailMap &&
		prev.Summary == next.Summary && errString(prev.Err) == errString(next.Err)
	if same {
		m.mu.Unlock()
		return
	}
	m.state = next
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()

	switch {
	case err != nil:
		m.log.Error(err, "Node discovery failed; devices unhealthy")
	case !next.Healthy:
		m.log.Info("No railed HCA port is ACTIVE; devices unhealthy", "railMap", next.RailMap)
	default:
		m.log.Info("Node discovered; devices healthy", "railMap", next.RailMap, "recovered", prev.Discovered && !prev.Healthy)
	}
	if m.observe != nil {
		m.observe(next)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
