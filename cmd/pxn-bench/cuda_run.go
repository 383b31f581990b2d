package main

import (
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pxn-project/pxn/internal/cuda"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/hosthop"
)

// cudaOptions are run's flags for --device cuda.
type cudaOptions struct {
	suite     string
	gpus      string
	rate      float64
	raw       bool
	latency   int
	gatherPTX string
	copyMode  string
}

func (c *cudaOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.suite, "suite", "", "cuda: run the performance scenarios instead of one pattern: all, or a comma list of p1 (with P4, P5, P6), p2, p3")
	fs.StringVar(&c.gpus, "gpus", "", "cuda: GPU of each rank, comma-separated (default: rank r on GPU r % number of GPUs)")
	fs.Float64Var(&c.rate, "rate", 0, "cuda: the emulated NIC's rate cap in GB/s (0: the copy engine's own rate)")
	fs.BoolVar(&c.raw, "raw", false, "cuda: also time a raw copy-engine copy of the same traffic")
	fs.IntVar(&c.latency, "latency", 0, "cuda: also time this many 10 KiB writes through PXN and direct")
	fs.StringVar(&c.gatherPTX, "gather-ptx", "", "cuda: load the gather kernel from this PTX file instead of the embedded one (kernel development)")
	fs.StringVar(&c.copyMode, "copy-mode", "", "cuda: MC_PXN_COPY_MODE for the ranks (ce, sm or auto)")
}

// cudaRun is one scenario of the CUDA path: ranks as processes on GPUs,
// targets as processes holding device buffers, an emulated NIC as the hop.
type cudaRun struct {
	id      string
	pattern string
	ranks   int
	bytes   uint64
	block   uint64
	gpus    []int
	rate    float64
	// raw adds a raw copy-engine copy of the same traffic; bare adds a
	// phase with MC_PXN_ENABLE=0 (the NIC alone, and the P6 measure);
	// idle measures the pumps' idle CPU; latency is the number of timed
	// 10 KiB writes each way.
	raw, bare, idle bool
	latency         int
	// reps repeats the timed transfer (and the raw copy) back to back, so
	// the rate is the steady state rather than a fill and a drain.
	reps int
	note string
}

// cudaSetup is what every run of one invocation shares.
type cudaSetup struct {
	o     runOptions
	ngpu  int
	names []string
	drv   int
}

func runCUDA(o runOptions) ([]row, error) {
	d, err := cuda.Load()
	if err != nil {
		return nil, fmt.Errorf("--device cuda: %w; this machine cannot run the CUDA path (--device host runs without a GPU)", err)
	}
	n, err := d.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("--device cuda: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("--device cuda: the driver reports no CUDA device")
	}
	su := cudaSetup{o: o, ngpu: n, drv: d.Version()}
	for i := 0; i < n; i++ {
		dev, err := d.DeviceGet(i)
		if err != nil {
			return nil, err
		}
		name, _ := d.DeviceName(dev)
		su.names = append(su.names, name)
	}
	fmt.Fprintf(o.out, "pxn-bench: CUDA path: %d GPUs (%s), driver CUDA %d.%d; ranks and targets are processes, rails are simulated, the second hop is an emulated NIC (copy-engine writes into the target processes' device buffers, optionally rate-capped)\n",
		n, strings.Join(su.names, ", "), su.drv/1000, su.drv%1000/10)
	var rows []row
	if o.cuda.suite == "" {
		gpus, err := rankGPUs(o.cuda.gpus, o.ranks, n)
		if err != nil {
			return nil, err
		}
		r := cudaRun{id: "", pattern: o.pattern, ranks: o.ranks, bytes: o.bytes, block: o.block, gpus: gpus,
			rate: o.cuda.rate, raw: o.cuda.raw, bare: true, idle: true, latency: o.cuda.latency}
		if rows, err = su.exec(r); err != nil {
			return nil, err
		}
	} else {
		want, err := parseSuite(o.cuda.suite)
		if err != nil {
			return nil, err
		}
		for _, r := range suiteRuns(want, n) {
			rs, err := su.exec(r)
			if err != nil {
				return rows, fmt.Errorf("%s: %w", r.id, err)
			}
			rows = append(rows, rs...)
		}
		if want["p2"] {
			rs, err := su.firsthop()
			if err != nil {
				return rows, fmt.Errorf("P2: %w", err)
			}
			rows = append(rows, rs...)
		}
	}
	printRows(o.out, rows)
	if o.json != "" {
		if err := writeJSON(o.json, rows); err != nil {
			return rows, err
		}
	}
	return rows, nil
}

