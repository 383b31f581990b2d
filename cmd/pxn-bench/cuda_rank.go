package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/internal/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/sim/fabric"
	"github.com/pxn-project/pxn/pkg/sim/gpunic"
	"github.com/pxn-project/pxn/pkg/staging"
)

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

type cudaRankOptions struct {
	index     int
	gpu       int
	layout    string
	directory string
	nic       string
	mode      string
	rate      float64
	registry  string
	latency   int
	reps      int
	gatherPTX string
}

func cudaRankMain(args []string) int {
	fs := flag.NewFlagSet("cuda-rank", flag.ContinueOnError)
	var o cudaRankOptions
	fs.IntVar(&o.index, "index", 0, "rank index (its HCA and rail)")
	fs.IntVar(&o.gpu, "gpu", 0, "GPU ordinal")
	fs.StringVar(&o.layout, "layout", "", "layout file")
	fs.StringVar(&o.directory, "directory", "", "directory file")
	fs.StringVar(&o.nic, "nic", "", "the emulated NIC's targets")
	fs.StringVar(&o.mode, "mode", "engine", "engine or bare (the hop alone)")
	fs.Float64Var(&o.rate, "rate", 0, "emulated NIC rate cap, GB/s (0: none)")
	fs.StringVar(&o.registry, "registry", "", "the registry root (counted for P6)")
	fs.IntVar(&o.latency, "latency", 0, "10 KiB writes to time each way")
	fs.IntVar(&o.reps, "reps", 1, "times the timed transfer (and the raw copy) is repeated back to back")
	fs.StringVar(&o.gatherPTX, "gather-ptx", "", "gather kernel PTX file (default: embedded)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := runCUDARank(o); err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	return 0
}

func runCUDARank(o cudaRankOptions) (err error) {
	// The main goroutine keeps one OS thread with the GPU's context
	// current for set-up calls; the engine's own calls manage theirs.
	runtime.LockOSThread()
	l, err := readLayout(o.layout)
	if err != nil {
		return err
	}
	f, err := os.Open(o.directory)
	if err != nil {
		return err
	}
	dir, err := fabric.LoadStaticDirectory(f)
	f.Close()
	if err != nil {
		return err
	}
	targets, err := readNICTargets(o.nic)
	if err != nil {
		return err
	}
	var ptx []byte
	if o.gatherPTX != "" {
		if ptx, err = os.ReadFile(o.gatherPTX); err != nil {
			return err
		}
	}
	d, err := cuda.Load()
	if err != nil {
		return err
	}
	g, err := gpu.Open(d, o.gpu)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	if err := d.CtxSetCurrent(g.Context()); err != nil {
		return err
	}
	n := max(l.sourceBytes(o.index), 1<<20)
	src, err := d.MemAlloc(n)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.MemFree(src)) }()
	if err := fillDevice(d, src, n, rankSeed(o.index)); err != nil {
		return err
	}
	maps, err := gpunic.OpenTargets(g, targets)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, maps.Close()) }()
	nic, err := gpunic.New(g, maps, gpunic.Options{RateGBps: o.rate})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, nic.Close()) }()
	emit(event{Event: "ready", Pid: os.Getpid()})

	base := uintptr(src)
	mine := l.ofRank(o.index)
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
			res, e, err := openEngine(d, g, nic, dir, o, ptx)
			if err != nil {
				return err
			}
			eng = e
			emit(event{Event: "opened", Open: res})
		case "route":
			emit(event{Event: "routed", Routed: waitRoutes(eng, mine, o.index)})
		case "warm", "go":
			reps := 1
			if cmd == "go" {
				reps = max(o.reps, 1)
			}
			res, err := repeat(reps, func() (*rankResult, error) {
				if o.mode == "engine" && eng != nil {
					return transferEngineWait(eng, mine, base, true)
				}
				return transferBare(nic, mine, base)
			})
			if err != nil {
				return err
			}
			res.Rank = o.index
			name := "done"
			if cmd == "warm" {
				name = "warmed"
			}
			emit(event{Event: name, Result: res})
		case "stats":
			res := &rankResult{Rank: o.index}
			if eng != nil {
				res.PumpCPU, _ = cpuTime(eng.PumpThreadID())
				res.Counters = eng.Counters()
			}
			emit(event{Event: "stats", Result: res})
		case "raw":
			res, err := rawCopy(d, maps, mine, base, max(o.reps, 1))
			if err != nil {
				return err
			}
			emit(event{Event: "raw", Raw: res})
		case "latency":
			res, err := measureLatency(eng, g, maps, mine, base, o.latency)
			if err != nil {
				return err
			}
			emit(event{Event: "latency", Latency: res})
		case "idle":
			emit(event{Event: "idle", Idle: measureIdle(eng)})
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

