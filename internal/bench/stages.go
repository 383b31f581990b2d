// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"slices"

	"github.com/pxn-project/pxn/pkg/relay"
)

// A relayed Piece's way, step by step: the gaps between the times the
// sender and the relay recorded (relay.PieceTimes), matched by lane and
// seq. They take a latency figure apart (P4, P10, the first write after
// idle) into the engine's steps.
var pieceSteps = []struct {
	name     string
	from, to func(s, r relay.PieceTimes) int64
}{
	{"Submit to the first hop's launch (Submit's planning, the sender's pump turn)",
		func(s, _ relay.PieceTimes) int64 { return s.Submit }, func(s, _ relay.PieceTimes) int64 { return s.Copy }},
	{"first hop: launch, copy and doorbell, until the relay saw it",
		func(s, _ relay.PieceTimes) int64 { return s.Copy }, func(_, r relay.PieceTimes) int64 { return r.Seen }},
	{"relay: Desc to the second hop handed to the NIC",
		func(_, r relay.PieceTimes) int64 { return r.Seen }, func(_, r relay.PieceTimes) int64 { return r.Posted }},
	{"second hop: the NIC's write, until the relay saw it done",
		func(_, r relay.PieceTimes) int64 { return r.Posted }, func(_, r relay.PieceTimes) int64 { return r.Done }},
	{"completion back to the sender's pump",
		func(_, r relay.PieceTimes) int64 { return r.Done }, func(s, _ relay.PieceTimes) int64 { return s.Reaped }},
}

// joinTimes pairs every sender record with the relay's record of the same
// Piece. It needs lane and seq to name one Piece: true when one rank
// relays (fan-in), so it returns nil when several do.
func joinTimes(ranks [][]relay.PieceTimes) [][2]relay.PieceTimes {
	type key struct {
		lane int
		seq  uint64
	}
	relayed := map[key]relay.PieceTimes{}
	relays := 0
	for _, ts := range ranks {
		n := 0
		for _, t := range ts {
			if t.Seen != 0 {
				relayed[key{t.Lane, t.Seq}] = t
				n++
			}
		}
		if n > 0 {
			relays++
		}
	}
	if relays != 1 {
		return nil
	}
	var out [][2]relay.PieceTimes
	for _, ts := range ranks {
		for _, t := range ts {
			if t.Submit == 0 || t.Reaped == 0 {
				continue
			}
			if r, ok := relayed[key{t.Lane, t.Seq}]; ok && r.Done != 0 {
				out = append(out, [2]relay.PieceTimes{t, r})
			}
		}
	}
	slices.SortFunc(out, func(a, b [2]relay.PieceTimes) int { return int(a[0].Submit - b[0].Submit) })
	return out
}

// stepRows are one row a step of pieceSteps: the median gap over the
// Pieces (last only: the latest Piece alone, as for the first write after
// idle), and the whole way from Submit to the sender's reap.
func stepRows(prefix, what string, pieces [][2]relay.PieceTimes, last bool) []Row {
	if len(pieces) == 0 {
		return nil
	}
	if last {
		pieces = pieces[len(pieces)-1:]
	}
	median := func(from, to func(s, r relay.PieceTimes) int64) float64 {
		xs := make([]float64, 0, len(pieces))
		for _, p := range pieces {
			xs = append(xs, float64(to(p[0], p[1])-from(p[0], p[1]))/1e3)
		}
		return percentiles(xs)[0]
	}
	note := fmt.Sprintf("times the sender and the relay recorded (relay.PieceTimes), p50 over the last %d Pieces", len(pieces))
	if last {
		note = "times the sender and the relay recorded (relay.PieceTimes) for that Piece"
	}
	var rows []Row
	for _, st := range pieceSteps {
		rows = append(rows, Row{Scenario: prefix + what + " step: " + st.name, Value: median(st.from, st.to), Unit: "µs", Verified: true, Note: note})
	}
	rows = append(rows, Row{Scenario: prefix + what + " step: the whole way, Submit to the sender's reap", Value: median(pieceSteps[0].from, pieceSteps[len(pieceSteps)-1].to), Unit: "µs", Verified: true, Note: note})
	return rows
}
