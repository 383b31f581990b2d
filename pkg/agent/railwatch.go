// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"

	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/pxn-project/pxn/pkg/nodestate"
)

// railWatch runs the node's rail monitor for the manager: it counts every
// discovery and wakes the controller after each one, and gives the
// reconciler the latest outcome in the agent's terms.
type railWatch struct {
	monitor *nodestate.Monitor
	events  chan event.TypedGenericEvent[struct{}]
}

func newRailWatch(opts Options, m *metrics, log klog.Logger) *railWatch {
	w := &railWatch{events: make(chan event.TypedGenericEvent[struct{}], 1)}
	w.monitor = nodestate.NewMonitor(opts.Discoverer, nodestate.Options{
		Interval:     opts.Resync,
		PollInterval: opts.PollInterval,
		Logger:       log,
		Observe: func(st nodestate.NodeState) {
			m.discoveries.Inc()
			if st.Err != nil {
				m.errors.WithLabelValues("discover").Inc()
			} else {
				m.rails.Set(float64(st.Summary.Rails))
			}
			select {
			case w.events <- event.TypedGenericEvent[struct{}]{}:
			default: // a wake-up is already pending; it will read the newest state
			}
		},
	})
	return w
}

// snapshot returns the last successful discovery (nil before one) and the
// latest discovery's error.
func (w *railWatch) snapshot() (*Discovery, error) {
	st, _ := w.monitor.State()
	if st.Layout == nil {
		return nil, st.Err
	}
	return NewDiscovery(st.Layout), st.Err
}

// Start implements manager.Runnable.
func (w *railWatch) Start(ctx context.Context) error {
	w.monitor.Run(ctx)
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every node
// runs its own agent.
func (w *railWatch) NeedLeaderElection() bool { return false }