func parseSuite(s string) (map[string]bool, error) {
	want := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		switch p = strings.ToLower(strings.TrimSpace(p)); p {
		case "all":
			want["p1"], want["p2"], want["p3"] = true, true, true
		case "p1", "p2", "p3":
			want[p] = true
		default:
			return nil, fmt.Errorf("--suite %q: want all or a list of p1, p2, p3", s)
		}
	}
	return want, nil
}

// suiteRuns are the scenarios of the performance contract. With two GPUs
// the relay (rank 0) has GPU 0 and every sender GPU 1, so the first hop
// crosses NVLink and the seven senders of P3 share one GPU.
func suiteRuns(want map[string]bool, ngpu int) []cudaRun {
	other := min(1, ngpu-1)
	senders := func(n int) []int {
		g := []int{0}
		for range n {
			g = append(g, other)
		}
		return g
	}
	var runs []cudaRun
	if want["p1"] {
		runs = append(runs,
			cudaRun{id: "P1", pattern: "fan-in", ranks: 2, bytes: 4 << 30, block: 8 << 20, gpus: senders(1),
				raw: true, bare: true, idle: true, latency: 5000, reps: 4,
				note: "second hop uncapped (intra-GPU copy into the target); the 4 GiB transfer timed 4 times back to back"},
			cudaRun{id: "cross-rail", pattern: "cross-rail", ranks: 2, bytes: 1 << 30, block: 8 << 20, gpus: []int{0, other},
				note: "each rank sends and relays"},
		)
	}
	if want["p3"] {
		runs = append(runs,
			cudaRun{id: "P3", pattern: "fan-in", ranks: 2, bytes: 2 << 30, block: 8 << 20, gpus: senders(1), rate: 50},
			cudaRun{id: "P3", pattern: "fan-in", ranks: 8, bytes: 1 << 30, block: 8 << 20, gpus: senders(7), rate: 50,
				note: fmt.Sprintf("the seven senders share GPU %d", other)},
		)
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

// nicTargetJSON is one target of the NIC file the parent gives the ranks.
type nicTargetJSON struct {
	Session string `json:"session"`
	Addr    uint64 `json:"addr"`
	Len     uint64 `json:"len"`
	Handle  string `json:"handle"`
}

// busyWindow is one rank's pump CPU and Pieces over the timed transfer of
// the whole phase (a relay has no transfer of its own to time).
type busyWindow struct {
	pumpCPU   float64
	seconds   float64
	relayed   uint64
	forwarded uint64
}

// cudaPhase is one phase's reports.
type cudaPhase struct {
	ranks     []rankResult
	busy      []busyWindow
	opens     []openResult
	raws      []rawResult
	lats      []latencyResult
	idle      []idleResult
	routed    bool
	verified  bool
	verifyErr string
}

func (su cudaSetup) exec(r cudaRun) ([]row, error) {
	o := su.o
	l, err := newLayout(r.pattern, r.ranks, r.bytes, r.block)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "pxn-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	root := o.registryRoot
	if root == "" {
		root = "/dev/shm"
	}
	registry, err := os.MkdirTemp(root, "pxn-bench-registry-")
	if err != nil {
		return nil, fmt.Errorf("the CUDA path's registry (a tmpfs: control blocks are pinned for doorbells): %w", err)
	}
	defer os.RemoveAll(registry)
	layoutPath := filepath.Join(work, "layout.json")
	if err := writeJSON(layoutPath, l); err != nil {
		return nil, err
	}
	var targets []*child
	defer func() {
		for _, t := range targets {
			_ = t.send("exit")
			_ = t.wait(30 * time.Second)
		}
	}()
	var dirList []hosthop.StaticTarget
	var nics []nicTargetJSON
	for k := 0; k < l.Ranks; k++ {
		c, err := startChild(fmt.Sprintf("target %d", k), nil, "cuda-target", "--index", strconv.Itoa(k),
			"--gpu", strconv.Itoa(r.gpus[k]), "--layout", layoutPath)
		if err != nil {
			return nil, err
		}
		targets = append(targets, c)
		ev, err := c.expect("listening", 3*time.Minute)
		if err != nil {
			return nil, err
		}
		n := max(l.TargetBytes[k], 1)
		dirList = append(dirList, hosthop.StaticTarget{Session: sessionName(k), HCAs: []string{remoteHCA(k)},
			Ranges: []hosthop.StaticRange{{Addr: targetBase, Len: n}}})
		nics = append(nics, nicTargetJSON{Session: sessionName(k), Addr: targetBase, Len: n, Handle: ev.Addr})
	}
	dir, err := hosthop.NewStaticDirectory(dirList)
	if err != nil {
		return nil, err
	}
	dirPath, nicPath := filepath.Join(work, "directory.json"), filepath.Join(work, "nic.json")
	if err := writeJSON(dirPath, dir); err != nil {
		return nil, err
	}
	if err := writeJSON(nicPath, nics); err != nil {
		return nil, err
	}
	rm, err := contract.EncodeRailMap(railMap(r.ranks))
	if err != nil {
		return nil, err
	}
	env := func(enable, group string) []string {
		e := []string{contract.EnvEnable + "=" + enable, contract.EnvGroupID + "=" + group, contract.EnvRegistryRoot + "=" + registry, contract.EnvRailMap + "=" + rm}
		if o.credit != "" {
			e = append(e, contract.EnvCreditTimeout+"="+o.credit)
		}
		if o.cuda.copyMode != "" {
			e = append(e, contract.EnvCopyMode+"="+o.cuda.copyMode)
		}
		return e
	}
	args := func(k int, mode string) []string {
		a := []string{"cuda-rank", "--index", strconv.Itoa(k), "--gpu", strconv.Itoa(r.gpus[k]), "--layout", layoutPath,
			"--directory", dirPath, "--nic", nicPath, "--mode", mode, "--rate", strconv.FormatFloat(r.rate, 'g', -1, 64),
			"--registry", registry, "--latency", strconv.Itoa(r.latency), "--reps", strconv.Itoa(max(r.reps, 1))}
		if o.cuda.gatherPTX != "" {
			a = append(a, "--gather-ptx", o.cuda.gatherPTX)
		}
		return a
	}
	pxn, err := r.phase(l, targets, args, "engine", env("1", "bench-pxn"))
	if err != nil {
		return nil, fmt.Errorf("engine phase: %w", err)
	}
	var bare *cudaPhase
	if r.bare {
		if bare, err = r.phase(l, targets, args, "bare", env("0", "bench-bare")); err != nil {
			return nil, fmt.Errorf("baseline phase (MC_PXN_ENABLE=0): %w", err)
		}
	}
	return su.summarize(r, pxn, bare), nil
}

func (r cudaRun) phase(l *layout, targets []*child, args func(int, string) []string, mode string, env []string) (*cudaPhase, error) {
	var ranks []*child
	defer func() {
		for _, c := range ranks {
			c.kill()
		}
	}()
	for k := 0; k < l.Ranks; k++ {
		c, err := startChild(fmt.Sprintf("rank %d", k), env, args(k, mode)...)
		if err != nil {
			return nil, err
		}
		ranks = append(ranks, c)
	}
	if _, err := all(ranks, "", "ready", 5*time.Minute); err != nil {
		return nil, err
	}
	res := &cudaPhase{routed: true}
	// Ranks open their engines one at a time when device memory is
	// measured: the free memory a rank reads is the whole GPU's.
	var opened []event
	if r.bare {
		for _, c := range ranks {
			evs, err := all([]*child{c}, "open", "opened", 2*time.Minute)
			if err != nil {
				return nil, err
			}
			opened = append(opened, evs...)
		}
	} else {
		var err error
		if opened, err = all(ranks, "open", "opened", 2*time.Minute); err != nil {
			return nil, err
		}
	}
	for _, ev := range opened {
		res.opens = append(res.opens, *ev.Open)
	}
	if mode == "engine" {
		evs, err := all(ranks, "route", "routed", time.Minute)
		if err != nil {
			return nil, err
		}
		for k, ev := range evs {
			if len(l.ofRank(k)) > 0 {
				res.routed = res.routed && ev.Routed
			}
		}
	}
	if _, err := all(ranks, "warm", "warmed", 20*time.Minute); err != nil {
		return nil, err
	}
	before, err := all(ranks, "stats", "stats", time.Minute)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	evs, err := all(ranks, "go", "done", 20*time.Minute)
	if err != nil {
		return nil, err
	}
	window := time.Since(t0).Seconds()
	for _, ev := range evs {
		res.ranks = append(res.ranks, *ev.Result)
	}
	after, err := all(ranks, "stats", "stats", time.Minute)
	if err != nil {
		return nil, err
	}
	for k := range after {
		a, b := after[k].Result, before[k].Result
		res.busy = append(res.busy, busyWindow{pumpCPU: a.PumpCPU - b.PumpCPU, seconds: window,
			relayed: a.Counters.RelayedPieces - b.Counters.RelayedPieces, forwarded: a.Counters.ForwardedPieces - b.Counters.ForwardedPieces})
	}
	if mode == "engine" && r.raw {
		evs, err := all(ranks, "raw", "raw", 10*time.Minute)
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			res.raws = append(res.raws, *ev.Raw)
		}
	}
	if mode == "engine" && r.latency > 0 {
		evs, err := all(ranks, "latency", "latency", 10*time.Minute)
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			res.lats = append(res.lats, *ev.Latency)
		}
	}
	if mode == "engine" && r.idle {
		evs, err := all(ranks, "idle", "idle", time.Minute)
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			res.idle = append(res.idle, *ev.Idle)
		}
	}
	if res.verified, res.verifyErr, err = endPhase(ranks, targets, 2*time.Minute); err != nil {
		return nil, err
	}
	ranks = nil
	return res, nil
}

