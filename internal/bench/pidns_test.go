// SPDX-License-Identifier: Apache-2.0

package bench

import (
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
