// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
)

// kvRows are a KV scenario's request completion times, through PXN and
// direct: p50 and p99 over every request of every rank.
func kvRows(prefix string, pxn, bare *phaseResult) []Row {
	collect := func(p *phaseResult, sub bool) []float64 {
		var xs []float64
		if p == nil {
			return nil
		}
		for _, r := range p.ranks {
			if sub {
				xs = append(xs, r.SubmitUS...)
			} else {
				xs = append(xs, r.CompletionsUS...)
			}
		}
		return xs
	}
	pc, dc, ps := collect(pxn, false), collect(bare, false), collect(pxn, true)
	if len(pc) == 0 {
		return nil
	}
	p := percentiles(pc)
	ok := pxn.verified && (bare == nil || bare.verified)
	note := fmt.Sprintf("%d requests; through PXN mean/p90/max %.0f/%.0f/%.0f µs; Submit itself p50/p99 %.0f/%.0f µs",
		len(pc), p[2], p[3], p[5], percentiles(ps)[0], percentiles(ps)[1])
	rows := []Row{
		{Scenario: prefix + "request completion through PXN, p50", Value: p[0], Unit: "µs", Verified: ok, Note: note},
		{Scenario: prefix + "request completion through PXN, p99", Value: p[1], Unit: "µs", Verified: ok},
	}
	if len(dc) > 0 {
		d := percentiles(dc)
		rows = append(rows,
			Row{Scenario: prefix + "request completion direct, p50", Value: d[0], Unit: "µs", Verified: ok},
			Row{Scenario: prefix + "request completion direct, p99", Value: d[1], Unit: "µs", Verified: ok},
			Row{Scenario: prefix + "request completion added by PXN, p50", Value: p[0] - d[0], Unit: "µs", Verified: ok},
			Row{Scenario: prefix + "request completion added by PXN, p99", Value: p[1] - d[1], Unit: "µs", Verified: ok},
		)
	}
	return rows
}

func kvTitle(o KVOptions) string {
	shape, err := parseKVShape(o.Shape)
	if err != nil {
		return o.Shape
	}
	return fmt.Sprintf("%s %s, %d requests per sender and target, %d in flight", o.Traffic, shape, o.Requests, o.Inflight)
}

// wireBound is what a traffic can move when every rank has one NIC at
// rate: each sending rank's NIC sends at most rate and each receiving
// target's NIC takes at most rate, so rate times the fewer of the two. Zero
// without a rate.
func wireBound(rate float64, l *layout) (senders, receivers int, gbps float64) {
	send, recv := map[int]bool{}, map[int]bool{}
	for _, t := range l.Transfers {
		if t.Len > 0 {
			send[t.Rank], recv[t.Target] = true, true
		}
	}
	senders, receivers = len(send), len(recv)
	if rate <= 0 {
		return senders, receivers, 0
	}
	return senders, receivers, rate * float64(min(senders, receivers))
}

// wireBaseline is what a scenario's PXN row is compared with when it has a
// direct phase: the same requests direct. Each sender's emulated NIC is
// paced at R, but it models the sender's wire only, and eight emulated
// NICs on one GPU may move more than any set of real ones would, so with a
// wire rate the direct rate counts for at most what one NIC per rank at R
// gives (wireBound): of R for 7→1, of eight times R for all-to-all over
// eight ranks. The name says which of the two the ratio is against, and
// bound is wireBound's (zero without a rate).
func wireBaseline(s scenario, l *layout, hop string, direct float64) (name string, gbps, bound float64) {
	name = "the same requests direct (" + hop + " alone)"
	if s.kv == nil {
		name = "the same traffic direct (" + hop + " alone)"
	}
	senders, receivers, bound := wireBound(s.rate, l)
	if bound <= 0 {
		return name, direct, 0
	}
	what := fmt.Sprintf("one NIC per rank at %g GB/s: %d × %g = %g GB/s (%d sending ranks, %d receiving)",
		s.rate, min(senders, receivers), s.rate, bound, senders, receivers)
	if direct > bound {
		return fmt.Sprintf("%s, capped at what %s gives (direct moved %.2f GB/s)", name, what, direct), bound, bound
	}
	return fmt.Sprintf("%s, below what %s gives", name, what), direct, bound
}