// span is a phase's bytes and the time from the first rank's start to the
// last rank's end: ranks that ran at once, timed as one transfer.
func (p *cudaPhase) span() (bytes uint64, secs float64, failed int) {
	var first, last int64
	for _, r := range p.ranks {
		failed += r.Failed
		if r.Bytes == 0 {
			continue
		}
		bytes += r.Bytes
		if first == 0 || r.StartNs < first {
			first = r.StartNs
		}
		last = max(last, r.EndNs)
	}
	return bytes, float64(last-first) / 1e9, failed
}

func gbpsOf(bytes uint64, secs float64) float64 {
	if secs <= 0 {
		return 0
	}
	return float64(bytes) / secs / 1e9
}

func (su cudaSetup) summarize(r cudaRun, pxn, bare *cudaPhase) []row {
	label := r.id
	if label == "" {
		label = r.pattern
	}
	var where []string
	for k := 0; k < r.ranks; k++ {
		where = append(where, strconv.Itoa(r.gpus[k]))
	}
	nic := "NIC uncapped"
	if r.rate > 0 {
		nic = fmt.Sprintf("NIC capped at %g GB/s", r.rate)
	}
	title := fmt.Sprintf("%s: %s %d ranks on GPUs [%s], %s requests, %s", label, r.pattern, r.ranks, strings.Join(where, " "), sizeString(min(r.block, r.bytes)), nic)
	bytes, secs, failed := pxn.span()
	var relayed, fallback, direct, pieces, forwarded uint64
	for _, rr := range pxn.ranks {
		relayed += rr.Counters.RelayedBytes
		fallback += rr.Counters.FallbackBytes
		direct += rr.Counters.DirectBytes
		pieces += rr.Counters.RelayedPieces + rr.Counters.FallbackPieces
		forwarded += rr.Counters.ForwardedPieces
	}
	gbps := gbpsOf(bytes, secs)
	main := row{Scenario: title, Bytes: bytes, Pieces: pieces, GBps: gbps, RelayedBytes: relayed, FallbackBytes: fallback,
		DirectBytes: direct, Failed: failed, Verified: pxn.verified, Note: r.note}
	if pieces > 0 {
		main.USPerPiece = secs * 1e6 / float64(pieces)
	}
	ok := failed == 0 && pxn.verified
	var rows []row
	var rawRow, bareRow *row
	if len(pxn.raws) > 0 {
		var rb uint64
		var rs float64
		for _, x := range pxn.raws {
			rb += x.Bytes
			rs = max(rs, x.Seconds)
		}
		rawRow = &row{Scenario: label + " baseline: raw copy-engine copy of the same bytes (cuMemcpyAsync, one stream per sender)", Bytes: rb, GBps: gbpsOf(rb, rs), Verified: pxn.verified}
	}
	if bare != nil {
		bb, bs, bf := bare.span()
		bareRow = &row{Scenario: label + " baseline: same traffic, emulated NIC alone (MC_PXN_ENABLE=0)", Bytes: bb, GBps: gbpsOf(bb, bs), DirectBytes: bb, Failed: bf, Verified: bare.verified, Note: bare.verifyErr}
	}
	switch {
	case r.rate > 0:
		main.Baseline, main.BaselineGBps = "R, the emulated NIC's cap", r.rate
	case rawRow != nil:
		main.Baseline, main.BaselineGBps = "raw copy-engine copy", rawRow.GBps
	case bareRow != nil:
		main.Baseline, main.BaselineGBps = "emulated NIC alone", bareRow.GBps
	}
	if ok && main.BaselineGBps > 0 {
		main.Ratio = gbps / main.BaselineGBps
	}
	if !pxn.routed && r.pattern != "same-rail" {
		main.Note = strings.TrimPrefix(main.Note+"; not every rank found its relay in time", "; ")
	}
	if pxn.verifyErr != "" {
		main.Note = pxn.verifyErr
	}
	rows = append(rows, main)
	if rawRow != nil {
		rows = append(rows, *rawRow)
	}
	if bareRow != nil {
		rows = append(rows, *bareRow)
	}
	rows = append(rows, latencyRows(label, pxn.lats)...)
	rows = append(rows, pumpRows(label, pxn, pieces, forwarded)...)
	if bare != nil {
		rows = append(rows, p6Rows(label, pxn, bare)...)
	}
	return rows
}

