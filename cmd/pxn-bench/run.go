package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/hosthop"
)

// row is one line of the table and of the JSON output.
type row struct {
	Scenario      string  `json:"scenario"`
	Bytes         uint64  `json:"bytes"`
	Pieces        uint64  `json:"pieces"`
	GBps          float64 `json:"gbps"`
	USPerPiece    float64 `json:"us_per_piece"`
	Baseline      string  `json:"baseline,omitempty"`
	BaselineGBps  float64 `json:"baseline_gbps,omitempty"`
	Ratio         float64 `json:"ratio,omitempty"`
	RelayedBytes  uint64  `json:"relayed_bytes"`
	FallbackBytes uint64  `json:"fallback_bytes"`
	DirectBytes   uint64  `json:"direct_bytes"`
	Failed        int     `json:"failed_tasks"`
	Verified      bool    `json:"verified"`
	Value         float64 `json:"value,omitempty"`
	Unit          string  `json:"unit,omitempty"`
	Note          string  `json:"note,omitempty"`
}

type runOptions struct {
	device  string
	ranks   int
	bytes   uint64
	block   uint64
	pattern string
	json    string
	credit  string
	cuda    cudaOptions
	// registryRoot is the folder the ranks' registry folder is made in.
	registryRoot string
	// allocPass repeats the engine phase's transfer once more, only to
	// count heap allocations in steady state.
	allocPass bool
	out       io.Writer
}

func runMain(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	o := runOptions{out: os.Stdout}
	var bytesFlag, blockFlag string
	fs.StringVar(&o.device, "device", "host", "host (CPU memory stands in for GPU memory) or cuda")
	fs.IntVar(&o.ranks, "ranks", 8, "ranks, one per GPU and HCA (2..8)")
	fs.StringVar(&bytesFlag, "bytes", "256MiB", "bytes each rank writes")
	fs.StringVar(&blockFlag, "block", "0", "request size (0: one request per transfer)")
	fs.StringVar(&o.pattern, "pattern", "cross-rail", "cross-rail, fan-in, same-rail or all-to-all")
	fs.StringVar(&o.json, "json", "", "also write the rows as JSON to this file")
	fs.StringVar(&o.credit, "credit-timeout", "", contract.EnvCreditTimeout+" for the ranks (empty: the engine default, 1000)")
	fs.BoolVar(&o.allocPass, "alloc-pass", false, "host: run the PXN phase's transfer a second time and report P5 heap allocations per piece from that warm pass (steady state) rather than from the first")
	o.cuda.flags(fs)
	fs.StringVar(&o.registryRoot, "registry-root", os.Getenv(contract.EnvRegistryRoot),
		"folder in which the ranks' registry folder (their MC_PXN_REGISTRY_ROOT) is created; the staging arenas live there, so it must be a large tmpfs. "+
			"Default: $MC_PXN_REGISTRY_ROOT (in a pod holding pxn.io/relay, the device plugin's group folder), else /dev/shm")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if o.bytes, err = parseSize(bytesFlag); err != nil {
		fmt.Fprintf(os.Stderr, "pxn-bench: --bytes: %v\n", err)
		return 2
	}
	if o.block, err = parseSize(blockFlag); err != nil {
		fmt.Fprintf(os.Stderr, "pxn-bench: --block: %v\n", err)
		return 2
	}
	rows, err := run(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pxn-bench: %v\n", err)
		return 1
	}
	for _, r := range rows {
		if !r.Verified || r.Failed > 0 {
			return 1
		}
	}
	return 0
}

