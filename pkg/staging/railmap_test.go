// SPDX-License-Identifier: Apache-2.0

package staging

import "testing"

func TestCanonicalRail(t *testing.T) {
	m := map[string]string{"mlx5_0": "rail0", "mlx5_3": "rail1"}
	tests := []struct {
		m         map[string]string
		hca, want string
	}{
		{m, "mlx5_0", "rail0"},
		{m, "mlx5_3", "rail1"},
		{m, "mlx5_1", "mlx5_1"},
		{m, "", ""},
		{nil, "mlx5_0", "mlx5_0"},
	}
	for _, tc := range tests {
		if got := CanonicalRail(tc.m, tc.hca); got != tc.want {
			t.Errorf("CanonicalRail(%v, %q) = %q, want %q", tc.m, tc.hca, got, tc.want)
		}
	}
}
