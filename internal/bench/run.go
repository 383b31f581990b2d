// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// RunOptions are run's flags.
type RunOptions struct {
	Device  string
	Ranks   int
	Bytes   uint64
	Block   uint64
	Pattern string
	JSON    string
	Credit  string
	// PerSubmit is the number of requests per Submit (0: the device's
	// default).
	PerSubmit int
	CUDA      CUDAOptions
	KV        KVOptions
	// RegistryRoot is the folder the ranks' registry folder is made in.
	RegistryRoot string
	// RailMap, when set, names the ranks' HCAs and rails after a node's
	// (nodeRails); nil: mlx5_k on railk.
	RailMap map[string]string
	// AllocPass repeats the engine phase's transfer once more, only to
	// count heap allocations in steady state.
	AllocPass bool
	// FirstPiece is the ranks' MC_PXN_FIRST_PIECE_KIB ("": the engine's
	// default).
	FirstPiece string
	// SlotParts is the ranks' MC_PXN_SLOT_PARTS (0: the engine's default).
	SlotParts int
	Out       io.Writer
	// ErrOut takes warnings; Getenv reads this process's environment.
	ErrOut io.Writer
	Getenv func(string) string
	// PIDNS starts each rank in a PID and mount namespace of its own.
	PIDNS bool
	// HoldAfter keeps the engine phase's ranks registered, idle, for this
	// long after their last step, so that a scraper sees their counters.
	HoldAfter time.Duration
}

// CUDAOptions are run's flags for --device cuda.
type CUDAOptions struct {
	Suite     string
	GPUs      string
	Rate      float64
	Raw       bool
	Latency   int
	GatherPTX string
	CopyMode  string
	// NoInlinePlan makes the ranks' copiers upload every gather plan
	// (gpu.CopierOptions.NoInlinePlan).
	NoInlinePlan bool
	// PollSpin and PollNap replace the pump's poll policy (zero: the
	// copier's default), to measure the trade-off of CPU and latency.
	PollSpin, PollNap time.Duration
	// ArenaShare is how each rank shares its device arena (auto, fd, ipc).
	ArenaShare string
}

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

// device is the parent's view of where the ranks' sources and the
// targets' buffers live and what carries the second hop.
type device struct {
	kind string
	// hop names the second hop in the rows.
	hop string
	// spin makes the ranks poll for completion without sleeping.
	spin bool
	// registry is the folder the registry folder is made in.
	registry string
	// ngpu is the number of CUDA devices.
	ngpu int
	// startup bounds a child's start.
	startup time.Duration
	// mps is whether the CUDA processes share their GPUs through MPS.
	mps mpsState
	// pidns starts each rank in namespaces of its own.
	pidns bool
	// progress takes a line as each step of a phase starts (nil: none).
	progress io.Writer
}

// say writes one progress line.
func (dev *device) say(format string, args ...any) {
	if dev.progress != nil {
		fmt.Fprintf(dev.progress, "pxn-bench: "+format+"\n", args...)
	}
}

// Check checks what run's options say before any work starts: the device,
// the rank count, the pattern and the JSON file. The error names the flag
// and its value.
func (o RunOptions) Check() error {
	if o.Device != "host" && o.Device != "cuda" {
		return fmt.Errorf("--device %q: want host or cuda", o.Device)
	}
	if o.CUDA.Suite == "" {
		if o.Ranks < 2 || o.Ranks > 8 {
			return fmt.Errorf("--ranks %d: want 2..8 (one rank per GPU of a node)", o.Ranks)
		}
		if !slices.Contains(Patterns, o.Pattern) {
			return patternError(o.Pattern)
		}
		if o.Pattern != "kv" && o.Bytes == 0 {
			return fmt.Errorf("--bytes must be > 0")
		}
		if _, _, err := nodeRails(o.Ranks, o.RailMap); err != nil {
			return err
		}
		if o.Pattern == "kv" {
			if o.CUDA.Raw || o.CUDA.Latency > 0 || o.AllocPass {
				return fmt.Errorf("--pattern kv: --raw, --latency and --alloc-pass time other traffic; the kv rows time each request")
			}
			if _, err := newKVLayout(o.Ranks, o.KV); err != nil {
				return err
			}
		}
	}
	if o.JSON != "" {
		return CheckOutput("--json", o.JSON)
	}
	return nil
}