func run(o runOptions) ([]row, error) {
	switch o.device {
	case "host":
		fmt.Fprintf(o.out, "pxn-bench: host-memory path: %d ranks as processes, host memory stands in for GPU memory, a TCP hop on loopback stands in for RDMA\n", o.ranks)
	case "cuda":
		return runCUDA(o)
	default:
		return nil, fmt.Errorf("--device %q: want host or cuda", o.device)
	}
	l, err := newLayout(o.pattern, o.ranks, o.bytes, o.block)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "pxn-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	shmRoot := o.registryRoot
	if shmRoot == "" {
		shmRoot = "/dev/shm"
		if st, err := os.Stat(shmRoot); err != nil || !st.IsDir() {
			shmRoot = work
		}
	}
	registry, err := os.MkdirTemp(shmRoot, "pxn-bench-registry-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(registry)

	layoutPath := filepath.Join(work, "layout.json")
	if err := writeJSON(layoutPath, l); err != nil {
		return nil, err
	}
	targets, dirPath, err := startTargets(l, layoutPath, work)
	defer func() {
		for _, t := range targets {
			_ = t.send("exit")
			_ = t.wait(5 * time.Second)
		}
	}()
	if err != nil {
		return nil, err
	}
	rm, err := contract.EncodeRailMap(railMap(o.ranks))
	if err != nil {
		return nil, err
	}
	env := func(enable string, group string) []string {
		e := []string{contract.EnvEnable + "=" + enable, contract.EnvGroupID + "=" + group, contract.EnvRegistryRoot + "=" + registry, contract.EnvRailMap + "=" + rm}
		if o.credit != "" {
			e = append(e, contract.EnvCreditTimeout+"="+o.credit)
		}
		return e
	}
	pxn, err := phase(l, targets, layoutPath, dirPath, "engine", env("1", "bench-pxn"), true, o.allocPass)
	if err != nil {
		return nil, fmt.Errorf("engine phase: %w", err)
	}
	bare, err := phase(l, targets, layoutPath, dirPath, "bare", env("0", "bench-bare"), false, false)
	if err != nil {
		return nil, fmt.Errorf("baseline phase: %w", err)
	}
	rows := summarize(o, pxn, bare)
	printRows(o.out, rows)
	if o.json != "" {
		if err := writeJSON(o.json, rows); err != nil {
			return rows, err
		}
	}
	return rows, nil
}

func startTargets(l *layout, layoutPath, work string) ([]*child, string, error) {
	var cs []*child
	var list []hosthop.StaticTarget
	for k := 0; k < l.Ranks; k++ {
		c, err := startChild(fmt.Sprintf("target %d", k), nil, "target", "--index", strconv.Itoa(k), "--layout", layoutPath)
		if err != nil {
			return cs, "", err
		}
		cs = append(cs, c)
		ev, err := c.expect("listening", 30*time.Second)
		if err != nil {
			return cs, "", err
		}
		list = append(list, hosthop.StaticTarget{Session: sessionName(k), Addr: ev.Addr, HCAs: []string{remoteHCA(k)},
			Ranges: []hosthop.StaticRange{{Addr: targetBase, Len: max(l.TargetBytes[k], 1)}}})
	}
	dir, err := hosthop.NewStaticDirectory(list)
	if err != nil {
		return cs, "", err
	}
	dirPath := filepath.Join(work, "directory.json")
	return cs, dirPath, writeJSON(dirPath, dir)
}

// phaseResult is one phase's rank results and verification.
type phaseResult struct {
	ranks     []rankResult
	again     []rankResult
	idle      []idleResult
	verified  bool
	verifyErr string
	routed    bool
}

// phase runs one phase: every rank transfers its share at once; with idle the
// ranks then measure an idle second, with again they first repeat the
// transfer to count allocations in steady state.
func phase(l *layout, targets []*child, layoutPath, dirPath, mode string, env []string, idle, again bool) (*phaseResult, error) {
	var ranks []*child
	defer func() {
		for _, c := range ranks {
			c.kill()
		}
	}()
	for r := 0; r < l.Ranks; r++ {
		c, err := startChild(fmt.Sprintf("rank %d", r), env, "rank", "--index", strconv.Itoa(r), "--layout", layoutPath, "--directory", dirPath, "--mode", mode)
		if err != nil {
			return nil, err
		}
		ranks = append(ranks, c)
	}
	if _, err := all(ranks, "", "ready", 60*time.Second); err != nil {
		return nil, err
	}
	res := &phaseResult{routed: true}
	evs, err := all(ranks, "route", "routed", 60*time.Second)
	if err != nil {
		return nil, err
	}
	for _, ev := range evs {
		res.routed = res.routed && ev.Routed
	}
	evs, err = all(ranks, "go", "done", 30*time.Minute)
	if err != nil {
		return nil, err
	}
	for _, ev := range evs {
		res.ranks = append(res.ranks, *ev.Result)
	}
	if again {
		if evs, err = all(ranks, "again", "done", 30*time.Minute); err != nil {
			return nil, err
		}
		for _, ev := range evs {
			res.again = append(res.again, *ev.Result)
		}
	}
	if idle {
		evs, err = all(ranks, "idle", "idle", time.Minute)
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			res.idle = append(res.idle, *ev.Idle)
		}
	}
	if res.verified, res.verifyErr, err = endPhase(ranks, targets, time.Minute); err != nil {
		return nil, err
	}
	ranks = nil
	return res, nil
}

// endPhase ends a phase: the ranks exit (they relay for each other until
// every one is done), then every target checks each byte it received and
// clears its buffer for the next phase. slack bounds each step.
func endPhase(ranks, targets []*child, slack time.Duration) (verified bool, verifyErr string, err error) {
	if _, err := all(ranks, "exit", "closed", slack); err != nil {
		return false, "", err
	}
	for _, c := range ranks {
		if err := c.wait(slack / 4); err != nil {
			return false, "", err
		}
	}
	evs, err := all(targets, "verify", "verified", 10*time.Minute)
	if err != nil {
		return false, "", err
	}
	verified = true
	for _, ev := range evs {
		if !ev.OK {
			verified, verifyErr = false, ev.Error
		}
	}
	if _, err := all(targets, "reset", "reset", slack); err != nil {
		return false, "", err
	}
	return verified, verifyErr, nil
}

func (p *phaseResult) totals() (bytes uint64, secs float64, failed int) {
	for _, r := range p.ranks {
		bytes += r.Bytes
		secs = max(secs, r.Seconds)
		failed += r.Failed
	}
	return
}