func readNICTargets(path string) ([]gpunic.Target, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list []nicTargetJSON
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []gpunic.Target
	for _, t := range list {
		h, err := decodeHandle(t.Handle)
		if err != nil {
			return nil, fmt.Errorf("%s: target %q: %w", path, t.Session, err)
		}
		out = append(out, gpunic.Target{Session: t.Session, Addr: t.Addr, Len: t.Len, Handle: h})
	}
	return out, nil
}

// fillDevice writes the pattern of seed into n bytes at p, through a host
// buffer filled in parallel.
func fillDevice(d *cuda.Driver, p cuda.DevicePtr, n, seed uint64) error {
	const chunk = 256 << 20
	buf := make([]byte, min(n, chunk))
	for off := uint64(0); off < n; off += chunk {
		b := buf[:min(chunk, n-off)]
		parallel(uint64(len(b)), 8<<20, func(a, e uint64) error {
			fillPattern(b[a:e], seed, off+a)
			return nil
		})
		if err := d.MemcpyHtoD(p+cuda.DevicePtr(off), b); err != nil {
			return err
		}
	}
	return nil
}

// parallel runs fn over [0, n) in pieces of step bytes on every CPU and
// returns the first error.
func parallel(n, step uint64, fn func(a, e uint64) error) error {
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for a := uint64(0); a < n; a += step {
		e := min(a+step, n)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(a, e); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// openEngine opens the engine the way a host process would: the GPU copier
// and arenas exist only when MC_PXN_ENABLE says PXN is on. It reports what
// the open cost (P6).
func openEngine(d *cuda.Driver, g *gpu.GPU, nic *gpunic.NIC, dir relay.Directory, o cudaRankOptions, ptx []byte) (*openResult, *relay.Engine, error) {
	// The main goroutine holds its thread: the first time it sleeps, the
	// runtime starts another thread for the rest. Let that happen before
	// counting, so the count is the open's alone.
	time.Sleep(200 * time.Millisecond)
	free0, _, err := d.MemGetInfo()
	if err != nil {
		return nil, nil, err
	}
	th0, gr0, sh0 := threadCount(), runtime.NumGoroutine(), countEntries(o.registry)
	log := klog.Background()
	warn := func(err error) { log.Info("pxn-bench: configuration", "err", err.Error()) }
	deps := relay.HostDeps{Hop: nic, Directory: dir, LocalHCA: rankHCA(o.index)}
	var copier *gpu.Copier
	if staging.Load(nil, warn).Enable {
		copier, err = gpu.NewCopier(g, gpu.CopierOptions{Gather: gpu.GatherModeFromEnv(nil, warn), GatherPTX: ptx})
		if err != nil {
			return nil, nil, err
		}
		deps.Copier, deps.Arenas = copier, gpu.NewArenas(g)
	}
	eng, err := relay.OpenFromEnv(context.Background(), nil, deps)
	if err != nil {
		return nil, nil, err
	}
	// Whatever the open starts (the pump, its registration) settles.
	time.Sleep(200 * time.Millisecond)
	free1, _, err := d.MemGetInfo()
	if err != nil {
		return nil, eng, err
	}
	res := &openResult{DeviceBytes: int64(free0) - int64(free1), Threads: threadCount() - th0,
		Goroutines: runtime.NumGoroutine() - gr0, ShmEntries: countEntries(o.registry) - sh0, PXN: eng.PXNActive()}
	if copier != nil {
		gi := copier.Gather()
		res.Copier = fmt.Sprintf("copy %v, doorbell %s, gather %v (%d×%d, threshold %s): %s", copier.CopyMode(), copier.Doorbell(),
			gi.Mode, gi.Grid, gi.Block, sizeString(gi.Threshold), gi.Reason)
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
		all.Seconds = float64(all.EndNs-all.StartNs) / 1e9
	}
	return all, nil
}

// rawCopy copies a rank's traffic with one cuMemcpyAsync per request on one
// stream into the targets' buffers, once to warm up and reps times timed:
// the copy engine's own rate for the same bytes.
func rawCopy(d *cuda.Driver, maps *gpunic.Targets, mine []transfer, base uintptr, reps int) (*rawResult, error) {
	reqs, total := requests(mine, base)
	if len(reqs) == 0 {
		return &rawResult{}, nil
	}
	type cp struct {
		dst cuda.DevicePtr
		req relay.Request
	}
	cps := make([]cp, len(reqs))
	for i, r := range reqs {
		dst, err := maps.Translate(r.Target, r.Dst, r.Len)
		if err != nil {
			return nil, err
		}
		cps[i] = cp{dst: dst, req: r}
	}
	st, err := d.StreamCreate(cuda.StreamNonBlocking)
	if err != nil {
		return nil, err
	}
	defer d.StreamDestroy(st)
	once := func(reps int) (time.Duration, error) {
		start := time.Now()
		for range reps {
			for _, c := range cps {
				if err := d.MemcpyAsync(c.dst, cuda.DevicePtr(c.req.Src), c.req.Len, st); err != nil {
					return 0, err
				}
			}
		}
		if err := d.StreamSynchronize(st); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	if _, err := once(1); err != nil {
		return nil, err
	}
	t, err := once(reps)
	if err != nil {
		return nil, err
	}
	return &rawResult{Bytes: total * uint64(reps), Seconds: t.Seconds()}, nil
}

// measureLatency times n 10 KiB writes through the engine (to this rank's
// first target: a cross-rail write goes through its relay) and n through a
// second emulated NIC of its own (the direct hop, no engine), alternating.
// Each waits for its completion by polling, as a latency-bound caller would.
func measureLatency(eng *relay.Engine, g *gpu.GPU, maps *gpunic.Targets, mine []transfer, base uintptr, n int) (*latencyResult, error) {
	res := &latencyResult{}
	if eng == nil || len(mine) == 0 || n <= 0 {
		return res, nil
	}
	t := mine[0]
	size := min(uint64(10<<10), t.Len)
	req := []relay.Request{{Op: relay.Write, Src: base + uintptr(t.Src), Len: size, Target: t.Remote, Dst: targetBase + t.Dst}}
	direct, err := gpunic.New(g, maps, gpunic.Options{})
	if err != nil {
		return nil, err
	}
	defer direct.Close()
	op := []relay.WriteOp{{Src: base + uintptr(t.Src), Len: size, Target: t.Remote, Dst: targetBase + t.Dst}}
	var comp [4]relay.HopCompletion
	warm := max(n/10, 10)
	pxn := make([]float64, 0, n)
	dir := make([]float64, 0, n)
	before := eng.Counters()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gc0 := ms.NumGC
	for i := 0; i < warm+n; i++ {
		t0 := time.Now()
		b, err := eng.Submit(req)
		if err != nil {
			return nil, err
		}
		for !b.Done() {
		}
		d0 := time.Since(t0)
		if st, _ := b.Status(0); st.State != relay.Completed {
			res.Failed++
			if res.FirstError == "" && st.Err != nil {
				res.FirstError = st.Err.Error()
			}
		}
		op[0].Token = uint64(i)
		t1 := time.Now()
		if err := direct.Submit(op); err != nil {
			return nil, err
		}
		for direct.Poll(comp[:]) == 0 {
		}
		d1 := time.Since(t1)
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