// Run runs one traffic pattern, or with CUDA.Suite the CUDA performance
// suites, each rank and target a process of this binary (its rank and
// target commands). It prints each scenario's rows to o.Out as soon as the
// scenario ends (and rewrites o.JSON), and returns every row.
func Run(o RunOptions) ([]Row, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	dev, err := openDevice(o)
	if err != nil {
		return nil, err
	}
	dev.progress = o.ErrOut
	if dev.pidns = o.PIDNS; o.PIDNS {
		fmt.Fprintln(o.Out, "pxn-bench: each rank runs in a PID and mount namespace of its own, with its own /proc")
	}
	var runs []scenario
	if o.CUDA.Suite == "" {
		s := scenario{pattern: o.Pattern, ranks: o.Ranks, bytes: o.Bytes, block: o.Block, rate: o.CUDA.Rate,
			raw: o.CUDA.Raw, bare: true, idle: true, again: o.AllocPass, latency: o.CUDA.Latency, hold: o.HoldAfter}
		if o.Pattern == "kv" {
			s.kv, s.idle = &o.KV, false
		}
		if dev.kind == "cuda" {
			s.warm, s.p6 = true, true
			if s.gpus, err = rankGPUs(o.CUDA.GPUs, o.Ranks, dev.ngpu); err != nil {
				return nil, err
			}
		}
		runs = append(runs, s)
	}
	var want map[string]bool
	if o.CUDA.Suite != "" {
		if dev.kind != "cuda" {
			return nil, fmt.Errorf("--suite %q: the performance suites run on --device cuda", o.CUDA.Suite)
		}
		if want, err = parseSuite(o.CUDA.Suite); err != nil {
			return nil, err
		}
		runs = suiteRuns(want, dev.ngpu)
	}
	if dev.kind == "cuda" {
		if w := mpsWarning(dev.mps, runs); w != "" {
			fmt.Fprintln(o.ErrOut, w)
		}
	}
	// Each scenario's rows are printed, and the JSON file rewritten, as
	// soon as the scenario ends: a run cut short by a time limit keeps
	// what it measured.
	var rows []Row
	emitRows := func(rs []Row) error {
		for i := range rs {
			rs[i].Settings = o.rankSettings()
			if dev.kind == "cuda" {
				rs[i].MPS = dev.mps.String()
			}
		}
		rows = append(rows, rs...)
		printRows(o.Out, rs)
		if o.JSON != "" {
			return writeJSON(o.JSON, rows)
		}
		return nil
	}
	for _, s := range runs {
		t0 := time.Now()
		rs, err := dev.exec(o, s)
		if o.CUDA.Suite != "" {
			// A suite's step has a time limit: each scenario's time says
			// which one to shorten when a step runs out.
			fmt.Fprintf(o.ErrOut, "pxn-bench: %s took %.1f s\n", dev.title(s), time.Since(t0).Seconds())
		}
		if err != nil {
			if s.id != "" {
				err = fmt.Errorf("%s: %w", s.id, err)
			}
			return rows, err
		}
		if err := emitRows(rs); err != nil {
			return rows, err
		}
	}
	if want["p2"] {
		rs, err := dev.firsthop(o)
		if err != nil {
			return rows, fmt.Errorf("P2: %w", err)
		}
		if err := emitRows(rs); err != nil {
			return rows, err
		}
	}
	return rows, nil
}

// rankEnv are the MC_PXN_* settings the flags give every rank beyond what
// a scenario sets itself.
func (o RunOptions) rankEnv() []string {
	var e []string
	if o.Credit != "" {
		e = append(e, contract.EnvCreditTimeout+"="+o.Credit)
	}
	if o.CUDA.CopyMode != "" {
		e = append(e, contract.EnvCopyMode+"="+o.CUDA.CopyMode)
	}
	if o.FirstPiece != "" {
		e = append(e, contract.EnvFirstPiece+"="+o.FirstPiece)
	}
	if o.SlotParts != 0 {
		e = append(e, contract.EnvSlotParts+"="+strconv.Itoa(o.SlotParts))
	}
	return e
}

// rankSettings names, for the rows, what the flags changed in the ranks'
// engines ("" for the defaults).
func (o RunOptions) rankSettings() string {
	e := o.rankEnv()
	if o.CUDA.PollSpin != 0 || o.CUDA.PollNap != 0 {
		e = append(e, "poll spin "+o.CUDA.PollSpin.String()+", nap "+o.CUDA.PollNap.String())
	}
	if o.CUDA.NoInlinePlan {
		e = append(e, "every gather plan uploaded")
	}
	return strings.Join(e, " ")
}

