// SPDX-License-Identifier: Apache-2.0

package nodestate

import (
	"context"
	"errors"
	"testing"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/rail"
)

// scriptedDiscoverer reports a node of one HCA on rail0 and some GPUs.
type scriptedDiscoverer struct {
	active bool
	gpus   int
	err    error
}

func (d *scriptedDiscoverer) Discover(context.Context) (*rail.Layout, error) {
	if d.err != nil {
		return nil, d.err
	}
	state := rail.StateActive
	if !d.active {
		state = "DOWN"
	}
	return &rail.Layout{Rails: 1, Strategy: rail.StrategyPCIOrder, GPUs: make([]rail.GPU, d.gpus),
		HCAs:    []rail.HCA{{Name: "mlx5_0", State: state, Port: 1, Rail: "rail0"}},
		RailMap: map[string]string{"mlx5_0": "rail0"}}, nil
}

func TestMonitorStates(t *testing.T) {
	const railMap = `{"mlx5_0":"rail0"}`
	d := &scriptedDiscoverer{}
	var observed []NodeState
	m := NewMonitor(d, Options{Interval: 1, Observe: func(s NodeState) { observed = append(observed, s) }, Logger: klog.Background()})
	ctx := context.Background()

	st, changed := m.State()
	if st.Discovered {
		t.Fatal("discovered before the first discovery")
	}

	steps := []struct {
		name        string
		active      bool
		gpus        int
		err         error
		wantHealthy bool
		wantRailMap string
		wantGPUs    int
		wantChange  bool
	}{
		{"first discovery fails", false, 0, errors.New("no sysfs"), false, "", 0, true},
		{"recovers", true, 2, nil, true, railMap, 2, true},
		{"unchanged", true, 2, nil, true, railMap, 2, false},
		{"a GPU more", true, 3, nil, true, railMap, 3, true},
		{"all ports down", false, 3, nil, false, railMap, 3, true},
		{"fails again keeps the last rail map", false, 0, errors.New("gone"), false, railMap, 3, true},
		{"fails the same way", false, 0, errors.New("gone"), false, railMap, 3, false},
		{"healthy again", true, 3, nil, true, railMap, 3, true},
	}
	for i, s := range steps {
		d.active, d.gpus, d.err = s.active, s.gpus, s.err
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
		if (st.Layout == nil) != (s.wantRailMap == "") || st.Layout != nil && len(st.Layout.GPUs) != s.wantGPUs {
			t.Fatalf("%s: layout %+v", s.name, st.Layout)
		}
		if len(observed) != i+1 || observed[i].Healthy != st.Healthy || observed[i].Summary != st.Summary {
			t.Fatalf("%s: observer saw %d states, the last %+v; want %d, the last %+v", s.name, len(observed), observed[len(observed)-1], i+1, st)
		}
	}
}

// fingerprinted is a discoverer whose host the test changes: each discovery
// counts, and the fingerprint is the host's version.
type fingerprinted struct {
	scriptedDiscoverer
	host, discoveries int
}

func (f *fingerprinted) Fingerprint() (string, error) { return string(rune('a' + f.host)), nil }

func (f *fingerprinted) Discover(ctx context.Context) (*rail.Layout, error) {
	f.discoveries++
	return f.scriptedDiscoverer.Discover(ctx)
}

// TestMonitorFingerprint: a discovery keeps the fingerprint taken before it;
// only the poll of a monitor with a poll interval reads it.
func TestMonitorFingerprint(t *testing.T) {
	f := &fingerprinted{scriptedDiscoverer: scriptedDiscoverer{active: true}}
	m := NewMonitor(f, Options{Interval: 1, PollInterval: 1, Logger: klog.Background()})
	fp := m.discover(context.Background())
	if fp != "a" || f.discoveries != 1 {
		t.Fatalf("fingerprint %q after %d discoveries, want a after 1", fp, f.discoveries)
	}
	if m.fingerprinter() == nil {
		t.Fatal("a monitor with a poll interval does not poll its fingerprinter")
	}
	if NewMonitor(f, Options{Interval: 1}).fingerprinter() != nil {
		t.Error("a monitor without a poll interval polls")
	}
	if NewMonitor(&f.scriptedDiscoverer, Options{Interval: 1, PollInterval: 1}).fingerprinter() != nil {
		t.Error("a monitor polls a discoverer that has no fingerprint")
	}
}
