// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"slices"
	"testing"

	"github.com/pxn-project/pxn/pkg/rail"
)

func TestRailDeviceNames(t *testing.T) {
	for hca, want := range map[string]string{
		"mlx5_0":    "hca-mlx5-0",
		"ibp25s0":   "hca-ibp25s0",
		"MLX5.bond": "hca-mlx5-bond",
	} {
		if got := RailDeviceName(hca); got != want {
			t.Errorf("RailDeviceName(%q) = %q, want %q", hca, got, want)
		}
	}
	// Two HCAs whose names fold to one device name: the first in bus order
	// keeps it, the second gets no device; an HCA without a rail gets none.
	l := &rail.Layout{HCAs: []rail.HCA{
		{Name: "mlx5_0", Rail: "rail0"}, {Name: "mlx5-0", Rail: "rail1"}, {Name: "mlx5_1"}, {Name: "mlx5_2", Rail: "rail2"},
	}}
	var got []string
	for _, r := range railDevices(l) {
		got = append(got, r.name+"="+r.hca.Name)
	}
	if want := []string{"hca-mlx5-0=mlx5_0", "hca-mlx5-2=mlx5_2"}; !slices.Equal(got, want) {
		t.Errorf("rail devices %v, want %v", got, want)
	}
}

func TestLinkRateGbps(t *testing.T) {
	for rate, want := range map[string]int64{
		"400 Gb/sec (4X NDR)": 400,
		"200 Gb/sec (4X HDR)": 200,
		"10 Gb/sec (4X SDR)":  10,
		"2.5 Gb/sec (1X SDR)": -1,
		"":                    -1,
		"fast":                -1,
		"0 Gb/sec":            -1,
		"400 Mb/sec":          -1,
	} {
		got, ok := linkRateGbps(rate)
		if !ok {
			got = -1
		}
		if got != want {
			t.Errorf("linkRateGbps(%q) = %d, want %d", rate, got, want)
		}
	}
}