// openDevice checks that the device can run and prints what stands in for
// what.
func openDevice(o RunOptions) (*device, error) {
	switch o.Device {
	case "host":
		fmt.Fprintf(o.Out, "pxn-bench: host-memory path: %d ranks as processes, host memory stands in for GPU memory, a TCP hop on loopback stands in for RDMA\n", o.Ranks)
		root := o.RegistryRoot
		if root == "" {
			root = "/dev/shm"
			if st, err := os.Stat(root); err != nil || !st.IsDir() {
				root = os.TempDir()
			}
		}
		return &device{kind: "host", hop: "hop", registry: root, startup: time.Minute}, nil
	case "cuda":
	default:
		return nil, fmt.Errorf("--device %q: want host or cuda", o.Device)
	}
	d, err := cuda.Load()
	if err != nil {
		return nil, fmt.Errorf("--device cuda: %w; this machine cannot run the CUDA path (--device host runs without a GPU)", err)
	}
	defer d.Close()
	n, err := d.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("--device cuda: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("--device cuda: the driver reports no CUDA device")
	}
	var names []string
	for i := 0; i < n; i++ {
		dev, err := d.DeviceGet(i)
		if err != nil {
			return nil, err
		}
		name, _ := d.DeviceName(dev)
		names = append(names, name)
	}
	drv := d.Version()
	fmt.Fprintf(o.Out, "pxn-bench: CUDA path: %d GPUs (%s), driver CUDA %d.%d; ranks and targets are processes, rails are simulated, the second hop is an emulated NIC (writes into the target processes' device buffers, one GPU operation per batch of ops, completions paced by a wire of --rate GB/s)\n",
		n, strings.Join(names, ", "), drv/1000, drv%1000/10)
	mps := detectMPS(o.Getenv)
	fmt.Fprintf(o.Out, "pxn-bench: MPS %s: %s\n", mps, mps.why)
	root := o.RegistryRoot
	if root == "" {
		root = "/dev/shm"
	}
	return &device{kind: "cuda", hop: "emulated NIC", spin: true, registry: root, ngpu: n, startup: 3 * time.Minute, mps: mps}, nil
}