func summarize(o runOptions, pxn, bare *phaseResult) []row {
	bytes, secs, failed := pxn.totals()
	bBytes, bSecs, bFailed := bare.totals()
	var relayed, fallback, direct, pieces, forwarded, mallocs uint64
	var pumpCPU float64
	for _, r := range pxn.ranks {
		relayed += r.Counters.RelayedBytes
		fallback += r.Counters.FallbackBytes
		direct += r.Counters.DirectBytes
		pieces += r.Counters.RelayedPieces + r.Counters.FallbackPieces
		forwarded += r.Counters.ForwardedPieces
		mallocs += r.Mallocs
		pumpCPU += r.PumpCPU
	}
	gbps := float64(bytes) / secs / 1e9
	bGBps := float64(bBytes) / bSecs / 1e9
	ratio := gbps / bGBps
	if failed > 0 || bFailed > 0 || !pxn.verified || !bare.verified {
		ratio = 0
	}
	main := row{
		Scenario: fmt.Sprintf("%s %d ranks, block %s", o.pattern, o.ranks, sizeString(blockOf(o))),
		Bytes:    bytes, Pieces: pieces, GBps: gbps, Baseline: "hop alone (direct)", BaselineGBps: bGBps, Ratio: ratio,
		RelayedBytes: relayed, FallbackBytes: fallback, DirectBytes: direct, Failed: failed, Verified: pxn.verified,
	}
	if pieces > 0 {
		main.USPerPiece = secs * 1e6 / float64(pieces) * float64(o.ranks)
	}
	if !pxn.routed && o.pattern != "same-rail" {
		main.Note = "not every rank found its relay in time"
	}
	if pxn.verifyErr != "" {
		main.Note = pxn.verifyErr
	}
	baseline := row{Scenario: "baseline: same traffic, hop alone", Bytes: bBytes, GBps: bGBps, DirectBytes: bBytes, Failed: bFailed, Verified: bare.verified, Note: bare.verifyErr}
	rows := []row{main, baseline}
	var idlePump float64
	for _, i := range pxn.idle {
		idlePump = max(idlePump, i.PumpPercent)
	}
	rows = append(rows, row{Scenario: "P5 pump idle CPU (busiest rank)", Value: idlePump, Unit: "% of a core", Verified: true})
	if handled := pieces + forwarded; handled > 0 {
		rows = append(rows,
			row{Scenario: "P5 pump CPU per piece (sender + relay pieces)", Value: pumpCPU * 1e6 / float64(handled), Unit: "µs", Pieces: handled, Verified: true})
	}
	allocs := "P5 heap allocations per piece, first pass (whole process, hop included; warm-up counts: pools, connections, first use of buffers)"
	if len(pxn.again) > 0 {
		allocs = "P5 heap allocations per piece, second pass (steady state; whole process, hop included)"
		mallocs, pieces, forwarded = 0, 0, 0
		for _, r := range pxn.again {
			mallocs += r.Mallocs
			pieces += r.Counters.RelayedPieces + r.Counters.FallbackPieces
			forwarded += r.Counters.ForwardedPieces
		}
	}
	if handled := pieces + forwarded; handled > 0 {
		rows = append(rows, row{Scenario: allocs, Value: float64(mallocs) / float64(handled), Unit: "allocs", Pieces: handled, Verified: true})
	}
	return rows
}

func blockOf(o runOptions) uint64 {
	if o.block == 0 || o.block > o.bytes {
		return o.bytes
	}
	return o.block
}

func printRows(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tBYTES\tPIECES\tGB/S\tµS/PIECE\tBASELINE GB/S\tRATIO\tRELAYED\tFALLBACK\tDIRECT\tFAILED\tVERIFIED")
	for _, r := range rows {
		if r.Unit != "" {
			fmt.Fprintf(tw, "%s\t\t%s\t%.3g %s\t\t\t\t\t\t\t\t%v\n", r.Scenario, count(r.Pieces), r.Value, r.Unit, r.Verified)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%v\n", r.Scenario, sizeString(r.Bytes), count(r.Pieces), r.GBps,
			opt(r.USPerPiece, "%.1f"), opt(r.BaselineGBps, "%.2f"), opt(r.Ratio, "%.3f"),
			sizeString(r.RelayedBytes), sizeString(r.FallbackBytes), sizeString(r.DirectBytes), r.Failed, r.Verified)
	}
	tw.Flush()
	for _, r := range rows {
		if r.Note != "" {
			fmt.Fprintf(w, "note (%s): %s\n", r.Scenario, r.Note)
		}
	}
}

func opt(v float64, f string) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf(f, v)
}

func count(n uint64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatUint(n, 10)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}

var sizeUnits = []struct {
	suffix string
	mult   uint64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}

// parseSize reads 4096, 10KiB, 8MiB, 1GiB (binary units).
func parseSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	mult := uint64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want a number with an optional KiB/MiB/GiB suffix", s)
	}
	if n > (1<<63)/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return n * mult, nil
}

func sizeString(n uint64) string {
	switch {
	case n == 0:
		return "0"
	case n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return strconv.FormatUint(n, 10)
}
