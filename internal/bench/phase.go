// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/relay"
)

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
	// forwardedBytes are the bytes of the Pieces it forwarded.
	forwardedBytes uint64
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
	firsts     []idleResult
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
		if err := dev.procs.add(c); err != nil {
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
		if err := dev.procs.add(c); err != nil {
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
			forwardedBytes: a.Counters.ForwardedBytes - b.Counters.ForwardedBytes,
			contended:      a.Counters.InboundContended - b.Counters.InboundContended, outOfTurn: a.Counters.InboundOutOfTurn - b.Counters.InboundOutOfTurn})
	}
	engine := mode == "engine"
	// what, when not empty, is the step's progress line.
	steps := []struct {
		on      bool
		cmd     string
		what    string
		timeout time.Duration
		// inTurn sends the step to one rank at a time, each after the
		// one before answered.
		inTurn    bool
		collected func(event)
	}{
		{engine && s.kv != nil && s.kv.Inflight == 1, "times", "", time.Minute, false, func(ev event) { res.kvTimes = append(res.kvTimes, ev.Times) }},
		{engine && s.again, "again", "the same transfer again, counting heap allocations (--alloc-pass)", 30 * time.Minute, false, func(ev event) { res.again = append(res.again, *ev.Result) }},
		{engine && s.raw, "raw", "a raw copy-engine copy of the same traffic (--raw)", 10 * time.Minute, false, func(ev event) { res.raws = append(res.raws, *ev.Raw) }},
		{engine && s.latency > 0, "latency", fmt.Sprintf("%d 10KiB writes through PXN and direct (--latency)", s.latency), 10 * time.Minute, false, func(ev event) { res.lats = append(res.lats, *ev.Latency) }},
		{engine && s.latency > 0, "times", "", time.Minute, false, func(ev event) { res.latTimes = append(res.latTimes, ev.Times) }},
		{engine && s.idle, "idle", fmt.Sprintf("the ranks stay idle for %v (the pumps' CPU while idle)", idleWindow), time.Minute, false, func(ev event) { res.idle = append(res.idle, *ev.Idle) }},
		// The writes after idle go one rank at a time, so that no rank's
		// time is another's on the machine's cores: the first through
		// PXN, then the same write on a direct hop that waited as long
		// (the device's and the NIC emulation's share of it).
		{engine && s.idle, "first", "each rank in turn times its first write after it, through PXN", time.Minute, true, func(ev event) { res.firsts = append(res.firsts, *ev.Idle) }},
		{engine && s.idle, "times", "", time.Minute, false, func(ev event) { res.idleTimes = append(res.idleTimes, ev.Times) }},
		{engine && s.idle, "first-direct", "and then the same write direct", time.Minute, true, func(ev event) { res.idleDirect = append(res.idleDirect, *ev.Idle) }},
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
		var evs []event
		if st.inTurn {
			evs, err = inTurn(ranks, st.cmd, st.timeout)
		} else {
			evs, err = all(ranks, st.cmd, want, st.timeout)
		}
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			st.collected(ev)
		}
	}
	if engine && s.hold > 0 {
		fmt.Fprintf(os.Stderr, "pxn-bench: the ranks stay registered for %v (--hold-after)\n", s.hold)
		select {
		case <-time.After(s.hold):
		case <-dev.procs.done:
		}
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
