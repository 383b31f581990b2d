// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"math"
	"testing"
)

// sender is a rank that moved bytesPerMs from startMs to endMs, sampled
// every millisecond.
func sender(rank int, startMs, endMs int64, bytesPerMs uint64) rankResult {
	r := rankResult{Rank: rank, StartNs: startMs * 1e6, EndNs: endMs * 1e6, Bytes: uint64(endMs-startMs) * bytesPerMs}
	for t := startMs; t <= endMs; t++ {
		r.Progress = append(r.Progress, progressSample{Ns: t * 1e6, Bytes: uint64(t-startMs) * bytesPerMs})
	}
	return r
}

func TestShares(t *testing.T) {
	cases := []struct {
		name    string
		senders []rankResult
		wantOK  bool
		want    float64
	}{
		{"equal rates", []rankResult{sender(1, 0, 1000, 10), sender(2, 0, 1000, 10)}, true, 1},
		// The fast sender finishes first: over the window both ran, it
		// had twice the rate, whatever the totals.
		{"one twice as fast", []rankResult{sender(1, 0, 500, 20), sender(2, 0, 1000, 10)}, true, 10.0 / 15},
		// A late start is outside the window and does not count.
		{"late start", []rankResult{sender(1, 0, 1000, 10), sender(2, 300, 1000, 10)}, true, 1},
		{"window too short", []rankResult{sender(1, 0, 40, 10), sender(2, 0, 40, 10)}, false, 1},
		{"no progress reported", []rankResult{{Rank: 1, StartNs: 0, EndNs: 1e9, Bytes: 10}, sender(2, 0, 1000, 10)}, false, 2e-8 / (1e-8 + 1e-5)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ss, _, ok := shares(c.senders)
			if ok != c.wantOK {
				t.Fatalf("window measured %v, want %v", ok, c.wantOK)
			}
			if got := minOverMean(ss); math.Abs(got-c.want) > 0.01*c.want {
				t.Errorf("min/mean %.4f, want %.4f (shares %+v)", got, c.want, ss)
			}
		})
	}
}

func TestBytesAt(t *testing.T) {
	s := []progressSample{{Ns: 10, Bytes: 0}, {Ns: 20, Bytes: 5}, {Ns: 30, Bytes: 9}}
	for _, c := range []struct {
		ns   int64
		want uint64
	}{{5, 0}, {10, 0}, {19, 0}, {20, 5}, {29, 5}, {30, 9}, {100, 9}} {
		if got := bytesAt(s, c.ns); got != c.want {
			t.Errorf("bytesAt(%d) = %d, want %d", c.ns, got, c.want)
		}
	}
}
