// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"testing"
)

// TestBenchPIDNamespaces runs the host path with every rank in a PID and
// mount namespace of its own, as ranks in pods without hostPID: they must
// still find each other and relay, every byte checked by the targets.
func TestBenchPIDNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: --pidns makes PID and mount namespaces, which needs root")
	}
	for _, c := range []struct {
		name string
		args []string
		want uint64
	}{
		{"cross-rail", []string{"--ranks", "2", "--bytes", "8MiB", "--pattern", "cross-rail", "--pidns"}, 2 * 8 << 20},
		{"fan-in", []string{"--ranks", "4", "--bytes", "8MiB", "--pattern", "fan-in", "--pidns"}, 3 * 8 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			rows := runBench(t, c.args...)
			main := rows[0]
			if !main.Verified || main.Failed != 0 || main.RelayedBytes != c.want || main.FallbackBytes != 0 {
				t.Fatalf("main row %+v: want %d bytes relayed, none fallen back, every byte verified", main, c.want)
			}
		})
	}
}
