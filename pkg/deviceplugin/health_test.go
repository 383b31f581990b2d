// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"context"
	"errors"
	"testing"

	"k8s.io/klog/v2"
)

type scriptedDiscoverer struct {
	railMap string
	healthy bool
	err     error
}

func (d *scriptedDiscoverer) Discover(context.Context) (string, bool, error) {
	return d.railMap, d.healthy, d.err
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
		err         error
		wantHealthy bool
		wantRailMap string
		wantChange  bool
	}{
		{"first discovery fails", "", false, errors.New("no sysfs"), false, "", true},
		{"recovers", `{"a":"r0"}`, true, nil, true, `{"a":"r0"}`, true},
		{"unchanged", `{"a":"r0"}`, true, nil, true, `{"a":"r0"}`, false},
		{"all ports down", `{"a":"r0"}`, false, nil, false, `{"a":"r0"}`, true},
		{"fails again keeps the last rail map", "", false, errors.New("gone"), false, `{"a":"r0"}`, true},
		{"healthy again", `{"a":"r0"}`, true, nil, true, `{"a":"r0"}`, true},
	}
	for _, s := range steps {
		d.railMap, d.healthy, d.err = s.railMap, s.healthy, s.err
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
		if !st.Discovered || st.Healthy != s.wantHealthy || st.RailMap != s.wantRailMap {
			t.Fatalf("%s: state %+v", s.name, st)
		}
	}
	if len(observed) != 5 {
		t.Fatalf("observer saw %d states, want 5", len(observed))
	}
}
