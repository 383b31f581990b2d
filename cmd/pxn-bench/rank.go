package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/hosthop"
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
	ProcessCPU float64               `json:"processCPU"`
	Mallocs    uint64                `json:"mallocs"`
	PXNActive  bool                  `json:"pxnActive"`
	// StartNs and EndNs bound the timed transfer (Unix nanoseconds) where
	// the parent times ranks that ran at once as one transfer.
	StartNs int64 `json:"startNs,omitempty"`
	EndNs   int64 `json:"endNs,omitempty"`
}

// idleResult is CPU use over an idle second.
type idleResult struct {
	PumpPercent    float64 `json:"pumpPercent"`
	ProcessPercent float64 `json:"processPercent"`
}

func rankMain(args []string) int {
	fs := flag.NewFlagSet("rank", flag.ContinueOnError)
	index := fs.Int("index", 0, "rank index (its GPU and HCA)")
	layoutPath := fs.String("layout", "", "layout file")
	dirPath := fs.String("directory", "", "directory file")
	mode := fs.String("mode", "engine", "engine (through the PXN engine) or bare (the hop alone)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := runRank(*index, *layoutPath, *dirPath, *mode); err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	return 0
}

func runRank(r int, layoutPath, dirPath, mode string) error {
	l, err := readLayout(layoutPath)
	if err != nil {
		return err
	}
	f, err := os.Open(dirPath)
	if err != nil {
		return err
	}
	dir, err := fabric.LoadStaticDirectory(f)
	f.Close()
	if err != nil {
		return err
	}
	src, err := mapBuffer(l.sourceBytes(r))
	if err != nil {
		return err
	}
	fillPatternFast(src, rankSeed(r))
	base := uintptr(unsafe.Pointer(&src[0]))
	hop := fabric.NewTCPHop(fabric.TCPHopOptions{Targets: dir.Addresses()})
	defer hop.Close()

	var eng *relay.Engine
	if mode == "engine" {
		copier := hosthop.NewHostCopier(hosthop.HostCopierOptions{})
		if err := copier.RegisterDevice(base, uint64(len(src))); err != nil {
			return err
		}
		eng, err = relay.OpenFromEnv(context.Background(), nil, relay.HostDeps{Hop: hop, Directory: dir, Copier: copier, LocalHCA: rankHCA(r)})
		if err != nil {
			return err
		}
	}
	emit(event{Event: "ready", Pid: os.Getpid()})

	mine := l.ofRank(r)
	cmds := commands()
	for cmd := range cmds {
		switch cmd {
		case "route":
			emit(event{Event: "routed", Routed: waitRoutes(eng, mine, r)})
		case "go", "again":
			var res *rankResult
			if eng != nil {
				res, err = transferEngine(eng, mine, base)
			} else {
				res, err = transferBare(hop, mine, base)
			}
			if err != nil {
				return err
			}
			res.Rank = r
			emit(event{Event: "done", Result: res})
		case "idle":
			emit(event{Event: "idle", Idle: measureIdle(eng)})
		case "exit":
			if eng != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := eng.Close(ctx)
				cancel()
				if err != nil {
					return fmt.Errorf("close: %w", err)
				}
			}
			emit(event{Event: "closed"})
			return nil
		}
	}
	return errors.New("parent went away")
}