func latencyRows(label string, lats []latencyResult) []row {
	var rows []row
	for _, l := range lats {
		if l.N == 0 {
			continue
		}
		ok := l.Failed == 0
		note := fmt.Sprintf("%d writes each way, alternating; %d relayed; PXN p90/p99.9/max %.1f/%.0f/%.0f µs, direct %.1f/%.0f/%.0f µs; %d GCs in the sender",
			l.N, l.Relayed, l.PXN[3], l.PXN[4], l.PXN[5], l.Direct[3], l.Direct[4], l.Direct[5], l.GCs)
		if l.FirstError != "" {
			note += "; first error: " + l.FirstError
		}
		rows = append(rows,
			row{Scenario: label + " P4 10KiB write through PXN, p50", Value: l.PXN[0], Unit: "µs", Verified: ok, Note: note},
			row{Scenario: label + " P4 10KiB write through PXN, p99", Value: l.PXN[1], Unit: "µs", Verified: ok},
			row{Scenario: label + " P4 10KiB write direct (emulated NIC alone), p50", Value: l.Direct[0], Unit: "µs", Verified: ok},
			row{Scenario: label + " P4 10KiB write direct (emulated NIC alone), p99", Value: l.Direct[1], Unit: "µs", Verified: ok},
			row{Scenario: label + " P4 latency added by PXN, p50", Value: l.PXN[0] - l.Direct[0], Unit: "µs", Verified: ok},
			row{Scenario: label + " P4 latency added by PXN, p99", Value: l.PXN[1] - l.Direct[1], Unit: "µs", Verified: ok},
		)
	}
	return rows
}

