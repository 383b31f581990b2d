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
	"slices"
	"time"

	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/sim/fabric"
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
	// DirectFirstWriteUS is the same write on a direct hop of its own, the
	// first after an idle window of its own (measureIdleDirect).
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
	f, err := os.Open(o.Directory)
	if err != nil {
		return err
	}
	dir, err := fabric.LoadStaticDirectory(f)
	f.Close()
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
				return transferBare(dev.hop(), mine, base)
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
			emit(event{Event: "idle", Idle: measureIdle(eng, mine, base)})
		case "times":
			var ts []relay.PieceTimes
			if eng != nil {
				ts = eng.PieceTimes(nil)
			}
			emit(event{Event: "times", Times: ts})
		case "idle-direct":
			emit(event{Event: "idle-direct", Idle: measureIdleDirect(dev, mine, base)})
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

// spinBatch is how many requests a spinning rank submits at a time.
const spinBatch = 16

// maxRequest keeps every request under the TCP hop's frame limit (64 MiB);
// an RDMA transport would slice a large write itself.
const maxRequest = 32 << 20

func requests(mine []transfer, base uintptr) ([]relay.Request, uint64) {
	var reqs []relay.Request
	var total uint64
	for _, t := range mine {
		block := min(t.Block, maxRequest)
		for off := uint64(0); off < t.Len; off += block {
			n := min(block, t.Len-off)
			reqs = append(reqs, relay.Request{Op: relay.Write, Src: base + uintptr(t.Src+off), Len: n, Target: t.Remote, Dst: targetBase + t.Dst + off})
			total += n
		}
	}
	return reqs, total
}

// transferEngine moves a rank's requests through the engine. With spin it
// submits them in batches of spinBatch, so that planning the later ones
// overlaps the transfer of the first (a pipelined caller), and polls Done
// without sleeping (on GPUs, where a sleep is a visible part of a short
// run).
func transferEngine(eng *relay.Engine, mine []transfer, base uintptr, spin bool, perSubmit int) (*rankResult, error) {
	reqs, total := requests(mine, base)
	batch := len(reqs)
	if spin {
		batch = min(batch, spinBatch)
	}
	if perSubmit > 0 {
		batch = min(len(reqs), perSubmit)
	}
	res := &rankResult{Bytes: total, Requests: len(reqs)}
	cost := startCost(eng)
	start := time.Now()
	var batches []*relay.Batch
	for i := 0; i < len(reqs) || i == 0; i += max(batch, 1) {
		b, err := eng.Submit(reqs[i:min(i+batch, len(reqs))])
		if err != nil {
			return nil, err
		}
		batches = append(batches, b)
	}
	prog := progress{batches: batches, samples: []progressSample{{Ns: start.UnixNano()}}}
	for _, b := range batches {
		for !b.Done() {
			prog.sample(time.Now())
			pause(spin)
		}
	}
	end := time.Now()
	prog.last = time.Time{}
	prog.sample(end)
	cost.record(res)
	res.Seconds = end.Sub(start).Seconds()
	res.StartNs, res.EndNs, res.Progress = start.UnixNano(), end.UnixNano(), prog.samples
	defer func() {
		for _, b := range batches {
			_ = b.Release()
		}
	}()
	for _, b := range batches {
		for i := 0; i < b.Len(); i++ {
			if st, _ := b.Status(i); st.State != relay.Completed {
				res.fail(st.Err)
			}
		}
	}
	return res, nil
}

func diffCounters(a, b relay.CounterSnapshot) relay.CounterSnapshot {
	d := relay.CounterSnapshot{
		RelayedBytes: a.RelayedBytes - b.RelayedBytes, RelayedPieces: a.RelayedPieces - b.RelayedPieces,
		FallbackBytes: a.FallbackBytes - b.FallbackBytes, FallbackPieces: a.FallbackPieces - b.FallbackPieces,
		DirectBytes: a.DirectBytes - b.DirectBytes, CreditWaits: a.CreditWaits - b.CreditWaits,
		SecondHopFailures: a.SecondHopFailures - b.SecondHopFailures,
		ForwardedBytes:    a.ForwardedBytes - b.ForwardedBytes, ForwardedPieces: a.ForwardedPieces - b.ForwardedPieces,
		InvalidDescs: a.InvalidDescs - b.InvalidDescs, FailedPieces: a.FailedPieces - b.FailedPieces,
		LaneQuarantines: a.LaneQuarantines - b.LaneQuarantines,
		PumpSleeps:      a.PumpSleeps - b.PumpSleeps, PumpWakes: a.PumpWakes - b.PumpWakes,
		InboundContended: a.InboundContended - b.InboundContended, InboundOutOfTurn: a.InboundOutOfTurn - b.InboundOutOfTurn,
	}
	for r := range d.FallbackBytesByReason {
		d.FallbackBytesByReason[r] = a.FallbackBytesByReason[r] - b.FallbackBytesByReason[r]
		d.FallbackPiecesByReason[r] = a.FallbackPiecesByReason[r] - b.FallbackPiecesByReason[r]
	}
	return d
}

