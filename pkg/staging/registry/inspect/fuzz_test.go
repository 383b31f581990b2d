// SPDX-License-Identifier: Apache-2.0

package inspect

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

const (
	statsOffset = int64(unsafe.Offsetof(staging.ControlBlock{}.Stats))
	statsSize   = int(unsafe.Sizeof(staging.RankStats{}))
)

// statsBlock is a counters block as a rank publishes it.
func statsBlock(device string, mutate func(*staging.RankStats)) []byte {
	var st staging.RankStats
	if err := st.SetDevice(device); err != nil {
		panic(err)
	}
	st.Gen, st.UpdatedAt = 2, 1000
	st.RelayedBytes, st.OutboundLanes, st.InboundLanes = 1<<20, 3, 2
	st.FallbackBytes[1] = 77
	if mutate != nil {
		mutate(&st)
	}
	return bytes.Clone(unsafe.Slice((*byte)(unsafe.Pointer(&st)), statsSize))
}

// FuzzStatsReport puts any bytes where a rank's control file holds its
// counters block and reads them as the agent does (the file mapped, the
// block copied, then checked). A block is refused, as a corrupt entry
// naming the field, exactly when its device name is too long or holds a
// NUL or its lane counts are past what a rank can hold; a block taken
// reports every counter as the block holds it, the device as its bytes,
// published only with a generation, never a negative age or CPU time, and
// encodes as JSON. A generation that stays odd is the reader's bounded
// wait, which TestStatsOfAHostileBlock judges: here it is made even.
func FuzzStatsReport(f *testing.F) {
	f.Add(statsBlock("0000:3b:00.0", nil), int64(2000))
	f.Add(statsBlock("host", func(s *staging.RankStats) { s.Gen = 0 }), int64(0))
	f.Add(statsBlock("GPU-8f0e", func(s *staging.RankStats) { s.DeviceLen = 49 }), int64(5))
	f.Add(statsBlock("GPU-8f0e", func(s *staging.RankStats) { s.Device[2] = 0 }), int64(5))
	f.Add(statsBlock("host", func(s *staging.RankStats) { s.InboundLanes = staging.LaneCount + 1 }), int64(5))
	f.Add(statsBlock("host", func(s *staging.RankStats) { s.OutboundLanes = 1 << 31 }), int64(5))
	f.Add(statsBlock("host", func(s *staging.RankStats) { s.PumpCPUNanos = 1<<64 - 1; s.UpdatedAt = 1<<64 - 1 }), int64(-1))
	f.Add([]byte{}, int64(0))
	path := filepath.Join(f.TempDir(), "control")
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		f.Fatal(err)
	}
	defer file.Close()
	if err := file.Truncate(int64(staging.ControlSize)); err != nil {
		f.Fatal(err)
	}
	fd := int(file.Fd())
	f.Fuzz(func(t *testing.T, block []byte, now int64) {
		b := make([]byte, statsSize)
		copy(b, block)
		gen := binary.LittleEndian.Uint64(b) &^ 1
		binary.LittleEndian.PutUint64(b, gen)
		if _, err := unix.Pwrite(fd, b, statsOffset); err != nil {
			t.Fatal(err)
		}
		var want staging.RankStats
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&want)), statsSize), b)

		st, err := folder.ReadStats(fd)
		if err != nil {
			t.Fatalf("block %x: read: %v", b, err)
		}
		r, err := newStatsReport(&st, now)
		if why := statsProblem(&want); why != "" {
			if err == nil {
				t.Fatalf("block with %s reported as %+v", why, r)
			}
			if !errors.Is(err, folder.ErrCorruptEntry) || !strings.Contains(err.Error(), why) {
				t.Fatalf("block with %s: error %q, want a corrupt entry saying so", why, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("block %x: %v", b, err)
		}
		if r.Device != string(want.Device[:want.DeviceLen]) {
			t.Fatalf("device %q, the block holds %q", r.Device, want.Device[:want.DeviceLen])
		}
		if r.Published != (want.Gen != 0) || (!r.Published && r.Age != 0) || r.Age < 0 || r.PumpCPU < 0 {
			t.Fatalf("generation %d, updated %d, read at %d: published %v, age %v, CPU %v", want.Gen, want.UpdatedAt, now, r.Published, r.Age, r.PumpCPU)
		}
		if want.PumpCPUNanos < 1<<63 && uint64(r.PumpCPU) != want.PumpCPUNanos {
			t.Fatalf("pump CPU %v, the block holds %d ns", r.PumpCPU, want.PumpCPUNanos)
		}
		type count struct {
			name      string
			got, want uint64
		}
		counts := []count{
			{"relayed bytes", r.RelayedBytes, want.RelayedBytes},
			{"relayed pieces", r.RelayedPieces, want.RelayedPieces},
			{"forwarded bytes", r.ForwardedBytes, want.ForwardedBytes},
			{"forwarded pieces", r.ForwardedPieces, want.ForwardedPieces},
			{"direct bytes", r.DirectBytes, want.DirectBytes},
			{"failed pieces", r.FailedPieces, want.FailedPieces},
			{"second hop failures", r.SecondHopFailures, want.SecondHopFailures},
			{"invalid descs", r.InvalidDescs, want.InvalidDescs},
			{"credit waits", r.CreditWaits, want.CreditWaits},
			{"lane quarantines", r.LaneQuarantines, want.LaneQuarantines},
			{"outbound lanes", uint64(r.OutboundLanes), uint64(want.OutboundLanes)},
			{"inbound lanes", uint64(r.InboundLanes), uint64(want.InboundLanes)},
		}
		for i := range staging.FallbackReasons {
			counts = append(counts,
				count{fmt.Sprintf("fallback bytes %d", i), r.FallbackBytes[i], want.FallbackBytes[i]},
				count{fmt.Sprintf("fallback pieces %d", i), r.FallbackPieces[i], want.FallbackPieces[i]})
		}
		for _, c := range counts {
			if c.got != c.want {
				t.Fatalf("%s: %d, the block holds %d", c.name, c.got, c.want)
			}
		}
		if _, err := json.Marshal(r); err != nil {
			t.Fatalf("report %+v does not encode: %v", r, err)
		}
	})
}

// statsProblem is what makes a block unreadable, in the words the reader's
// error must use, or "".
func statsProblem(st *staging.RankStats) string {
	switch {
	case st.DeviceLen > uint32(len(st.Device)):
		return fmt.Sprintf("device name length %d", st.DeviceLen)
	case bytes.IndexByte(st.Device[:st.DeviceLen], 0) >= 0:
		return "holds a NUL byte"
	case st.OutboundLanes > staging.LaneCount*staging.LaneCount || st.InboundLanes > staging.LaneCount:
		return fmt.Sprintf("%d outbound and %d inbound lanes", st.OutboundLanes, st.InboundLanes)
	}
	return ""
}
