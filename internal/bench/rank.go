// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// rankResult is what one rank reports after its transfers.
type rankResult struct {
	Rank       int                   `json:"rank"`
	Bytes      uint64                `json:"bytes"`
	Requests   int                   `json:"requests"`
	Seconds    float64               `json:"seconds"`
	Failed     int                   `json:"failed"`
	FirstError string                `json:"firstError,omitempty"`
	Counters   relay.CounterSnapshot `json:"counters"`
	PumpCPU    float64               `json:"pumpCPU"`
	// PumpRuns is how many times the pump thread was put on a CPU.
	PumpRuns   uint64  `json:"pumpRuns,omitempty"`
	ProcessCPU float64 `json:"processCPU"`
	Mallocs    uint64  `json:"mallocs"`
	PXNActive  bool    `json:"pxnActive"`
	// StartNs and EndNs bound the timed transfer (Unix nanoseconds) where
	// the parent times ranks that ran at once as one transfer.
	StartNs int64 `json:"startNs,omitempty"`
	EndNs   int64 `json:"endNs,omitempty"`
	// CompletionsUS and SubmitUS are, for KV traffic, each request's time
	// from its submission to its completion and its Submit call's own time.
	CompletionsUS []float64 `json:"completionsUs,omitempty"`
	SubmitUS      []float64 `json:"submitUs,omitempty"`
	// Progress is the engine transfer's completed bytes over time, a
	// sample at most every progressEvery, for shares over a window.
	Progress []progressSample `json:"progress,omitempty"`
	// Shares are the relays' arenas this rank mapped so far, by the way
	// each was shared (device arenas only).
	Shares *shareCounts `json:"shares,omitempty"`
}

// fail counts one failed task; the first error is kept.
func (r *rankResult) fail(err error) {
	r.Failed++
	if r.FirstError == "" && err != nil {
		r.FirstError = err.Error()
	}
}

// pause is a transfer loop's wait when nothing completed: a yield for a
// spinning device, else 20 µs.
func pause(spin bool) {
	if spin {
		runtime.Gosched()
		return
	}
	time.Sleep(20 * time.Microsecond)
}

// engineCost is what an engine transfer costs its process from start to
// record: the engine's counters, the pump thread's and the process's CPU,
// and heap allocations.
type engineCost struct {
	eng        *relay.Engine
	counters   relay.CounterSnapshot
	mallocs    uint64
	pump, proc float64
}

func startCost(eng *relay.Engine) engineCost {
	c := engineCost{eng: eng, counters: eng.Counters()}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	c.mallocs = ms.Mallocs
	c.pump, _ = cpuTime(eng.PumpThreadID())
	c.proc, _ = cpuTime(0)
	return c
}

// record puts the costs since startCost into res, which must exist before
// startCost so that its allocation is not counted.
func (c engineCost) record(res *rankResult) {
	pump, _ := cpuTime(c.eng.PumpThreadID())
	proc, _ := cpuTime(0)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.PXNActive = c.eng.PXNActive()
	res.PumpCPU, res.ProcessCPU, res.Mallocs = pump-c.pump, proc-c.proc, ms.Mallocs-c.mallocs
	res.Counters = diffCounters(c.eng.Counters(), c.counters)
}

// progressSample is a rank's completed bytes at a moment (Unix
// nanoseconds).
type progressSample struct {
	Ns    int64  `json:"ns"`
	Bytes uint64 `json:"bytes"`
}

// progressEvery is the spacing of progress samples.
const progressEvery = time.Millisecond

// progress records the completed bytes of batches as they change.
type progress struct {
	batches []*relay.Batch
	last    time.Time
	samples []progressSample
}

// sample adds a sample when progressEvery has passed and the bytes moved.
func (p *progress) sample(now time.Time) {
	if now.Sub(p.last) < progressEvery {
		return
	}
	p.last = now
	var done uint64
	for _, b := range p.batches {
		for i := range b.Len() {
			if st, err := b.Status(i); err == nil {
				done += st.Transferred
			}
		}
	}
	if n := len(p.samples); n > 0 && p.samples[n-1].Bytes == done {
		return
	}
	p.samples = append(p.samples, progressSample{Ns: now.UnixNano(), Bytes: done})
}