func pumpRows(label string, p *cudaPhase, pieces, forwarded uint64) []row {
	var rows []row
	if len(p.idle) > 0 {
		var idle float64
		for _, i := range p.idle {
			idle = max(idle, i.PumpPercent)
		}
		rows = append(rows, row{Scenario: label + " P5 pump CPU while idle (busiest rank, 1 s)", Value: idle, Unit: "% of a core", Verified: true})
	}
	var relayBusy, sendBusy, cpu float64
	for _, b := range p.busy {
		cpu += b.pumpCPU
		if b.seconds <= 0 {
			continue
		}
		pct := 100 * b.pumpCPU / b.seconds
		if b.forwarded > 0 {
			relayBusy = max(relayBusy, pct)
		}
		if b.relayed > 0 {
			sendBusy = max(sendBusy, pct)
		}
	}
	note := "pump thread CPU (schedstat) over the phase's timed transfer, as the parent timed it"
	if relayBusy > 0 {
		rows = append(rows, row{Scenario: label + " P5 pump CPU while busy, relay rank", Value: relayBusy, Unit: "% of a core", Verified: true, Note: note})
	}
	if sendBusy > 0 {
		rows = append(rows, row{Scenario: label + " P5 pump CPU while busy, busiest sender", Value: sendBusy, Unit: "% of a core", Verified: true})
	}
	if n := pieces + forwarded; n > 0 {
		rows = append(rows, row{Scenario: label + " P5 pump CPU per Piece (sender and relay Pieces)", Value: cpu * 1e6 / float64(n), Unit: "µs", Pieces: n, Verified: true})
	}
	return rows
}

