// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/relay"
)

// event is one line a child prints for the parent.
type event struct {
	Event string `json:"event"`
	Pid   int    `json:"pid,omitempty"`
	Addr  string `json:"addr,omitempty"`
	Error string `json:"error,omitempty"`
	OK    bool   `json:"ok,omitempty"`
	// Routed reports that every rail this rank writes to has a relay.
	Routed bool        `json:"routed,omitempty"`
	Result *rankResult `json:"result,omitempty"`
	Idle   *idleResult `json:"idle,omitempty"`
	// The CUDA path's reports.
	Open    *openResult    `json:"open,omitempty"`
	Raw     *rawResult     `json:"raw,omitempty"`
	Latency *latencyResult `json:"latency,omitempty"`
	Rows    []Row          `json:"rows,omitempty"`
	// Times are the engine's last Pieces' times (relay.Engine.PieceTimes).
	Times []relay.PieceTimes `json:"times,omitempty"`
}

func emit(ev event) {
	b, _ := json.Marshal(ev)
	fmt.Fprintln(os.Stdout, string(b))
}

// commands reads the parent's one-word commands from stdin.
func commands() <-chan string {
	ch := make(chan string)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			ch <- strings.TrimSpace(sc.Text())
		}
	}()
	return ch
}

func readLayout(path string) (*layout, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var l layout
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("layout %s: %w", path, err)
	}
	return &l, nil
}

// mapBuffer returns n bytes of anonymous memory outside the Go heap (the
// stand-in for device memory and for a remote registered region).
func mapBuffer(n uint64) ([]byte, error) {
	if n == 0 {
		n = 1
	}
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes: %w", n, err)
	}
	return b, nil
}

// threadRuns is how many times thread tid was put on a CPU (its
// schedstat's third field): one per wake-up, and one per preemption.
func threadRuns(tid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/schedstat", tid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	var n uint64
	if len(f) < 3 {
		return 0
	}
	if _, err := fmt.Sscan(f[2], &n); err != nil {
		return 0
	}
	return n
}

// cpuTime is the CPU time in seconds of one thread (tid > 0, from its
// schedstat, in nanoseconds) or of the whole process (tid 0, getrusage).
func cpuTime(tid int) (float64, error) {
	if tid == 0 {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			return 0, err
		}
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9, nil
	}
	path := fmt.Sprintf("/proc/self/task/%d/schedstat", tid)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, fmt.Errorf("%s: empty", path)
	}
	var ns uint64
	if _, err := fmt.Sscan(f[0], &ns); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return float64(ns) / 1e9, nil
}
