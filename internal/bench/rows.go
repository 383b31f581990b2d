// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
)

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
	case bareRow != nil && (s.kv != nil || s.rate > 0):
		main.Baseline, main.BaselineGBps, main.BoundGBps = wireBaseline(s, l, dev.hop, bareRow.GBps)
		if main.BoundGBps > 0 && bareRow.Verified && bareRow.Failed == 0 {
			main.DirectOfBound = bareRow.GBps / main.BoundGBps
		}
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
	if main.DirectOfBound > 0 && main.DirectOfBound < emulationShort {
		main.Note = strings.TrimPrefix(main.Note+fmt.Sprintf("; direct reached %.3f of what its NICs give at R (%.4g GB/s), below %.2f: the ratio measures the direct stand-in (the NIC emulation as the baseline posts to it), not the engine",
			main.DirectOfBound, main.BoundGBps, emulationShort), "; ")
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
	main.Problems = append([]string{}, phaseProblems(l, pxn)...)
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
	bytes, pieces := fallbackByReason(ranks)
	var parts []string
	for i := range bytes {
		if pieces[i] > 0 {
			parts = append(parts, fmt.Sprintf("%s %s in %d Pieces", staging.FallbackReasonName(i), sizeString(bytes[i]), pieces[i]))
		}
	}
	return strings.Join(parts, ", ")
}

// fallbackByReason sums the ranks' fallback bytes and Pieces by reason.
func fallbackByReason(ranks []rankResult) (bytes, pieces staging.FallbackCounts) {
	for _, rr := range ranks {
		for i := range bytes {
			bytes[i] += rr.Counters.FallbackBytesByReason[i]
			pieces[i] += rr.Counters.FallbackPiecesByReason[i]
		}
	}
	return bytes, pieces
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
		}
		for _, i := range p.firsts {
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
				r.Note = strings.TrimPrefix(r.Note+fmt.Sprintf("; %.2f × the steady-state p50 of the same write (%.1f µs)", first/steady, steady), "; ")
			}
			r.Note = strings.TrimPrefix(r.Note+fmt.Sprintf("; one write per sender, each timed while the other ranks were idle, the slowest; its Submit call %.1f µs", firstSubmit), "; ")
			if direct > 0 {
				r.Note += fmt.Sprintf("; %+.1f µs over the slowest direct write after as long an idle (%.1f µs)", first-direct, direct)
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