func p6Rows(label string, pxn, bare *cudaPhase) []row {
	var mem, threads, gor, shm, onMem int64
	for _, o := range bare.opens {
		mem = maxAbs(mem, o.DeviceBytes)
		threads = maxAbs(threads, int64(o.Threads))
		gor = maxAbs(gor, int64(o.Goroutines))
		shm = maxAbs(shm, int64(o.ShmEntries))
	}
	for _, o := range pxn.opens {
		onMem = max(onMem, o.DeviceBytes)
	}
	ok := mem == 0 && threads == 0 && gor == 0 && shm == 0
	note := fmt.Sprintf("with MC_PXN_ENABLE=1 the same open took %s of device memory", sizeString(uint64(max(onMem, 0))))
	return []row{
		{Scenario: label + " P6 MC_PXN_ENABLE=0: device memory taken by the open (cuMemGetInfo, largest of the ranks)", Value: float64(mem), Unit: "bytes", Verified: ok, Note: note},
		{Scenario: label + " P6 MC_PXN_ENABLE=0: extra threads", Value: float64(threads), Unit: "threads", Verified: ok},
		{Scenario: label + " P6 MC_PXN_ENABLE=0: extra goroutines", Value: float64(gor), Unit: "goroutines", Verified: ok},
		{Scenario: label + " P6 MC_PXN_ENABLE=0: files and folders added under the registry root", Value: float64(shm), Unit: "entries", Verified: ok},
	}
}

func maxAbs(a, b int64) int64 {
	if b < 0 {
		b = -b
	}
	return max(a, b)
}

// firsthop runs P2 in a child process (the parent keeps no CUDA context).
func (su cudaSetup) firsthop() ([]row, error) {
	sender := min(1, su.ngpu-1)
	args := []string{"cuda-firsthop", "--relay-gpu", "0", "--sender-gpu", strconv.Itoa(sender)}
	if su.o.cuda.gatherPTX != "" {
		args = append(args, "--gather-ptx", su.o.cuda.gatherPTX)
	}
	c, err := startChild("first-hop ring", nil, args...)
	if err != nil {
		return nil, err
	}
	defer c.kill()
	ev, err := c.expect("rows", 20*time.Minute)
	if err != nil {
		return nil, err
	}
	return slices.Clone(ev.Rows), nil
}

func decodeHandle(s string) (cuda.IPCMemHandle, error) {
	var h cuda.IPCMemHandle
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(h) {
		return h, fmt.Errorf("IPC handle %q: want %d hex bytes", s, len(h))
	}
	copy(h[:], b)
	return h, nil
}