func parseSuite(s string) (map[string]bool, error) {
	want := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		switch p = strings.ToLower(strings.TrimSpace(p)); p {
		case "all":
			want["p1"], want["p2"], want["p3"] = true, true, true
		case "p1", "p2", "p3", "p9", "p10", "p14":
			want[p] = true
		default:
			return nil, fmt.Errorf("--suite %q: want all (p1, p2, p3) or a list of p1, p2, p3, p9, p10, p14", s)
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
	return append(runs, kvSuiteRuns(want, ngpu)...)
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

// nicTargetJSON is one target of the NIC file the parent gives the CUDA
// ranks.
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
	// runs counts the pump thread's wake-ups; sleeps and wakes are its
	// sleeps on the wake word and those a waker ended.
	runs, sleeps, wakes uint64
	// contended and outOfTurn are the relay's turn counters
	// (relay.CounterSnapshot's InboundContended and InboundOutOfTurn).
	contended, outOfTurn uint64
}

// phaseResult is one phase's reports.
type phaseResult struct {
	ranks      []rankResult
	again      []rankResult
	busy       []busyWindow
	opens      []openResult
	raws       []rawResult
	lats       []latencyResult
	idle       []idleResult
	idleDirect []idleResult
	// Each rank's Piece times after the timed transfer (kv), after the
	// latency writes and after the write after idle.
	kvTimes, latTimes, idleTimes [][]relay.PieceTimes
	routed                       bool
	verified                     bool
	verifyErr                    string
	// shares are the relays' arenas the ranks mapped, by the way shared.
	shares shareCounts
}

// exec runs one scenario: the targets, then the engine phase and the
// baseline phase against the same targets.
func (dev *device) exec(o RunOptions, s scenario) ([]Row, error) {
	var l *layout
	var err error
	if s.kv != nil {
		l, err = newKVLayout(s.ranks, *s.kv)
	} else {
		l, err = newLayout(s.pattern, s.ranks, s.bytes, s.block)
	}
	if err != nil {
		return nil, err
	}
	if l.HCAs, l.Rails, err = nodeRails(l.Ranks, o.RailMap); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "pxn-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	registry, err := os.MkdirTemp(dev.registry, "pxn-bench-registry-")
	if err != nil {
		return nil, fmt.Errorf("the ranks' registry (a tmpfs: it holds the staging arenas and the control blocks): %w", err)
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
	var dirList []fabric.StaticTarget
	var nics []nicTargetJSON
	for k := 0; k < l.Ranks; k++ {
		c, err := startChild(fmt.Sprintf("target %d", k), nil, "target", "--device", dev.kind, "--index", strconv.Itoa(k),
			"--gpu", strconv.Itoa(s.gpu(k)), "--layout", layoutPath)
		if err != nil {
			return nil, err
		}
		targets = append(targets, c)
		ev, err := c.expect("listening", dev.startup)
		if err != nil {
			return nil, err
		}
		n := max(l.TargetBytes[k], 1)
		t := fabric.StaticTarget{Session: sessionName(k), HCAs: []string{remoteHCA(k)}, Ranges: []fabric.StaticRange{{Addr: targetBase, Len: n}}}
		if dev.kind == "cuda" {
			nics = append(nics, nicTargetJSON{Session: sessionName(k), Addr: targetBase, Len: n, Handle: ev.Addr})
		} else {
			t.Addr = ev.Addr
		}
		dirList = append(dirList, t)
	}
	dir, err := fabric.NewStaticDirectory(dirList)
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
	rm, err := contract.EncodeRailMap(l.railMap())
	if err != nil {
		return nil, err
	}
	env := func(enable, group string) []string {
		e := []string{contract.EnvEnable + "=" + enable, contract.EnvGroupID + "=" + group, contract.EnvRegistryRoot + "=" + registry, contract.EnvRailMap + "=" + rm}
		return append(e, o.rankEnv()...)
	}
	args := func(k int, mode string) []string {
		a := []string{"rank", "--device", dev.kind, "--index", strconv.Itoa(k), "--gpu", strconv.Itoa(s.gpu(k)), "--layout", layoutPath,
			"--directory", dirPath, "--nic", nicPath, "--mode", mode, "--rate", strconv.FormatFloat(s.rate, 'g', -1, 64),
			"--registry", registry, "--latency", strconv.Itoa(s.latency), "--reps", strconv.Itoa(max(s.reps, 1)), "--per-submit", strconv.Itoa(o.PerSubmit)}
		if o.CUDA.GatherPTX != "" {
			a = append(a, "--gather-ptx", o.CUDA.GatherPTX)
		}
		if o.CUDA.NoInlinePlan {
			a = append(a, "--no-inline-plan")
		}
		if mode == "engine" && (s.kv != nil && s.kv.Inflight == 1 || s.latency > 0 || s.idle) {
			a = append(a, "--piece-times")
		}
		if o.CUDA.PollSpin != 0 || o.CUDA.PollNap != 0 {
			a = append(a, "--poll-spin", o.CUDA.PollSpin.String(), "--poll-nap", o.CUDA.PollNap.String())
		}
		if o.CUDA.ArenaShare != "" {
			a = append(a, "--arena-share", o.CUDA.ArenaShare)
		}
		if o.PIDNS {
			a = append(a, "--own-proc")
		}
		return a
	}
	pxn, err := dev.phase(s, l, targets, args, "engine", env("1", "bench-pxn"))
	if err != nil {
		return nil, fmt.Errorf("engine phase: %w", err)
	}
	var bare *phaseResult
	if s.bare {
		if bare, err = dev.phase(s, l, targets, args, "bare", env("0", "bench-bare")); err != nil {
			return nil, fmt.Errorf("baseline phase ("+contract.EnvEnable+"=0): %w", err)
		}
	}
	return dev.summarize(s, l, pxn, bare), nil
}

// gpu is the GPU of rank and target k (0 where the scenario names none).
func (s scenario) gpu(k int) int {
	if k < len(s.gpus) {
		return s.gpus[k]
	}
	return 0
}

// phase runs one phase: every rank opens its engine, finds its relays,
// transfers its share at once with the others, and reports; then the
// ranks exit and the targets check every byte.
func (dev *device) phase(s scenario, l *layout, targets []*child, args func(int, string) []string, mode string, env []string) (*phaseResult, error) {
	var ranks []*child
	defer func() {
		for _, c := range ranks {
			c.kill()
		}
	}()
	label := "PXN phase (" + contract.EnvEnable + "=1)"
	if mode != "engine" {
		label = "baseline phase (" + contract.EnvEnable + "=0, the " + dev.hop + " alone)"
	}
	if s.id != "" {
		label = s.id + " " + label
	}
	dev.say("%s: starting %d ranks and opening their engines", label, l.Ranks)
	for k := 0; k < l.Ranks; k++ {
		c, err := startChildIn(fmt.Sprintf("rank %d", k), dev.pidns, env, args(k, mode)...)
		if err != nil {
			return nil, err
		}
		ranks = append(ranks, c)
	}
	if _, err := all(ranks, "", "ready", dev.startup); err != nil {
		return nil, err
	}
	res := &phaseResult{routed: true}
	// Ranks open their engines one at a time when the open's cost is
	// measured: the free memory a rank reads is the whole GPU's.
	var opened []event
	if s.p6 {
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
	if s.warm {
		dev.say("%s: an untimed warm-up transfer", label)
		if _, err := all(ranks, "warm", "warmed", 20*time.Minute); err != nil {
			return nil, err
		}
	}
	before, err := all(ranks, "stats", "stats", time.Minute)
	if err != nil {
		return nil, err
	}
	dev.say("%s: every rank transfers its share at once", label)
	t0 := time.Now()
	evs, err := all(ranks, "go", "done", 30*time.Minute)
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
		if s := after[k].Result.Shares; s != nil {
			res.shares.add(*s)
		}
		a, b := after[k].Result, before[k].Result
		res.busy = append(res.busy, busyWindow{pumpCPU: a.PumpCPU - b.PumpCPU, seconds: window,
			runs: a.PumpRuns - b.PumpRuns, sleeps: a.Counters.PumpSleeps - b.Counters.PumpSleeps, wakes: a.Counters.PumpWakes - b.Counters.PumpWakes,
			relayed: a.Counters.RelayedPieces - b.Counters.RelayedPieces, forwarded: a.Counters.ForwardedPieces - b.Counters.ForwardedPieces,
			contended: a.Counters.InboundContended - b.Counters.InboundContended, outOfTurn: a.Counters.InboundOutOfTurn - b.Counters.InboundOutOfTurn})
	}
	engine := mode == "engine"
	// what, when not empty, is the step's progress line.
	steps := []struct {
		on        bool
		cmd       string
		what      string
		timeout   time.Duration
		collected func(event)
	}{
		{engine && s.kv != nil && s.kv.Inflight == 1, "times", "", time.Minute, func(ev event) { res.kvTimes = append(res.kvTimes, ev.Times) }},
		{engine && s.again, "again", "the same transfer again, counting heap allocations (--alloc-pass)", 30 * time.Minute, func(ev event) { res.again = append(res.again, *ev.Result) }},
		{engine && s.raw, "raw", "a raw copy-engine copy of the same traffic (--raw)", 10 * time.Minute, func(ev event) { res.raws = append(res.raws, *ev.Raw) }},
		{engine && s.latency > 0, "latency", fmt.Sprintf("%d 10KiB writes through PXN and direct (--latency)", s.latency), 10 * time.Minute, func(ev event) { res.lats = append(res.lats, *ev.Latency) }},
		{engine && s.latency > 0, "times", "", time.Minute, func(ev event) { res.latTimes = append(res.latTimes, ev.Times) }},
		{engine && s.idle, "idle", fmt.Sprintf("the ranks stay idle for %v (the pumps' CPU while idle), then time the first write after it", idleWindow), time.Minute, func(ev event) { res.idle = append(res.idle, *ev.Idle) }},
		{engine && s.idle, "times", "", time.Minute, func(ev event) { res.idleTimes = append(res.idleTimes, ev.Times) }},
		// On GPUs the first write after idle is compared with a direct
		// one after as long an idle: the GPU's and the NIC emulation's
		// share of it.
		{engine && s.idle && dev.kind == "cuda", "idle-direct", fmt.Sprintf("the same write on a direct hop after %v idle", idleWindow), time.Minute, func(ev event) { res.idleDirect = append(res.idleDirect, *ev.Idle) }},
	}
	for _, st := range steps {
		if !st.on {
			continue
		}
		if st.what != "" {
			dev.say("%s: %s", label, st.what)
		}
		want := st.cmd
		if want == "again" {
			want = "done"
		}
		evs, err := all(ranks, st.cmd, want, st.timeout)
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			st.collected(ev)
		}
	}
	if engine && s.hold > 0 {
		fmt.Fprintf(os.Stderr, "pxn-bench: the ranks stay registered for %v (--hold-after)\n", s.hold)
		time.Sleep(s.hold)
	}
	dev.say("%s: the ranks exit; the targets check every byte they received", label)
	if res.verified, res.verifyErr, err = endPhase(ranks, targets, 2*time.Minute); err != nil {
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

// span is a phase's bytes and the time from the first rank's start to the
// last rank's end: ranks that ran at once, timed as one transfer.
func (p *phaseResult) span() (bytes uint64, secs float64, failed int) {
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

// firstError is the first failed task's error any rank reported.
func (p *phaseResult) firstError() string {
	for _, r := range p.ranks {
		if r.FirstError != "" {
			return fmt.Sprintf("rank %d: %s", r.Rank, r.FirstError)
		}
	}
	return ""
}

// title names a scenario's main row.
func (dev *device) title(s scenario) string {
	block := s.block
	if block == 0 || block > s.bytes {
		block = s.bytes
	}
	what := fmt.Sprintf("%s requests", sizeString(block))
	if s.kv != nil {
		what = kvTitle(*s.kv)
	}
	if dev.kind == "host" {
		if s.kv != nil {
			return fmt.Sprintf("%s %d ranks, %s", s.pattern, s.ranks, what)
		}
		return fmt.Sprintf("%s %d ranks, block %s", s.pattern, s.ranks, sizeString(block))
	}
	label := ""
	if s.id != "" {
		label = s.id + ": "
	}
	var where []string
	for k := 0; k < s.ranks; k++ {
		where = append(where, strconv.Itoa(s.gpu(k)))
	}
	nic := "NIC uncapped"
	if s.rate > 0 {
		nic = fmt.Sprintf("NIC capped at %g GB/s", s.rate)
	}
	return fmt.Sprintf("%s%s %d ranks on GPUs [%s], %s, %s", label, s.pattern, s.ranks, strings.Join(where, " "), what, nic)
}

func (dev *device) summarize(s scenario, l *layout, pxn, bare *phaseResult) []Row {
	prefix := ""
	if s.id != "" {
		prefix = s.id + " "
	}
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
	main := Row{Scenario: dev.title(s), Bytes: bytes, Pieces: pieces, GBps: gbps, RelayedBytes: relayed, FallbackBytes: fallback,
		DirectBytes: direct, Failed: failed, Verified: pxn.verified, Note: s.note}
	if pieces > 0 {
		main.USPerPiece = secs * 1e6 / float64(pieces)
	}
	var rawRow, bareRow *Row
	if len(pxn.raws) > 0 {
		var rb uint64
		var rs float64
		for _, x := range pxn.raws {
			rb += x.Bytes
			rs = max(rs, x.Seconds)
		}
		rawRow = &Row{Scenario: prefix + "baseline: raw copy-engine copy of the same bytes (cuMemcpyAsync, one stream per sender)", Bytes: rb, GBps: gbpsOf(rb, rs), Verified: pxn.verified}
	}
	if bare != nil {
		bb, bs, bf := bare.span()
		bareRow = &Row{Scenario: prefix + "baseline: same traffic, " + dev.hop + " alone (" + contract.EnvEnable + "=0)", Bytes: bb, GBps: gbpsOf(bb, bs), DirectBytes: bb, Failed: bf, Verified: bare.verified, Note: bare.verifyErr}
	}
	switch {
	case s.kv != nil && bareRow != nil:
		main.Baseline, main.BaselineGBps = kvBaseline(s, l, dev.hop, bareRow.GBps)
	case s.rate > 0:
		main.Baseline, main.BaselineGBps = "R, the emulated NIC's cap", s.rate
	case rawRow != nil:
		main.Baseline, main.BaselineGBps = "raw copy-engine copy", rawRow.GBps
	case bareRow != nil:
		main.Baseline, main.BaselineGBps = dev.hop+" alone (direct)", bareRow.GBps
	}
	ok := failed == 0 && pxn.verified && (bareRow == nil || (bareRow.Failed == 0 && bareRow.Verified))
	if ok && main.BaselineGBps > 0 {
		main.Ratio = gbps / main.BaselineGBps
	}
	if fallback > 0 {
		main.Note = strings.TrimPrefix(main.Note+"; fell back by reason: "+fallbackReasons(pxn.ranks), "; ")
	}
	if !pxn.routed && s.pattern != "same-rail" {
		main.Note = strings.TrimPrefix(main.Note+"; not every rank found its relay in time", "; ")
	}
	if pxn.verifyErr != "" {
		main.Note = pxn.verifyErr
	}
	if e := pxn.firstError(); e != "" {
		main.Note = strings.TrimPrefix(main.Note+"; first failed task: "+e, "; ")
	}
	rows := []Row{main}
	if rawRow != nil {
		rows = append(rows, *rawRow)
	}
	if bareRow != nil {
		rows = append(rows, *bareRow)
	}
	if s.kv != nil {
		rows = append(rows, kvRows(prefix, pxn, bare)...)
		rows = append(rows, stepRows(prefix, "request", joinTimes(pxn.kvTimes), false)...)
	}
	rows = append(rows, fairRows(prefix, s.pattern, pxn.ranks, pxn.busy, pxn.verified)...)
	rows = append(rows, latencyRows(prefix, dev.hop, pxn.lats)...)
	rows = append(rows, stepRows(prefix, "P4 10KiB write", joinTimes(pxn.latTimes), false)...)
	rows = append(rows, pumpRows(prefix, pxn, pieces, forwarded)...)
	rows = append(rows, stepRows(prefix, fmt.Sprintf("P4 first write after %v idle", idleWindow), joinTimes(pxn.idleTimes), true)...)
	if r, ok := shareRow(prefix, pxn, dev.pidns); ok {
		rows = append(rows, r)
	}
	if s.p6 && bare != nil {
		rows = append(rows, p6Rows(prefix, pxn, bare)...)
	}
	return rows
}

// fallbackReasons names, for every reason any rank counted, the bytes and
// Pieces that went direct for it, summed over the ranks.
func fallbackReasons(ranks []rankResult) string {
	var bytes, pieces staging.FallbackCounts
	for _, rr := range ranks {
		for i := range bytes {
			bytes[i] += rr.Counters.FallbackBytesByReason[i]
			pieces[i] += rr.Counters.FallbackPiecesByReason[i]
		}
	}
	var parts []string
	for i := range bytes {
		if pieces[i] > 0 {
			parts = append(parts, fmt.Sprintf("%s %s in %d Pieces", staging.FallbackReasonName(i), sizeString(bytes[i]), pieces[i]))
		}
	}
	return strings.Join(parts, ", ")
}

func latencyRows(prefix, hop string, lats []latencyResult) []Row {
	var rows []Row
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
			Row{Scenario: prefix + "P4 10KiB write through PXN, p50", Value: l.PXN[0], Unit: "µs", Verified: ok, Note: note},
			Row{Scenario: prefix + "P4 10KiB write through PXN, p99", Value: l.PXN[1], Unit: "µs", Verified: ok},
			Row{Scenario: prefix + "P4 10KiB write direct (" + hop + " alone), p50", Value: l.Direct[0], Unit: "µs", Verified: ok},
			Row{Scenario: prefix + "P4 10KiB write direct (" + hop + " alone), p99", Value: l.Direct[1], Unit: "µs", Verified: ok},
			Row{Scenario: prefix + "P4 latency added by PXN, p50", Value: l.PXN[0] - l.Direct[0], Unit: "µs", Verified: ok},
			Row{Scenario: prefix + "P4 latency added by PXN, p99", Value: l.PXN[1] - l.Direct[1], Unit: "µs", Verified: ok},
		)
	}
	return rows
}

func pumpRows(prefix string, p *phaseResult, pieces, forwarded uint64) []Row {
	var rows []Row
	if len(p.idle) > 0 {
		var idle float64
		var runs uint64
		var first, firstSubmit, direct float64
		var firstErr string
		for _, i := range p.idle {
			idle = max(idle, i.PumpPercent)
			runs = max(runs, i.PumpRuns)
			if i.FirstWriteUS > first {
				first, firstSubmit = i.FirstWriteUS, i.FirstSubmitUS
			}
			if firstErr == "" {
				firstErr = i.FirstError
			}
		}
		for _, i := range p.idleDirect {
			direct = max(direct, i.DirectFirstWriteUS)
			if firstErr == "" {
				firstErr = i.FirstError
			}
		}
		rows = append(rows, Row{Scenario: prefix + fmt.Sprintf("P5 pump CPU while idle (busiest rank, %v)", idleWindow), Value: idle, Unit: "% of a core", Verified: true,
			Note: fmt.Sprintf("%d pump wake-ups in the window (schedstat)", runs)})
		if first > 0 {
			var steady, steadyDirect float64
			for _, l := range p.lats {
				steady = max(steady, l.PXN[0])
				steadyDirect = max(steadyDirect, l.Direct[0])
			}
			r := Row{Scenario: prefix + fmt.Sprintf("P4 first 10KiB write through PXN after %v idle", idleWindow), Value: first, Unit: "µs", Verified: firstErr == "", Note: firstErr}
			if steady > 0 {
				r.Baseline, r.Ratio = fmt.Sprintf("steady-state p50 of the same write, %.1f µs", steady), first/steady
				r.Note = strings.TrimPrefix(r.Note+fmt.Sprintf("; %.2f × the steady-state p50 of the same write (%.1f µs); one write per sender, the slowest; its Submit call %.1f µs", first/steady, steady, firstSubmit), "; ")
			}
			rows = append(rows, r)
			if direct > 0 {
				d := Row{Scenario: prefix + fmt.Sprintf("P4 first 10KiB write direct after %v idle", idleWindow), Value: direct, Unit: "µs", Verified: firstErr == "",
					Note: "the same write on a direct hop of its own, warmed and then idle as long: the part of the write after idle that is not the engine's"}
				if steadyDirect > 0 {
					d.Baseline, d.Ratio = fmt.Sprintf("steady-state p50 of the direct write, %.1f µs", steadyDirect), direct/steadyDirect
				}
				rows = append(rows, d)
			}
		}
	}
	var relayBusy, sendBusy, cpu float64
	var runs, sleeps, wakes uint64
	for _, b := range p.busy {
		cpu += b.pumpCPU
		runs += b.runs
		sleeps += b.sleeps
		wakes += b.wakes
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
		rows = append(rows, Row{Scenario: prefix + "P5 pump CPU while busy, relay rank", Value: relayBusy, Unit: "% of a core", Verified: true, Note: note})
	}
	if sendBusy > 0 {
		rows = append(rows, Row{Scenario: prefix + "P5 pump CPU while busy, busiest sender", Value: sendBusy, Unit: "% of a core", Verified: true})
	}
	if n := pieces + forwarded; n > 0 {
		rows = append(rows, Row{Scenario: prefix + "P5 pump CPU per piece (sender and relay pieces)", Value: cpu * 1e6 / float64(n), Unit: "µs", Pieces: n, Verified: true},
			Row{Scenario: prefix + "P5 pump wake-ups per piece (sender and relay, schedstat)", Value: float64(runs) / float64(n), Unit: "runs", Pieces: n, Verified: true,
				Note: fmt.Sprintf("sleeps on the wake word %.2f a piece, %.2f of them ended by a waker", float64(sleeps)/float64(n), float64(wakes)/float64(n))})
	}
	var mallocs uint64
	for _, r := range p.ranks {
		mallocs += r.Mallocs
	}
	allocs := prefix + "P5 heap allocations per piece, first pass (whole process, hop included; warm-up counts: pools, connections, first use of buffers)"
	if len(p.again) > 0 {
		allocs = prefix + "P5 heap allocations per piece, second pass (steady state; whole process, hop included)"
		mallocs, pieces, forwarded = 0, 0, 0
		for _, r := range p.again {
			mallocs += r.Mallocs
			pieces += r.Counters.RelayedPieces + r.Counters.FallbackPieces
			forwarded += r.Counters.ForwardedPieces
		}
	}
	if n := pieces + forwarded; n > 0 {
		rows = append(rows, Row{Scenario: allocs, Value: float64(mallocs) / float64(n), Unit: "allocs", Pieces: n, Verified: true})
	}
	return rows
}

func p6Rows(prefix string, pxn, bare *phaseResult) []Row {
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
	note := fmt.Sprintf("with "+contract.EnvEnable+"=1 the same open took %s of device memory", sizeString(uint64(max(onMem, 0))))
	return []Row{
		{Scenario: prefix + "P6 " + contract.EnvEnable + "=0: device memory taken by the open (cuMemGetInfo, largest of the ranks)", Value: float64(mem), Unit: "bytes", Verified: ok, Note: note},
		{Scenario: prefix + "P6 " + contract.EnvEnable + "=0: extra threads", Value: float64(threads), Unit: "threads", Verified: ok},
		{Scenario: prefix + "P6 " + contract.EnvEnable + "=0: extra goroutines", Value: float64(gor), Unit: "goroutines", Verified: ok},
		{Scenario: prefix + "P6 " + contract.EnvEnable + "=0: files and folders added under the registry root", Value: float64(shm), Unit: "entries", Verified: ok},
	}
}

// firsthop runs P2 in a child process (the parent keeps no CUDA context).
func (dev *device) firsthop(o RunOptions) ([]Row, error) {
	sender := min(1, dev.ngpu-1)
	args := []string{"cuda-firsthop", "--relay-gpu", "0", "--sender-gpu", strconv.Itoa(sender)}
	if o.CUDA.GatherPTX != "" {
		args = append(args, "--gather-ptx", o.CUDA.GatherPTX)
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