// transferBare moves the same requests through the hop alone: the baseline
// a host gets without the engine.
func transferBare(hop relay.Hop, mine []transfer, base uintptr) (*rankResult, error) {
	reqs, total := requests(mine, base)
	proc0, _ := cpuTime(0)
	start := time.Now()
	res := &rankResult{Bytes: total, Requests: len(reqs)}
	var done [64]relay.HopCompletion
	next, finished := 0, 0
	for finished < len(reqs) {
		for next < len(reqs) {
			r := reqs[next]
			err := hop.Submit([]relay.WriteOp{{Src: r.Src, Len: r.Len, Target: r.Target, Dst: r.Dst, Token: uint64(next)}})
			if errors.Is(err, relay.ErrHopBusy) {
				break
			}
			if err != nil {
				return nil, err
			}
			next++
		}
		n := hop.Poll(done[:])
		for _, c := range done[:n] {
			finished++
			if c.Err != nil {
				res.fail(c.Err)
			}
		}
		if n == 0 {
			pause(false)
		}
	}
	end := time.Now()
	res.Seconds = end.Sub(start).Seconds()
	res.StartNs, res.EndNs = start.UnixNano(), end.UnixNano()
	proc1, _ := cpuTime(0)
	res.ProcessCPU = proc1 - proc0
	res.Counters.DirectBytes = total
	return res, nil
}

func measureIdle(eng *relay.Engine, mine []transfer, base uintptr) *idleResult {
	tid := 0
	if eng != nil {
		tid = eng.PumpThreadID()
	}
	pump0, _ := cpuTime(tid)
	proc0, _ := cpuTime(0)
	runs0 := threadRuns(tid)
	time.Sleep(idleWindow)
	pump1, _ := cpuTime(tid)
	proc1, _ := cpuTime(0)
	res := &idleResult{ProcessPercent: 100 * (proc1 - proc0) / idleWindow.Seconds(), Seconds: idleWindow.Seconds()}
	if tid != 0 {
		res.PumpPercent = 100 * (pump1 - pump0) / idleWindow.Seconds()
		res.PumpRuns = threadRuns(tid) - runs0
	}
	if eng == nil || len(mine) == 0 {
		return res
	}
	req, _ := probeWrite(mine[0], base)
	total, submit, st, err := timedSubmit(eng, []relay.Request{req})
	if err != nil {
		res.FirstError = err.Error()
		return res
	}
	res.FirstSubmitUS, res.FirstWriteUS = micros(submit), micros(total)
	if st.State != relay.Completed && st.Err != nil {
		res.FirstError = st.Err.Error()
	}
	return res
}

// measureIdleDirect times the first write after idle's 10 KiB on a direct
// hop of its own, warmed by one write and then left idle for idleWindow,
// as the engine was before its first write after idle: the part of that
// write's time that is the GPU's and the NIC emulation's, not the
// engine's.
func measureIdleDirect(dev rankDevice, mine []transfer, base uintptr) *idleResult {
	res := &idleResult{}
	if len(mine) == 0 {
		return res
	}
	_, op := probeWrite(mine[0], base)
	us, err := directAfterIdle(dev, op)
	if err != nil {
		res.FirstError = "direct after idle: " + err.Error()
	}
	res.DirectFirstWriteUS = us
	return res
}

func directAfterIdle(dev rankDevice, op relay.WriteOp) (float64, error) {
	hop, closeHop, err := openDirect(dev)
	if err != nil {
		return 0, err
	}
	defer closeHop()
	var comp [4]relay.HopCompletion
	ops := []relay.WriteOp{op}
	write := func(token uint64) (time.Duration, error) {
		ops[0].Token = token
		d, err := timedDirect(hop, ops, comp[:])
		if err != nil {
			return 0, err
		}
		return d, comp[0].Err
	}
	if _, err := write(1); err != nil {
		return 0, err
	}
	time.Sleep(idleWindow)
	d, err := write(2)
	return micros(d), err
}

// probeWrite is the 10 KiB write P4 times (at most the transfer's
// length), to this rank's first target: as a request through the engine
// and as a write on a direct hop.
func probeWrite(t transfer, base uintptr) (relay.Request, relay.WriteOp) {
	n := min(uint64(10<<10), t.Len)
	src, dst := base+uintptr(t.Src), targetBase+t.Dst
	return relay.Request{Op: relay.Write, Src: src, Len: n, Target: t.Remote, Dst: dst},
		relay.WriteOp{Src: src, Len: n, Target: t.Remote, Dst: dst}
}

// timedSubmit submits reqs through eng and polls until the batch is done,
// as a latency-bound caller would. It returns the whole write's time, the
// Submit call's, and the first task's status; the batch is released.
func timedSubmit(eng *relay.Engine, reqs []relay.Request) (total, submit time.Duration, st relay.TaskStatus, err error) {
	t0 := time.Now()
	b, err := eng.Submit(reqs)
	if err != nil {
		return 0, 0, st, err
	}
	submit = time.Since(t0)
	for !b.Done() {
	}
	total = time.Since(t0)
	st, _ = b.Status(0)
	_ = b.Release()
	return total, submit, st, nil
}

