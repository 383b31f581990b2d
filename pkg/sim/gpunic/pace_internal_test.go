// SPDX-License-Identifier: Apache-2.0

package gpunic

import "testing"

func TestNICPace(t *testing.T) {
	cases := []struct {
		name            string
		rate            float64
		opCost          int64
		now             []int64
		bytes           []uint64
		want            []int64
		wantWireFreeEnd int64
	}{
		{"bytes at R, queued ops wait for the wire", 50, 0, []int64{1000, 1500, 10_000}, []uint64{50_000, 100_000, 50}, []int64{2000, 4000, 10_001}, 10_001},
		{"every op also pays its cost", 50, 10, []int64{1000, 1000, 1000}, []uint64{16_400, 16_400, 0}, []int64{1338, 1676, 1686}, 1686},
		{"no wire: no pacing", 0, 10, []int64{5, 6}, []uint64{1 << 30, 1}, []int64{0, 0}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := &NIC{rate: c.rate, opCost: c.opCost}
			for i := range c.now {
				if f := n.pace(c.now[i], c.bytes[i]); f != c.want[i] {
					t.Errorf("op %d (%d bytes at %d ns) finishes at %d, want %d", i, c.bytes[i], c.now[i], f, c.want[i])
				}
			}
			if n.wire != c.wantWireFreeEnd {
				t.Errorf("wire free at %d, want %d", n.wire, c.wantWireFreeEnd)
			}
		})
	}
}
