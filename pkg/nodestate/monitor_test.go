// SPDX-License-Identifier: Apache-2.0

package nodestate

import (
	"context"
	"errors"
	"testing"

	"k8s.io/klog/v2"
)

type scriptedDiscoverer struct {
	railMap string
	healthy bool
	gpus    int
	err     error
}

func (d *scriptedDiscoverer) Discover(context.Context) (Discovery, error) {
	return Discovery{RailMap: d.railMap, Healthy: d.healthy, Summary: Summary{GPUs: d.gpus}}, d.err
}

func TestMonitorStates(t *testing.T) {
	d := &scriptedDiscoverer{}
	var observed []NodeState
	m := NewMonitor(d, 1, func(s NodeState) { observed = append(observed, s) }, klog.Background())
	ctx := context.Background()

	st, changed := m.State()
	if st.Discovered {
		t.Fatal("discovered before the first discovery")
	}

	steps := []struct {
		name        string
		railMap     string
		healthy     bool
		gpus        int
		err         error
		wantHealthy bool
		wantRailMap string
		wantGPUs    int
		wantChange  bool
	}{
		{"first discovery fails", "", false, 0, errors.New("no sysfs"), false, "", 0, true},
		{"recovers", `{"a":"r0"}`, true, 2, nil, true, `{"a":"r0"}`, 2, true},
		{"unchanged", `{"a":"r0"}`, true, 2, nil, true, `{"a":"r0"}`, 2, false},
		{"a GPU more", `{"a":"r0"}`, true, 3, nil, true, `{"a":"r0"}`, 3, true},
		{"all ports down", `{"a":"r0"}`, false, 3, nil, false, `{"a":"r0"}`, 3, true},
		{"fails again keeps the last rail map", "", false, 0, errors.New("gone"), false, `{"a":"r0"}`, 3, true},
		{"healthy again", `{"a":"r0"}`, true, 3, nil, true, `{"a":"r0"}`, 3, true},
	}
	for _, s := range steps {
		d.railMap, d.healthy, d.gpus, d.err = s.railMap, s.healthy, s.gpus, s.err
		m.discoverOnce(ctx)
		var next <-chan struct{}
		st, next = m.State()
		select {
		case <-changed:
			if !s.wantChange {
				t.Fatalf("%s: change signalled", s.name)
			}
		default:
			if s.wantChange {
				t.Fatalf("%s: no change signalled", s.name)
			}
		}
		changed = next
		if !st.Discovered || st.Healthy != s.wantHealthy || st.RailMap != s.wantRailMap || st.Summary.GPUs != s.wantGPUs {
			t.Fatalf("%s: state %+v", s.name, st)
		}
	}
	if len(observed) != 6 {
		t.Fatalf("observer saw %d states, want 6", len(observed))
	}
}