// waitRoutes waits until every cross-rail target of this rank has a relay.
func waitRoutes(eng *relay.Engine, mine []transfer, r int) bool {
	if eng == nil || !eng.PXNActive() {
		return false
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		ok := true
		for _, t := range mine {
			if t.Target != r && !eng.HasRelay(railName(t.Target)) {
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

// spinBatch is how many requests the CUDA path submits at a time.
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

func transferEngine(eng *relay.Engine, mine []transfer, base uintptr) (*rankResult, error) {
	return transferEngineWait(eng, mine, base, false)
}

// transferEngineWait is transferEngine; spin submits the requests in
// batches of spinBatch, so that planning the later ones overlaps the
// transfer of the first (a pipelined caller), and polls Done without
// sleeping (the CUDA path, where a sleep is a visible part of a short run).
func transferEngineWait(eng *relay.Engine, mine []transfer, base uintptr, spin bool) (*rankResult, error) {
	reqs, total := requests(mine, base)
	batch := len(reqs)
	if spin {
		batch = min(batch, spinBatch)
	}
	before := eng.Counters()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	pump0, _ := cpuTime(eng.PumpThreadID())
	proc0, _ := cpuTime(0)
	start := time.Now()
	var batches []*relay.Batch
	for i := 0; i < len(reqs) || i == 0; i += max(batch, 1) {
		b, err := eng.Submit(reqs[i:min(i+batch, len(reqs))])
		if err != nil {
			return nil, err
		}
		batches = append(batches, b)
	}
	for _, b := range batches {
		for !b.Done() {
			if spin {
				runtime.Gosched()
				continue
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	end := time.Now()
	secs := end.Sub(start).Seconds()
	pump1, _ := cpuTime(eng.PumpThreadID())
	proc1, _ := cpuTime(0)
	runtime.ReadMemStats(&ms1)
	res := &rankResult{Bytes: total, Requests: len(reqs), Seconds: secs, PXNActive: eng.PXNActive(),
		PumpCPU: pump1 - pump0, ProcessCPU: proc1 - proc0, Mallocs: ms1.Mallocs - ms0.Mallocs,
		StartNs: start.UnixNano(), EndNs: end.UnixNano()}
	defer func() {
		for _, b := range batches {
			_ = b.Release()
		}
	}()
	for _, b := range batches {
		for i := 0; i < b.Len(); i++ {
			st, _ := b.Status(i)
			if st.State != relay.Completed {
				res.Failed++
				if res.FirstError == "" && st.Err != nil {
					res.FirstError = st.Err.Error()
				}
			}
		}
	}
	res.Counters = diffCounters(eng.Counters(), before)
	return res, nil
}

func diffCounters(a, b relay.CounterSnapshot) relay.CounterSnapshot {
	return relay.CounterSnapshot{
		RelayedBytes: a.RelayedBytes - b.RelayedBytes, RelayedPieces: a.RelayedPieces - b.RelayedPieces,
		FallbackBytes: a.FallbackBytes - b.FallbackBytes, FallbackPieces: a.FallbackPieces - b.FallbackPieces,
		DirectBytes: a.DirectBytes - b.DirectBytes, CreditWaits: a.CreditWaits - b.CreditWaits,
		SecondHopFailures: a.SecondHopFailures - b.SecondHopFailures,
		ForwardedBytes:    a.ForwardedBytes - b.ForwardedBytes, ForwardedPieces: a.ForwardedPieces - b.ForwardedPieces,
		InvalidDescs: a.InvalidDescs - b.InvalidDescs, FailedPieces: a.FailedPieces - b.FailedPieces,
		LaneQuarantines: a.LaneQuarantines - b.LaneQuarantines,
	}
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
				res.Failed++
				if res.FirstError == "" {
					res.FirstError = c.Err.Error()
				}
			}
		}
		if n == 0 {
			time.Sleep(20 * time.Microsecond)
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

func measureIdle(eng *relay.Engine) *idleResult {
	const window = time.Second
	tid := 0
	if eng != nil {
		tid = eng.PumpThreadID()
	}
	pump0, _ := cpuTime(tid)
	proc0, _ := cpuTime(0)
	time.Sleep(window)
	pump1, _ := cpuTime(tid)
	proc1, _ := cpuTime(0)
	res := &idleResult{ProcessPercent: 100 * (proc1 - proc0) / window.Seconds()}
	if tid != 0 {
		res.PumpPercent = 100 * (pump1 - pump0) / window.Seconds()
	}
	return res
}
