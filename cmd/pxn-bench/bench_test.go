package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

var benchBin string

// TestMain builds pxn-bench once; the tests run it as a user would, every
// rank and target a separate process.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pxn-bench-test-")
	if err != nil {
		panic(err)
	}
	benchBin = filepath.Join(dir, "pxn-bench")
	out, err := exec.Command("go", "build", "-o", benchBin, ".").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		panic("build pxn-bench: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func runBench(t *testing.T, args ...string) []row {
	t.Helper()
	out := filepath.Join(t.TempDir(), "rows.json")
	// A healthy run must not fall back; on a starved test machine the 1 s
	// default credit timeout can fire, so the healthy cases allow a minute.
	cmd := exec.Command(benchBin, append([]string{"run", "--device", "host", "--credit-timeout", "60000", "--json", out}, args...)...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pxn-bench %v: %v\n%s", args, err, b)
	}
	t.Logf("pxn-bench %v:\n%s", args, b)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rows []row
	if err := json.Unmarshal(data, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 2 {
		t.Fatalf("%d rows", len(rows))
	}
	return rows
}

func TestBenchHealthyPaths(t *testing.T) {
	cases := []struct {
		name        string
		args        []string
		wantRelayed uint64
	}{
		{"same-rail direct", []string{"--ranks", "2", "--bytes", "8MiB", "--pattern", "same-rail"}, 0},
		{"cross-rail 10KiB", []string{"--ranks", "2", "--bytes", "10KiB", "--pattern", "cross-rail"}, 2 * 10 << 10},
		{"cross-rail 8MiB-1", []string{"--ranks", "2", "--bytes", "8388607", "--pattern", "cross-rail"}, 2 * (8<<20 - 1)},
		{"cross-rail 8MiB", []string{"--ranks", "2", "--bytes", "8MiB", "--pattern", "cross-rail"}, 2 * 8 << 20},
		{"cross-rail 8MiB+1", []string{"--ranks", "2", "--bytes", "8388609", "--pattern", "cross-rail"}, 2 * (8<<20 + 1)},
		{"ring rounds 300MiB of 64KiB blocks", []string{"--ranks", "2", "--bytes", "300MiB", "--block", "64KiB", "--pattern", "cross-rail"}, 2 * 300 << 20},
		{"seven senders, one relay", []string{"--ranks", "8", "--bytes", "40MiB", "--pattern", "fan-in"}, 7 * 40 << 20},
		{"all-to-all", []string{"--ranks", "4", "--bytes", "24MiB", "--pattern", "all-to-all"}, 4 * 24 << 20},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows := runBench(t, c.args...)
			main, base := rows[0], rows[1]
			if !main.Verified || !base.Verified || main.Failed != 0 || base.Failed != 0 {
				t.Fatalf("not verified or failed tasks: %+v / %+v", main, base)
			}
			if main.RelayedBytes != c.wantRelayed {
				t.Errorf("relayed %d bytes, want %d", main.RelayedBytes, c.wantRelayed)
			}
			if main.FallbackBytes != 0 {
				t.Errorf("healthy run fell back %d bytes", main.FallbackBytes)
			}
			if main.RelayedBytes+main.DirectBytes != main.Bytes {
				t.Errorf("relayed %d + direct %d != %d bytes", main.RelayedBytes, main.DirectBytes, main.Bytes)
			}
		})
	}
}