// openDirect opens a second hop of the rank's kind for timed direct writes,
// and returns what closes it.
func openDirect(dev rankDevice) (relay.Hop, func(), error) {
	hop, err := dev.newHop()
	if err != nil {
		return nil, nil, err
	}
	closeHop := func() {}
	if c, ok := hop.(interface{ Close() error }); ok {
		closeHop = func() { _ = c.Close() }
	}
	return hop, closeHop, nil
}

// timedDirect submits ops to hop and polls until a completion comes back
// into comp; the error is the submit's, the write's is in comp[0].Err.
func timedDirect(hop relay.Hop, ops []relay.WriteOp, comp []relay.HopCompletion) (time.Duration, error) {
	t0 := time.Now()
	if err := hop.Submit(ops); err != nil {
		return 0, err
	}
	for hop.Poll(comp) == 0 {
	}
	return time.Since(t0), nil
}

// repeat runs a transfer n times back to back and reports them as one: the
// bytes, Pieces and CPU of all, from the first start to the last end.
func repeat(n int, fn func() (*rankResult, error)) (*rankResult, error) {
	var all *rankResult
	for range n {
		r, err := fn()
		if err != nil {
			return nil, err
		}
		if all == nil {
			all = r
			continue
		}
		var off uint64
		if k := len(all.Progress); k > 0 {
			off = all.Progress[k-1].Bytes
		}
		for _, p := range r.Progress {
			all.Progress = append(all.Progress, progressSample{Ns: p.Ns, Bytes: off + p.Bytes})
		}
		all.Bytes += r.Bytes
		all.Requests += r.Requests
		all.Failed += r.Failed
		if all.FirstError == "" {
			all.FirstError = r.FirstError
		}
		c, a := r.Counters, &all.Counters
		a.RelayedBytes += c.RelayedBytes
		a.RelayedPieces += c.RelayedPieces
		a.FallbackBytes += c.FallbackBytes
		a.FallbackPieces += c.FallbackPieces
		a.DirectBytes += c.DirectBytes
		a.ForwardedBytes += c.ForwardedBytes
		a.ForwardedPieces += c.ForwardedPieces
		a.FailedPieces += c.FailedPieces
		all.PumpCPU += r.PumpCPU
		all.ProcessCPU += r.ProcessCPU
		all.Mallocs += r.Mallocs
		all.EndNs = r.EndNs
		all.CompletionsUS = append(all.CompletionsUS, r.CompletionsUS...)
		all.SubmitUS = append(all.SubmitUS, r.SubmitUS...)
		all.Seconds = float64(all.EndNs-all.StartNs) / 1e9
	}
	return all, nil
}

// measureLatency times n 10 KiB writes through the engine (to this rank's
// first target: a cross-rail write goes through its relay) and n through a
// second hop of its own (the direct hop, no engine), alternating. Each
// waits for its completion by polling, as a latency-bound caller would.
func measureLatency(eng *relay.Engine, dev rankDevice, mine []transfer, base uintptr, n int) (*latencyResult, error) {
	res := &latencyResult{}
	if eng == nil || len(mine) == 0 || n <= 0 {
		return res, nil
	}
	r, w := probeWrite(mine[0], base)
	req, op := []relay.Request{r}, []relay.WriteOp{w}
	direct, closeDirect, err := openDirect(dev)
	if err != nil {
		return nil, err
	}
	defer closeDirect()
	var comp [4]relay.HopCompletion
	warm := max(n/10, 10)
	pxn := make([]float64, 0, n)
	dir := make([]float64, 0, n)
	before := eng.Counters()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gc0 := ms.NumGC
	for i := 0; i < warm+n; i++ {
		d0, _, st, err := timedSubmit(eng, req)
		if err != nil {
			return nil, err
		}
		if st.State != relay.Completed {
			res.Failed++
			if res.FirstError == "" && st.Err != nil {
				res.FirstError = st.Err.Error()
			}
		}
		op[0].Token = uint64(i)
		d1, err := timedDirect(direct, op, comp[:])
		if err != nil {
			return nil, err
		}
		if comp[0].Err != nil {
			res.Failed++
			if res.FirstError == "" {
				res.FirstError = comp[0].Err.Error()
			}
		}
		if i >= warm {
			pxn = append(pxn, float64(d0.Nanoseconds())/1e3)
			dir = append(dir, float64(d1.Nanoseconds())/1e3)
		}
	}
	runtime.ReadMemStats(&ms)
	res.GCs = ms.NumGC - gc0
	res.N = n
	res.Relayed = eng.Counters().RelayedPieces - before.RelayedPieces
	res.PXN, res.Direct = percentiles(pxn), percentiles(dir)
	return res, nil
}

// percentiles returns p50, p99, the mean, p90, p99.9 and the max of xs.
func percentiles(xs []float64) [6]float64 {
	if len(xs) == 0 {
		return [6]float64{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	at := func(q float64) float64 { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return [6]float64{at(0.50), at(0.99), sum / float64(len(s)), at(0.90), at(0.999), s[len(s)-1]}
}