// emulationShort is the least share of its bound that the direct phase
// must reach for a row to measure the engine rather than the NIC
// emulation (P14: the emulated NIC alone at ≥ 0.95 of R on the same
// writes).
const emulationShort = 0.95

// p14Blocks are the block sizes of the P14 suite: 1 KiB (P14's lowest,
// where it asks 0.9 of direct), small models' 16-token pages (2 KiB), a
// 70B model's at tensor-parallel 8 (4 KiB), 8 and 16 KiB, p14Odd, and up
// to MLA models' (64 KiB).
var p14Blocks = []uint64{1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, p14Odd, 64 << 10}

// p14Odd is P14's block that is not a power of two: DeepSeek-V3's MLA
// cache, 576 bf16 values a token and layer (a 512-wide latent and a
// 64-wide rotary key), in 16-token pages is 18 KiB a page and layer. It
// does not divide a slot, so the planner cuts blocks at slot ends.
const p14Odd = 16 * 576 * 2

// p14Mixed is P14's request of several block sizes, a layer's in turn: 2,
// 4, 18 and 64 KiB, as a model whose layers keep KV pages of different
// sizes sends (a latent cache beside an indexer's keys, or layers of
// different head counts), so that one Piece gathers blocks of small,
// odd and large sizes at once. 12 pages make it 41.25 MiB, about the
// others' 40.
const p14Mixed = "80x12x2KiB,4KiB,18KiB,64KiB"

// p14Shape is the P14 suite's KV request of block-byte blocks: 80 layers ×
// 2 × P pages, P chosen so that every request is 40 MiB whatever the
// block (from 256 pages of 1 KiB to 4 of 64 KiB; 14 of 18 KiB, 39.4 MiB).
func p14Shape(block uint64) string {
	return fmt.Sprintf("80x%dx%s", (40<<20)/(160*block), sizeString(block))
}

// p14Requests and p14Inflight are P14 1→1's requests per sender and in
// flight; hack/gpu-kit.sh runs the baseline's 1→1 with the same.
const (
	p14Requests = 16
	p14Inflight = 4
)

// p14StreamBytes is what each sender of a P14 stream sends, one block a
// request.
const p14StreamBytes = 64 << 20

// p14Parts are the parts of the P14 suite, by traffic, each a suite of its
// own (p14-1to1 and so on) that a bounded call can run alone; p14 is all
// three in this order.
var p14Parts = []string{"p14-1to1", "p14-7to1", "p14-a2a"}

// p14Runs are P14's scenarios at R = 50 GB/s, PXN against direct: KV
// requests of every P14 block size (and 1→1 the request of several sizes)
// and streams of requests of one block each, 1→1, 7→1 and all-to-all over
// 8 ranks; the parts want names (p14Parts). Each traffic runs through
// every size before the next, 1→1 of both kinds first, so a step cut
// short still has whole rows of sizes, and the ones the kit's baseline
// runs.
func p14Runs(want map[string]bool, fanIn, alternate func(int) []int) []scenario {
	kv := func(shape, traffic string, gpus []int, requests, inflight int) scenario {
		return scenario{id: "P14", pattern: "kv", ranks: len(gpus), gpus: gpus, rate: 50, bare: true, warm: true,
			kv: &KVOptions{Shape: shape, Traffic: traffic, Requests: requests, Inflight: inflight}}
	}
	stream := func(block uint64, pattern string, gpus []int) scenario {
		return scenario{id: "P14 stream", pattern: pattern, ranks: len(gpus), gpus: gpus, bytes: p14StreamBytes, block: block, rate: 50,
			bare: true, warm: true, note: "one block a request"}
	}
	every := func(f func(b uint64) scenario) []scenario {
		var runs []scenario
		for _, b := range p14Blocks {
			runs = append(runs, f(b))
		}
		return runs
	}
	var runs []scenario
	if want["p14-1to1"] {
		runs = append(runs, every(func(b uint64) scenario { return kv(p14Shape(b), "fan-in", fanIn(1), p14Requests, p14Inflight) })...)
		mixed := kv(p14Mixed, "fan-in", fanIn(1), p14Requests, p14Inflight)
		mixed.note = "a request of several block sizes, one a layer in turn"
		runs = append(runs, mixed)
		runs = append(runs, every(func(b uint64) scenario { return stream(b, "fan-in", fanIn(1)) })...)
	}
	if want["p14-7to1"] {
		runs = append(runs, every(func(b uint64) scenario { return kv(p14Shape(b), "fan-in", fanIn(7), 2, 2) })...)
	}
	if want["p14-a2a"] {
		runs = append(runs, every(func(b uint64) scenario { return kv(p14Shape(b), "all-to-all", alternate(8), 2, 2) })...)
	}
	if want["p14-7to1"] {
		runs = append(runs, every(func(b uint64) scenario { return stream(b, "fan-in", fanIn(7)) })...)
	}
	if want["p14-a2a"] {
		runs = append(runs, every(func(b uint64) scenario { return stream(b, "all-to-all", alternate(8)) })...)
	}
	return runs
}