// idleResult is CPU use over idleWindow, and the first 10 KiB write after
// it (µs; 0 for a rank without transfers of its own).
type idleResult struct {
	PumpPercent    float64 `json:"pumpPercent"`
	ProcessPercent float64 `json:"processPercent"`
	PumpRuns       uint64  `json:"pumpRuns"`
	Seconds        float64 `json:"seconds"`
	FirstWriteUS   float64 `json:"firstWriteUs,omitempty"`
	// FirstSubmitUS is how much of FirstWriteUS the Submit call took.
	FirstSubmitUS float64 `json:"firstSubmitUs,omitempty"`
	// DirectFirstWriteUS is the same write on a direct hop of its own,
	// warmed before the same idle window (idleProbe).
	DirectFirstWriteUS float64 `json:"directFirstWriteUs,omitempty"`
	FirstError         string  `json:"firstError,omitempty"`
}

// idleWindow is how long ranks stay idle before the first write after
// idle, their pumps' CPU measured over it (P4, P5).
const idleWindow = 10 * time.Second

// openResult is what opening the engine cost a rank (P6).
type openResult struct {
	// DeviceBytes is the drop in the GPU's free memory across the open.
	DeviceBytes int64 `json:"deviceBytes"`
	Threads     int   `json:"threads"`
	Goroutines  int   `json:"goroutines"`
	// ShmEntries counts files and folders the open added under the
	// registry root.
	ShmEntries int    `json:"shmEntries"`
	PXN        bool   `json:"pxn"`
	Copier     string `json:"copier,omitempty"`
}

