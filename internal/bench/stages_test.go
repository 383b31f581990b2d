// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/relay"
)

// TestStepsOfAPiece: sender and relay records of one Piece are matched by
// lane and seq, whatever rank reported them; the rows give each step's
// gap and the whole way; with two relays lane and seq name no Piece and
// there are no rows.
func TestStepsOfAPiece(t *testing.T) {
	sender := []relay.PieceTimes{
		{Lane: 0, Seq: 7, Submit: 1000, Copy: 3000, Reaped: 20000},
		{Lane: 0, Seq: 8, Submit: 30000, Copy: 34000, Reaped: 60000},
		{Lane: 1, Seq: 8, Submit: 1, Copy: 2}, // not reaped: left out
	}
	relayRank := []relay.PieceTimes{
		{Lane: 0, Seq: 8, Seen: 40000, Posted: 41000, Done: 55000},
		{Lane: 0, Seq: 7, Seen: 5000, Posted: 6000, Done: 18000},
	}
	pieces := joinTimes([][]relay.PieceTimes{relayRank, sender})
	if len(pieces) != 2 || pieces[0][0].Seq != 7 || pieces[0][1].Seq != 7 || pieces[1][1].Seen != 40000 {
		t.Fatalf("joined %+v", pieces)
	}
	rows := stepRows("P10 ", "request", pieces, true)
	want := []float64{4, 6, 1, 14, 5, 30} // the last Piece: seq 8, µs
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rows), len(want))
	}
	for i, r := range rows {
		if r.Value != want[i] || r.Unit != "µs" || !strings.HasPrefix(r.Scenario, "P10 request step: ") {
			t.Errorf("row %d: %+v, want %.0f µs", i, r, want[i])
		}
	}
	// Over both Pieces: the first hop took 2 and 6 µs; percentiles' p50
	// of two is the upper one.
	if rows := stepRows("", "x", pieces, false); rows[1].Value != 6 {
		t.Errorf("p50 of the first hop over both Pieces: %v, want 6", rows[1].Value)
	}
	other := []relay.PieceTimes{{Lane: 0, Seq: 7, Seen: 1, Posted: 2, Done: 3}}
	if got := joinTimes([][]relay.PieceTimes{relayRank, sender, other}); got != nil {
		t.Errorf("two relays: joined %+v, want nothing", got)
	}
}
