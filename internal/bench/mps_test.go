// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestDetectMPS(t *testing.T) {
	env := func(dir string) func(string) string {
		return func(k string) string {
			if k == "CUDA_MPS_PIPE_DIRECTORY" {
				return dir
			}
			return ""
		}
	}
	withControl := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(withControl, "control"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A unix socket's path must be short: the test's own temporary
	// folder can be too long for it.
	withSocket, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(withSocket) })
	l, err := net.Listen("unix", filepath.Join(withSocket, "server"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	regular := t.TempDir()
	if err := os.WriteFile(filepath.Join(regular, "control"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		dir  string
		on   bool
		why  string
	}{
		{"the control pipe", withControl, true, "holds the daemon's control pipe"},
		{"a socket of the daemon", withSocket, true, "holds the daemon's pipes"},
		{"a regular file named control", regular, false, "holds no daemon pipe"},
		{"an empty folder", t.TempDir(), false, "holds no daemon pipe"},
		{"no such folder", filepath.Join(regular, "missing"), false, "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := detectMPS(env(tc.dir))
			if m.on != tc.on || !strings.Contains(m.why, tc.why) || !strings.Contains(m.why, "CUDA_MPS_PIPE_DIRECTORY="+tc.dir) {
				t.Fatalf("detectMPS(%s) = %v (%s), want %v and %q", tc.dir, m, m.why, tc.on, tc.why)
			}
		})
	}
	if m := detectMPS(env("")); !strings.Contains(m.why, mpsDefaultPipes) {
		t.Fatalf("without the variable: %q, want the default folder named", m.why)
	}
}

func TestMPSWarning(t *testing.T) {
	off, on := mpsState{why: "none here"}, mpsState{on: true}
	oneGPU := scenario{ranks: 2, gpus: []int{0, 0}}
	twoGPUs := scenario{ranks: 2, gpus: []int{0, 1}}
	fanIn := scenario{ranks: 8, gpus: []int{0, 1, 1, 1, 1, 1, 1, 1}}
	tests := []struct {
		name string
		mps  mpsState
		runs []scenario
		want string
	}{
		{"shared GPU without MPS", off, []scenario{twoGPUs, oneGPU}, "2 ranks share GPU 0 without MPS (none here)"},
		{"seven senders on one GPU", off, []scenario{fanIn}, "7 ranks share GPU 1 without MPS"},
		{"shared GPU under MPS", on, []scenario{oneGPU, fanIn}, ""},
		{"a GPU each", off, []scenario{twoGPUs}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := mpsWarning(tc.mps, tc.runs)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("warning %q, want one containing %q", got, tc.want)
			}
		})
	}
}

// TestRowsSayMPS: rows of the CUDA path carry an MPS column and field, and
// the engine settings the flags changed follow the table.
func TestRowsSayMPS(t *testing.T) {
	var b bytes.Buffer
	printRows(&b, []Row{
		{Scenario: "P3 fan-in", Bytes: 1 << 30, GBps: 49.9, Verified: true, MPS: "on", Settings: "MC_PXN_FIRST_PIECE_KIB=8192"},
		{Scenario: "P10 p50", Value: 95, Unit: "µs", Verified: true, MPS: "on", Settings: "MC_PXN_FIRST_PIECE_KIB=8192"},
	})
	out := b.String()
	lines := strings.Split(out, "\n")
	if !strings.HasSuffix(strings.TrimSpace(lines[0]), "MPS") || !strings.HasSuffix(strings.TrimSpace(lines[1]), "on") || !strings.HasSuffix(strings.TrimSpace(lines[2]), "on") {
		t.Fatalf("no MPS column:\n%s", out)
	}
	if !strings.Contains(out, "settings: MC_PXN_FIRST_PIECE_KIB=8192") {
		t.Fatalf("settings not printed:\n%s", out)
	}
	b.Reset()
	printRows(&b, []Row{{Scenario: "cross-rail", Bytes: 1 << 20, Verified: true}})
	if strings.Contains(b.String(), "MPS") {
		t.Fatalf("a host-path table with an MPS column:\n%s", b.String())
	}
}
