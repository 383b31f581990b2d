// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"sort"
)

// windowTrim is the part of the backlogged window left out at each end:
// the senders start and their first tickets reach the relay a little
// apart, and the first to finish slows down as its queue runs dry.
const windowTrim = 0.1

// minWindow is the shortest window a share is measured over; a shorter one
// falls back to each sender's whole transfer.
const minWindowNs = int64(50e6)

// senderShare is one sender's rate into a shared relay.
type senderShare struct {
	rank int
	// gbps is the rate over the window every sender was backlogged in;
	// whole is the rate over its own transfer.
	gbps, whole float64
	bytes       uint64
}

// bytesAt is the rank's completed bytes at ns: its last sample at or
// before ns.
func bytesAt(samples []progressSample, ns int64) uint64 {
	i := sort.Search(len(samples), func(i int) bool { return samples[i].Ns > ns })
	if i == 0 {
		return 0
	}
	return samples[i-1].Bytes
}

// shares measures each sender's rate over the window in which every one of
// them still had Pieces to send: from the last sender's start to the first
// sender's end, trimmed by windowTrim at both ends. ok is false when the
// window is too short or a sender reported no progress; the rates are then
// over each sender's whole transfer.
func shares(senders []rankResult) (out []senderShare, windowNs int64, ok bool) {
	var from, to int64
	for i, r := range senders {
		if i == 0 || r.StartNs > from {
			from = r.StartNs
		}
		if i == 0 || r.EndNs < to {
			to = r.EndNs
		}
	}
	trim := int64(float64(to-from) * windowTrim)
	from, to = from+trim, to-trim
	ok = to-from >= minWindowNs
	for _, r := range senders {
		s := senderShare{rank: r.Rank}
		if d := r.EndNs - r.StartNs; d > 0 {
			s.whole = float64(r.Bytes) / float64(d)
		}
		if len(r.Progress) < 2 {
			ok = false
		}
		if ok {
			s.bytes = bytesAt(r.Progress, to) - bytesAt(r.Progress, from)
			s.gbps = float64(s.bytes) / float64(to-from)
		}
		out = append(out, s)
	}
	if !ok {
		for i := range out {
			out[i].gbps, out[i].bytes = out[i].whole, 0
		}
		return out, 0, false
	}
	return out, to - from, true
}

// minOverMean is the slowest share over the mean of all.
func minOverMean(ss []senderShare) float64 {
	if len(ss) == 0 {
		return 0
	}
	least, sum := ss[0].gbps, 0.0
	for _, s := range ss {
		least = min(least, s.gbps)
		sum += s.gbps
	}
	if sum == 0 {
		return 0
	}
	return least / (sum / float64(len(ss)))
}

// fairRows are a fan-in's rows per sender, the ratio of the slowest to the
// mean (P12), and the relay's turn counters: how many Pieces it took while
// another lane had a ticket ready, and how many of those out of turn.
// Every rank but the relay (rank 0) is a sender; busy holds each rank's
// counters over the measured phase, the relay's first.
func fairRows(prefix, pattern string, ranks []rankResult, busy []busyWindow, verified bool) []Row {
	if pattern != "fan-in" {
		return nil
	}
	var senders []rankResult
	for _, r := range ranks {
		if r.Rank != 0 && r.Bytes > 0 {
			senders = append(senders, r)
		}
	}
	var turns []Row
	if len(busy) > 0 {
		b := busy[0]
		turns = []Row{
			{Scenario: prefix + "fan-in relay: Pieces taken while another lane had a ticket ready", Value: float64(b.contended), Unit: "Pieces", Verified: verified,
				Note: fmt.Sprintf("%d of the %d Pieces the relay forwarded", b.contended, b.forwarded)},
			{Scenario: prefix + "fan-in relay: Pieces taken out of turn", Value: float64(b.outOfTurn), Unit: "Pieces", Verified: verified,
				Note: "taken from a lane already served since another lane's ticket became ready, while that ticket still waited; 0 when lanes are served in turn"},
		}
	}
	if len(senders) < 2 {
		return nil
	}
	ss, window, ok := shares(senders)
	over := fmt.Sprintf("over the %.0f ms every sender was backlogged (the middle %.0f %% of it)", float64(window)/1e6, 100*(1-2*windowTrim))
	if !ok {
		over = "over each sender's whole transfer (too short, or no progress reported, for a window)"
	}
	var rows []Row
	for _, s := range ss {
		rows = append(rows, Row{Scenario: fmt.Sprintf("%sfan-in sender rank %d", prefix, s.rank), Bytes: s.bytes, GBps: s.gbps, Verified: verified,
			Note: fmt.Sprintf("%.3g GB/s %s; %.3g GB/s over its whole transfer", s.gbps, over, s.whole)})
	}
	rows = append(rows, Row{Scenario: prefix + "P12 fan-in fairness: slowest sender over the mean", Value: minOverMean(ss), Unit: "min/mean",
		Verified: verified, Note: fmt.Sprintf("%d senders, rates %s", len(ss), over)})
	return append(rows, turns...)
}
