// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// scenario is one traffic pattern run on a device: the ranks and targets
// as processes, an engine phase and, with bare, a phase with
// MC_PXN_ENABLE=0 whose transfers go through the hop alone.
type scenario struct {
	// id labels a suite's scenario (P1, P3); empty for a single run.
	id      string
	pattern string
	ranks   int
	bytes   uint64
	block   uint64
	// gpus is each rank's and target's GPU on the CUDA device.
	gpus []int
	// rate caps the emulated NIC, in GB/s.
	rate float64
	// raw adds a raw copy of the same traffic; bare adds the baseline
	// phase; idle measures the pumps' idle CPU; warm runs the transfer
	// once untimed first; again repeats the engine phase's transfer to
	// count allocations in steady state; p6 opens the ranks one at a time
	// and reports what the open cost with MC_PXN_ENABLE=0; latency is the
	// number of timed 10 KiB writes each way.
	raw, bare, idle, warm, again, p6 bool
	latency                          int
	// reps repeats the timed transfer (and the raw copy) back to back, so
	// the rate is the steady state rather than a fill and a drain.
	reps int
	note string
	// kv, when set, makes the requests KV-cache-shaped (pattern "kv").
	kv *KVOptions
	// hold keeps the engine phase's ranks open after their last step.
	hold time.Duration
}

func parseSuite(s string) (map[string]bool, error) {
	want := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		switch p = strings.ToLower(strings.TrimSpace(p)); p {
		case "all":
			want["p1"], want["p2"], want["p3"] = true, true, true
		case "p1", "p2", "p3", "p8", "p9", "p10", "p14-1to1", "p14-7to1", "p14-a2a":
			want[p] = true
		case "p14":
			for _, part := range p14Parts {
				want[part] = true
			}
		default:
			return nil, fmt.Errorf("--suite %q: want all (p1, p2, p3) or a list of p1, p2, p3, p8, p9, p10, p14 (or one of its parts: %s)", s, strings.Join(p14Parts, ", "))
		}
	}
	return want, nil
}

// otherGPU is the senders' GPU in the suites: GPU 1, or GPU 0 when it is
// the only one.
func otherGPU(ngpu int) int { return min(1, ngpu-1) }

// fanInGPUs places a relay (rank 0) and n senders: the relay on GPU 0,
// every sender on otherGPU, so the first hop crosses NVLink when there
// are two GPUs.
func fanInGPUs(n, ngpu int) []int {
	g := []int{0}
	for range n {
		g = append(g, otherGPU(ngpu))
	}
	return g
}

// suiteRuns are the scenarios of the performance contract. With two GPUs
// the relay (rank 0) has GPU 0 and every sender GPU 1, so the first hop
// crosses NVLink and the seven senders of P3 share one GPU.
func suiteRuns(want map[string]bool, ngpu int) []scenario {
	other := otherGPU(ngpu)
	senders := func(n int) []int { return fanInGPUs(n, ngpu) }
	var runs []scenario
	if want["p1"] {
		runs = append(runs,
			scenario{id: "P1", pattern: "fan-in", ranks: 2, bytes: 4 << 30, block: 8 << 20, gpus: senders(1),
				raw: true, bare: true, idle: true, warm: true, p6: true, latency: 5000, reps: 4,
				note: "second hop uncapped (intra-GPU copy into the target); the 4 GiB transfer timed 4 times back to back"},
			scenario{id: "cross-rail", pattern: "cross-rail", ranks: 2, bytes: 1 << 30, block: 8 << 20, gpus: []int{0, other}, warm: true, bare: true,
				note: "each rank sends and relays; P13: the ratio is to the same traffic through the emulated NIC alone"},
		)
	}
	if want["p3"] {
		runs = append(runs,
			scenario{id: "P3", pattern: "fan-in", ranks: 2, bytes: 2 << 30, block: 8 << 20, gpus: senders(1), rate: 50, warm: true},
			scenario{id: "P3", pattern: "fan-in", ranks: 8, bytes: 1 << 30, block: 8 << 20, gpus: senders(7), rate: 50, warm: true,
				note: fmt.Sprintf("the seven senders share GPU %d", other)},
		)
	}
	if want["p8"] {
		runs = append(runs, p8Runs(ngpu)...)
	}
	return append(runs, kvSuiteRuns(want, ngpu)...)
}

// p8Blocks are P8's request sizes.
var p8Blocks = []uint64{4 << 10, 64 << 10, 8 << 20}

// p8Runs are P8's scenarios: each of two ranks writes 1 GiB to the target
// on its own rail in requests of every P8 size, four times back to back,
// through the engine (every write direct) and through the emulated NIC
// alone, which posts as the engine does (transferBare). The NIC is
// uncapped: at a wire rate both would wait on the wire, and the ratio
// would hide what the engine costs.
func p8Runs(ngpu int) []scenario {
	var runs []scenario
	for _, b := range p8Blocks {
		runs = append(runs, scenario{id: "P8", pattern: "same-rail", ranks: 2, bytes: 1 << 30, block: b, gpus: []int{0, otherGPU(ngpu)},
			bare: true, warm: true, reps: 4,
			note: "NIC uncapped; the baseline posts as the engine does (16 requests a call, at most 32 writes a hop Submit, one write a request)"})
	}
	return runs
}

// rankGPUs is --gpus, or rank r on GPU r % ngpu.
func rankGPUs(s string, ranks, ngpu int) ([]int, error) {
	g := make([]int, ranks)
	if s == "" {
		for r := range g {
			g[r] = r % ngpu
		}
		return g, nil
	}
	f := strings.Split(s, ",")
	if len(f) != ranks {
		return nil, fmt.Errorf("--gpus %q: %d entries for %d ranks", s, len(f), ranks)
	}
	for r, v := range f {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n >= ngpu {
			return nil, fmt.Errorf("--gpus %q: entry %d: want a GPU ordinal below %d", s, r, ngpu)
		}
		g[r] = n
	}
	return g, nil
}

// gpu is the GPU of rank and target k (0 where the scenario names none).
func (s scenario) gpu(k int) int {
	if k < len(s.gpus) {
		return s.gpus[k]
	}
	return 0
}
