// SPDX-License-Identifier: Apache-2.0

package cpucopy

import (
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/pxn-project/pxn/pkg/relay"
)

// The steady state of the data path allocates nothing: these tests count
// every allocation of the process, the hops' and servers' goroutines
// included, over many ops after a warm-up.

const allocRuns = 2000

func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
}

func TestHostCopierAllocs(t *testing.T) {
	skipUnderRace(t)
	src, dst := mapped(t, 256), mapped(t, 256)
	fill(src, 43)
	for _, hold := range []bool{false, true} {
		c := newCopier(t, hold)
		if err := c.RegisterDevice(addr(src), 256); err != nil {
			t.Fatal(err)
		}
		entries := []relay.CopyEntry{{Src: addr(src), Dst: addr(dst), Len: 128}, {Src: addr(src) + 128, Dst: addr(dst) + 128, Len: 128}}
		var bells [2]bell
		seq := uint64(0)
		// One Piece: the caller classifies and records, the pump queries,
		// enqueues the copy behind the event and releases the event; a
		// held event is completed after the Copy, as a stream would.
		cycle := func() {
			seq++
			if c.Classify(addr(src), 256) != relay.Device {
				t.Fatal("source not device memory")
			}
			ev, err := c.RecordReady(0)
			if err != nil {
				t.Fatal(err)
			}
			if done, err := c.Query(ev); err != nil || done == hold {
				t.Fatalf("Query(%d) = %v, %v with hold %v", ev, done, err, hold)
			}
			lane := int(seq % 2 * 3)
			if err := c.Copy(lane, ev, entries, &bells[lane/3].seq, seq); err != nil {
				t.Fatal(err)
			}
			if hold {
				if err := c.ReleaseReady(ev); err != nil {
					t.Fatal(err)
				}
			}
			if done, err := c.Query(ev); err != nil || !done {
				t.Fatalf("Query(%d) = %v, %v after its release", ev, done, err)
			}
			c.Release(ev)
			for atomic.LoadUint64(&bells[lane/3].seq) != seq {
				runtime.Gosched()
			}
		}
		// Every entry buffer of both lanes is used once.
		for range 4 * LaneQueueDepth {
			cycle()
		}
		if allocs := testing.AllocsPerRun(allocRuns, cycle); allocs != 0 {
			t.Errorf("hold %v: %v allocations per Piece, want 0", hold, allocs)
		}
		if st := c.Stats(); st.LiveEvents != 0 || st.HeldEvents != 0 {
			t.Fatalf("hold %v: stats %+v, want no event left", hold, st)
		}
	}
}
