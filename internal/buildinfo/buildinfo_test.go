// SPDX-License-Identifier: Apache-2.0

package buildinfo

import (
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pxn-project/pxn/internal/version"
)

func TestBuildInfoGauge(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := Register(reg); err != nil {
		t.Fatalf("second registration: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "pxn_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one pxn_build_info series", mfs)
	}
	m := mfs[0].GetMetric()[0]
	if v := m.GetGauge().GetValue(); v != 1 {
		t.Errorf("value %v, want 1", v)
	}
	want := map[string]string{"version": version.String(), "revision": version.Revision(), "goversion": runtime.Version()}
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	if len(got) != len(want) {
		t.Errorf("labels %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("label %s=%q, want %q", k, got[k], v)
		}
	}
}