// rawResult is a raw copy-engine copy of a rank's traffic.
type rawResult struct {
	Bytes   uint64  `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

// latencyResult is the 10 KiB write latency, in µs: p50, p99, mean, p90,
// p99.9, max.
type latencyResult struct {
	N          int        `json:"n"`
	PXN        [6]float64 `json:"pxn"`
	Direct     [6]float64 `json:"direct"`
	GCs        uint32     `json:"gcs"`
	Relayed    uint64     `json:"relayed"`
	Failed     int        `json:"failed"`
	FirstError string     `json:"firstError,omitempty"`
}

// RankOptions are a rank process's flags, set by the parent.
type RankOptions struct {
	Device    string
	Index     int
	GPU       int
	Layout    string
	Directory string
	NIC       string
	Mode      string
	Rate      float64
	Registry  string
	Latency   int
	Reps      int
	PerSubmit int
	GatherPTX string
	// NoInlinePlan uploads every gather plan (measurements).
	NoInlinePlan bool
	// PollSpin and PollNap replace the pump's poll policy (zero: default).
	PollSpin, PollNap time.Duration
	// ArenaShare is how the rank shares its device arena.
	ArenaShare string
	// OwnProc: the rank is PID 1 of its own namespaces and mounts /proc.
	OwnProc bool
	// PieceTimes keeps the engine's Piece times, for a run that takes a
	// Piece's way apart step by step (off, they cost nothing).
	PieceTimes bool
}

// rankDevice is what a rank needs of its device: source memory filled with
// its pattern, the second hop, and the first hop's copier.
type rankDevice interface {
	// source returns the address of n bytes holding the pattern of seed.
	source(n, seed uint64) (uintptr, error)
	// hop is the second hop the engine and the baseline use.
	hop() relay.Hop
	// newHop makes another hop of the same kind, for direct writes timed
	// beside the engine's.
	newHop() (relay.Hop, error)
	// firstHop fills deps with the copier (and arenas) PXN needs; it is
	// called only when MC_PXN_ENABLE turns PXN on. It describes the copier.
	firstHop(deps *engineopen.HostDeps, src uintptr, n uint64) (string, error)
	// freeMemory is the device's free memory, or false where there is no
	// device memory to count.
	freeMemory() (uint64, bool)
	// rawCopy times a plain copy of the rank's requests into the targets.
	rawCopy(reqs []relay.Request, total uint64, reps int) (*rawResult, error)
	// spin makes waits poll without sleeping.
	spin() bool
	close() error
}

// RankMain is one rank of a run: it reports on stdout, one JSON event a
// line, and returns the command's exit status.
func RankMain(o RankOptions) int {
	if o.OwnProc {
		if err := mountOwnProc(); err != nil {
			emit(event{Event: "error", Error: err.Error()})
			return 1
		}
	}
	if err := runRank(o); err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	return 0
}

func runRank(o RankOptions) (err error) {
	l, err := readLayout(o.Layout)
	if err != nil {
		return err
	}
	dir, err := fabric.ReadStaticDirectory(o.Directory)
	if err != nil {
		return err
	}
	var dev rankDevice
	switch o.Device {
	case "host":
		dev = newHostRank(dir, 0)
	case "cuda":
		dev, err = newCUDARank(o)
	default:
		err = fmt.Errorf("--device %q: want host or cuda", o.Device)
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dev.close()) }()
	n := max(l.sourceBytes(o.Index), 1)
	base, err := dev.source(n, rankSeed(o.Index))
	if err != nil {
		return err
	}
	emit(event{Event: "ready", Pid: os.Getpid()})

	mine := l.ofRank(o.Index)
	var eng *relay.Engine
	closeEngine := func() error {
		if eng == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e := eng
		eng = nil
		return e.Close(ctx)
	}
	defer func() { err = errors.Join(err, closeEngine()) }()
	// probe is the direct hop warmed before the idle window, until the
	// direct write after it.
	var probe *idleProbe
	defer func() {
		if probe != nil {
			probe.closeHop()
		}
	}()
	for cmd := range commands() {
		switch cmd {
		case "open":
			res, e, err := openEngine(dev, dir, o, l.HCAs[o.Index], base, n)
			if err != nil {
				return err
			}
			eng = e
			emit(event{Event: "opened", Open: res})
		case "route":
			emit(event{Event: "routed", Routed: waitRoutes(eng, l.Rails, mine, o.Index)})
		case "warm", "go", "again":
			reps := 1
			if cmd == "go" {
				reps = max(o.Reps, 1)
			}
			res, err := repeat(reps, func() (*rankResult, error) {
				if l.KV != nil {
					reqs, total := l.kvRequests(o.Index, base)
					if o.Mode == "engine" && eng != nil {
						return transferKVEngine(eng, reqs, total, l.KV.Inflight, dev.spin())
					}
					return transferKVBare(dev.hop(), reqs, total, l.KV.Inflight, dev.spin())
				}
				if o.Mode == "engine" && eng != nil {
					return transferEngine(eng, mine, base, dev.spin(), o.PerSubmit)
				}
				return transferBare(dev.hop(), mine, base, dev.spin(), o.PerSubmit)
			})
			if err != nil {
				return err
			}
			res.Rank = o.Index
			name := "done"
			if cmd == "warm" {
				name = "warmed"
			}
			emit(event{Event: name, Result: res})
		case "stats":
			res := &rankResult{Rank: o.Index}
			if eng != nil {
				res.PumpCPU, _ = cpuTime(eng.PumpThreadID())
				res.PumpRuns = threadRuns(eng.PumpThreadID())
				res.Counters = eng.Counters()
			}
			if sh, ok := dev.(arenaSharer); ok {
				res.Shares = sh.arenaShares()
			}
			emit(event{Event: "stats", Result: res})
		case "raw":
			reqs, total := requests(mine, base)
			res, err := dev.rawCopy(reqs, total, max(o.Reps, 1))
			if err != nil {
				return err
			}
			emit(event{Event: "raw", Raw: res})
		case "latency":
			res, err := measureLatency(eng, dev, mine, base, o.Latency)
			if err != nil {
				return err
			}
			emit(event{Event: "latency", Latency: res})
		case "idle":
			var res *idleResult
			res, probe = measureIdle(eng, dev, mine, base)
			emit(event{Event: "idle", Idle: res})
		case "first":
			emit(event{Event: "first", Idle: firstWrite(eng, mine, base)})
		case "first-direct":
			emit(event{Event: "first-direct", Idle: probe.write()})
			probe = nil
		case "times":
			var ts []relay.PieceTimes
			if eng != nil {
				ts = eng.PieceTimes(nil)
			}
			emit(event{Event: "times", Times: ts})
		case "exit":
			if err := closeEngine(); err != nil {
				return fmt.Errorf("close: %w", err)
			}
			emit(event{Event: "closed"})
			return nil
		}
	}
	return errors.New("parent went away")
}

// openEngine opens the engine the way a host process would: the copier
// (and, on GPUs, the arenas) exist only when MC_PXN_ENABLE says PXN is on.
// It reports what the open cost (P6).
func openEngine(dev rankDevice, dir relay.Directory, o RankOptions, hca string, src uintptr, n uint64) (*openResult, *relay.Engine, error) {
	// The main goroutine may hold its thread: the first time it sleeps,
	// the runtime starts another thread for the rest. Let that happen
	// before counting, so the count is the open's alone.
	time.Sleep(200 * time.Millisecond)
	free0, _ := dev.freeMemory()
	th0, gr0, sh0 := threadCount(), runtime.NumGoroutine(), countEntries(o.Registry)
	deps := engineopen.HostDeps{Hop: dev.hop(), Directory: dir, LocalHCA: hca}
	var desc string
	// engineopen.OpenFromEnv reports a refused configuration; this only asks
	// whether PXN is on.
	if engineconfig.Load(nil, nil).Enable {
		var err error
		if desc, err = dev.firstHop(&deps, src, n); err != nil {
			return nil, nil, err
		}
	}
	eng, err := engineopen.OpenFromEnv(context.Background(), nil, deps)
	if err != nil {
		return nil, nil, err
	}
	// A refused configuration leaves the engine open with PXN off; a run
	// measuring PXN stops here rather than wait for relays that never come.
	if eng.Counters().ConfigRefused > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return nil, nil, errors.Join(refusal(), eng.Close(ctx))
	}
	eng.KeepPieceTimes(o.PieceTimes)
	// Whatever the open starts (the pump, its registration) settles.
	time.Sleep(200 * time.Millisecond)
	res := &openResult{Threads: threadCount() - th0, Goroutines: runtime.NumGoroutine() - gr0,
		ShmEntries: countEntries(o.Registry) - sh0, PXN: eng.PXNActive(), Copier: desc}
	if free1, ok := dev.freeMemory(); ok {
		res.DeviceBytes = int64(free0) - int64(free1)
	}
	return res, eng, nil
}

// refusal names each variable the engine of this process refused, with its
// value and why: from the refusal record the engine wrote in its registry
// root (which it then removes), else from the engine's parser.
func refusal() error {
	var parts []string
	pid := os.Getpid()
	if root, err := engineconfig.RegistryRootFromEnv(nil); err == nil && root != "" {
		if rs, _, err := registry.ReadRefusals(root); err == nil {
			for _, r := range rs {
				if r.Pid != pid {
					continue
				}
				for _, v := range r.Variables {
					parts = append(parts, fmt.Sprintf("%s=%s: %s", v.Name, contract.Quote(v.Value), v.Reason))
				}
			}
		}
		_ = registry.RemoveRefusal(root, pid)
	}
	if len(parts) == 0 {
		_, errs := engineconfig.FromEnv(nil)
		for _, err := range errs {
			parts = append(parts, err.Error())
		}
	}
	return fmt.Errorf("the engine refused its configuration, PXN off: %s", strings.Join(parts, "; "))
}

func threadCount() int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	return len(ents)
}

func countEntries(root string) int {
	if root == "" {
		return 0
	}
	n := 0
	filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err == nil && p != root {
			n++
		}
		return nil
	})
	return n
}

// waitRoutes waits until every cross-rail target of this rank has a relay.
func waitRoutes(eng *relay.Engine, rails []string, mine []transfer, r int) bool {
	if eng == nil || !eng.PXNActive() {
		return false
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		ok := true
		for _, t := range mine {
			if t.Target != r && !eng.HasRelay(rails[t.Target]) {
				ok = false
			}
		}
		if ok {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}