// kvSuiteRuns are the KV scenarios of the performance contract, at
// R = 50 GB/s: P9 (kv-medium and kv-large, 1→1, 7→1 and all-to-all,
// through PXN against direct), P10 (kv-small, one request at a time,
// completion time through PXN against direct) and P14 (small blocks:
// p14Runs). With two GPUs the relay of fan-in traffic (rank 0) has GPU 0
// and every sender GPU 1, and all-to-all ranks alternate between them.
func kvSuiteRuns(want map[string]bool, ngpu int) []scenario {
	fanIn := func(n int) []int { return fanInGPUs(n, ngpu) }
	alternate := func(n int) []int {
		g := make([]int, n)
		for i := range g {
			g[i] = i % ngpu
		}
		return g
	}
	kv := func(id, shape, traffic string, gpus []int, requests, inflight int, note string) scenario {
		return scenario{id: id, pattern: "kv", ranks: len(gpus), gpus: gpus, rate: 50, bare: true, warm: true, note: note,
			kv: &KVOptions{Shape: shape, Traffic: traffic, Requests: requests, Inflight: inflight}}
	}
	var runs []scenario
	if want["p9"] {
		// Sized for one bounded call: every scenario of both phases
		// (warm-up, timed transfer, every byte checked) within about
		// two minutes on one GPU, the all-to-all first.
		shared := fmt.Sprintf("the seven senders share GPU %d", otherGPU(ngpu))
		runs = append(runs,
			kv("P9", "kv-medium", "all-to-all", alternate(8), 2, 4, ""),
			kv("P9", "kv-medium", "fan-in", fanIn(7), 4, 4, shared),
			kv("P9", "kv-medium", "fan-in", fanIn(1), 16, 4, ""),
			kv("P9", "kv-large", "fan-in", fanIn(1), 3, 2, ""),
			kv("P9", "kv-large", "fan-in", fanIn(7), 1, 1, shared),
			kv("P9", "kv-large", "all-to-all", alternate(4), 1, 2, "four ranks: eight would need 150 GB of pools"),
		)
	}
	runs = append(runs, p14Runs(want, fanIn, alternate)...)
	if want["p10"] {
		// kv-small, then two requests that take its cost apart: the same
		// 4 MiB in two blocks (no gather of 256 blocks into the slot, no
		// scatter of 256 NIC ops), and 128 KiB in two blocks (the
		// hand-over from the first hop to the second, with almost nothing
		// to store).
		runs = append(runs,
			kv("P10", "kv-small", "fan-in", fanIn(1), 400, 1, "one request at a time: completion time without queueing"),
			kv("P10 4MiB in 2 blocks:", "1x1x2MiB", "fan-in", fanIn(1), 400, 1, "kv-small's bytes as two blocks: its completion without the gather and scatter of 256 blocks"),
			kv("P10 128KiB in 2 blocks:", "1x1x64KiB", "fan-in", fanIn(1), 400, 1, "a request with almost nothing to store: the hand-over alone"),
		)
	}
	return runs
}
