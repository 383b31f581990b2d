// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"runtime"
	"slices"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
)

// idleProbe is a rank's direct hop for the direct write after idle:
// opened and warmed by one write before the idle window, so that its write
// after the window has waited as long as the engine's first one.
type idleProbe struct {
	hop      relay.Hop
	closeHop func()
	op       relay.WriteOp
	err      error
}

// measureIdle leaves the rank idle for idleWindow and reports its pump's
// and its process's CPU over the window. Before the window it warms the
// direct hop that the direct write after idle will use (nil for a rank
// without transfers of its own). The writes after idle are timed later,
// one rank at a time (firstWrite, idleProbe.write): several ranks writing
// at once on a machine of few cores would measure each other.
func measureIdle(eng *relay.Engine, dev rankDevice, mine []transfer, base uintptr) (*idleResult, *idleProbe) {
	var probe *idleProbe
	if len(mine) > 0 {
		probe = warmProbe(dev, mine[0], base)
	}
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
	return res, probe
}

// firstWrite times the rank's first 10 KiB write through the engine after
// its idle window (an empty result for a rank without transfers).
func firstWrite(eng *relay.Engine, mine []transfer, base uintptr) *idleResult {
	res := &idleResult{}
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

// warmProbe opens a direct hop of the rank's kind and writes the probe's
// bytes through it once.
func warmProbe(dev rankDevice, t transfer, base uintptr) *idleProbe {
	_, op := probeWrite(t, base)
	p := &idleProbe{op: op}
	if p.hop, p.closeHop, p.err = openDirect(dev); p.err != nil {
		p.closeHop = func() {}
		return p
	}
	_, p.err = p.timed(1)
	return p
}

// write times the probe's write after the idle window and closes its hop:
// the part of a write after idle that is the device's and the NIC
// emulation's, not the engine's.
func (p *idleProbe) write() *idleResult {
	res := &idleResult{}
	if p == nil {
		return res
	}
	defer p.closeHop()
	if p.err == nil {
		var d time.Duration
		d, p.err = p.timed(2)
		res.DirectFirstWriteUS = micros(d)
	}
	if p.err != nil {
		res.FirstError = "direct after idle: " + p.err.Error()
	}
	return res
}

func (p *idleProbe) timed(token uint64) (time.Duration, error) {
	var comp [4]relay.HopCompletion
	p.op.Token = token
	d, err := timedDirect(p.hop, []relay.WriteOp{p.op}, comp[:])
	if err != nil {
		return 0, err
	}
	return d, comp[0].Err
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
