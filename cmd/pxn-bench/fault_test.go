// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/bench"
)

// A three-minute soak of six ranks with a fault (a kill, a graceful
// restart or a SIGSTOP stall) every second on average: the soak itself
// must find no violation (graceful restarts included, which must close
// without error, and failed tasks' destinations, which must hold their own
// bytes or none), and must have checked bytes and injected every kind of
// fault. The seed fixes the sequence of the faults' kinds, however loaded
// the machine (a fault whose rank is down goes to the next rank up): seed
// 21 has each kind among its first three, within 6 s. The long runs are in
// docs/reliability.md.
func TestSoakShort(t *testing.T) {
	out := filepath.Join(t.TempDir(), "soak.json")
	cmd := exec.Command(benchBin, "soak", "--ranks", "6", "--duration", "3m", "--fault-every", "1s", "--per-target", "2", "--seed", "21", "--json", out)
	b, err := cmd.CombinedOutput()
	data, rerr := os.ReadFile(out)
	if rerr != nil {
		t.Fatalf("soak: %v, no summary: %v\n%s", err, rerr, lastLines(string(b), 40))
	}
	var sum bench.SoakSummary
	if err := json.Unmarshal(data, &sum); err != nil {
		t.Fatal(err)
	}
	t.Logf("soak summary: %s", data)
	if err != nil || len(sum.Violations) > 0 {
		t.Fatalf("soak failed (%v): violations %q", err, sum.Violations)
	}
	if sum.Rounds == 0 || sum.VerifiedBytes == 0 || sum.ViaPXN == 0 {
		t.Errorf("soak checked nothing: %+v", sum)
	}
	for _, f := range []string{"kill", "restart", "stall"} {
		if sum.Faults[f] == 0 {
			t.Errorf("no %s fault injected: %v", f, sum.Faults)
		}
	}
	if sum.Completed+sum.Failed != sum.Tasks {
		t.Errorf("%d completed + %d failed != %d tasks", sum.Completed, sum.Failed, sum.Tasks)
	}
}

// lastLines is the end of a command's output, at most n lines.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
