// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"strings"
	"testing"
)

func TestShareRow(t *testing.T) {
	if _, ok := shareRow("", &phaseResult{}, false); ok {
		t.Fatal("a row for ranks without device arenas")
	}
	var p phaseResult
	for _, s := range []shareCounts{{Own: "fd", FD: 1}, {Own: "fd", FD: 1}, {Own: "ipc", IPC: 1, FailedFD: 1}} {
		p.shares.add(s)
	}
	r, ok := shareRow("P1 ", &p, true)
	if !ok || r.Value != 2 || r.Unit != "of 3" || r.Verified {
		t.Fatalf("row %+v", r)
	}
	for _, w := range []string{"P1 relays' arenas mapped by descriptor", "arena shares: fd 2, ipc 1", "failed maps: fd 1, ipc 0", "own arenas: 2 by descriptor, 1 by IPC handle", "PID namespace of its own"} {
		if !strings.Contains(r.Scenario+"; "+r.Note, w) {
			t.Errorf("row %q; %q lacks %q", r.Scenario, r.Note, w)
		}
	}
	p.shares.FailedFD = 0
	if r, _ := shareRow("", &p, false); !r.Verified || !strings.Contains(r.Note, "one PID namespace") {
		t.Fatalf("row %+v", r)
	}
}

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
