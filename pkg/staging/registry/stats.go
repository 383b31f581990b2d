// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
)

// ErrStatsBusy means a rank's counters block changed under every attempt to
// copy it (or a hostile writer keeps its sequence word odd).
var ErrStatsBusy = errors.New("counters block busy")

// Attempts of a stats read: statsSpins back to back, then statsNaps apart
// by statsNap. A publish takes well under a microsecond; the naps ride out
// a pump thread descheduled in the middle of one.
const (
	statsSpins = 16
	statsNaps  = 20
	statsNap   = 500 * time.Microsecond
)

// DeviceNamer is implemented by an ArenaProvider whose arenas live in a
// device the rank can name (a GPU's PCI bus id or UUID).
type DeviceNamer interface {
	Device() string
}

// deviceName is what the rank records as its device: Options.Device, else
// the provider's name for it, else "host" for a host-memory arena.
func (o *Options) deviceName() string {
	if o.Device != "" {
		return o.Device
	}
	if n, ok := o.Arenas.(DeviceNamer); ok {
		return n.Device()
	}
	if o.Arenas.Kind() == staging.ArenaHost {
		return "host"
	}
	return ""
}

// PublishStats publishes st's counters into the rank's control file for
// readers outside the process (the node agent, inspect): UpdatedAt is
// stamped with now (a MonoNanos reading) and InboundLanes counted here, from
// the owners of the rank's lanes. It writes only the rank's own mapping and
// never waits: no lock, no system call. The pump calls it, at most once a
// heartbeat, never concurrently with or after Close.
func (r *Rank) PublishStats(st *staging.RankStats, now int64) {
	st.UpdatedAt = uint64(now)
	st.InboundLanes = 0
	for i := range r.ctl.Lanes {
		if _, held := r.ctl.Lanes[i].Owner.Load(); held {
			st.InboundLanes++
		}
	}
	r.ctl.Stats.Publish(st)
}

// statsEnd is where the counters block ends in a control file: the part a
// stats reader maps.
const statsEnd = unsafe.Offsetof(staging.ControlBlock{}.Stats) + unsafe.Sizeof(staging.RankStats{})

// readStats copies the counters block of the control file open as fd,
// whose size the caller has checked. It maps the file's first page read
// only: the block's sequence lock needs atomic loads, which a read(2)
// cannot promise on every CPU. It takes no lock and writes nothing.
func readStats(fd int) (staging.RankStats, error) {
	mem, err := unix.Mmap(fd, 0, int(statsEnd), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return staging.RankStats{}, fmt.Errorf("map the counters block: %w", err)
	}
	defer unix.Munmap(mem)
	return loadStats((*staging.RankStats)(unsafe.Pointer(&mem[unsafe.Offsetof(staging.ControlBlock{}.Stats)])))
}

// loadStats copies a mapped counters block with bounded retries. A file
// truncated under the mapping faults instead of reading: that fault becomes
// an error.
func loadStats(block *staging.RankStats) (st staging.RankStats, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: counters block unreadable (file truncated?): %v", ErrCorruptEntry, r)
		}
	}()
	for i := range statsSpins + statsNaps {
		if block.Load(&st) {
			return st, nil
		}
		if i < statsSpins {
			runtime.Gosched()
		} else {
			time.Sleep(statsNap)
		}
	}
	return staging.RankStats{}, ErrStatsBusy
}

// StatsReport is a rank's counters as its pump last published them. Counts
// are running totals since the rank registered.
type StatsReport struct {
	// Device is the memory the rank's arena lives in: a GPU's PCI bus id
	// or UUID, or "host".
	Device string `json:"device"`
	// Published reports whether the pump has published at all; Age is how
	// old the last publish was when read.
	Published bool          `json:"published"`
	Age       time.Duration `json:"age_ns"`

	RelayedBytes      uint64 `json:"relayed_bytes"`
	RelayedPieces     uint64 `json:"relayed_pieces"`
	ForwardedBytes    uint64 `json:"forwarded_bytes"`
	ForwardedPieces   uint64 `json:"forwarded_pieces"`
	DirectBytes       uint64 `json:"direct_bytes"`
	FailedPieces      uint64 `json:"failed_pieces"`
	SecondHopFailures uint64 `json:"second_hop_failures"`
	InvalidDescs      uint64 `json:"invalid_descs"`
	CreditWaits       uint64 `json:"credit_waits"`
	LaneQuarantines   uint64 `json:"lane_quarantines"`
	// FallbackBytes and FallbackPieces count by reason.
	FallbackBytes  staging.FallbackCounts `json:"fallback_bytes"`
	FallbackPieces staging.FallbackCounts `json:"fallback_pieces"`
	PumpCPU        time.Duration          `json:"pump_cpu_ns"`
	OutboundLanes  int                    `json:"outbound_lanes"`
	InboundLanes   int                    `json:"inbound_lanes"`
}

// newStatsReport checks a copied block and reports it as read at now.
func newStatsReport(st *staging.RankStats, now int64) (*StatsReport, error) {
	dev, err := st.DeviceName()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptEntry, err)
	}
	if st.OutboundLanes > staging.LaneCount*staging.LaneCount || st.InboundLanes > staging.LaneCount {
		return nil, fmt.Errorf("%w: %d outbound and %d inbound lanes", ErrCorruptEntry, st.OutboundLanes, st.InboundLanes)
	}
	r := &StatsReport{
		Device:            dev,
		Published:         st.Gen != 0,
		RelayedBytes:      st.RelayedBytes,
		RelayedPieces:     st.RelayedPieces,
		ForwardedBytes:    st.ForwardedBytes,
		ForwardedPieces:   st.ForwardedPieces,
		DirectBytes:       st.DirectBytes,
		FailedPieces:      st.FailedPieces,
		SecondHopFailures: st.SecondHopFailures,
		InvalidDescs:      st.InvalidDescs,
		CreditWaits:       st.CreditWaits,
		LaneQuarantines:   st.LaneQuarantines,
		PumpCPU:           time.Duration(min(st.PumpCPUNanos, uint64(1<<63-1))),
		OutboundLanes:     int(st.OutboundLanes),
		InboundLanes:      int(st.InboundLanes),
	}
	copy(r.FallbackBytes[:], st.FallbackBytes[:staging.FallbackReasons])
	copy(r.FallbackPieces[:], st.FallbackPieces[:staging.FallbackReasons])
	if r.Published {
		r.Age = max(time.Duration(now-int64(st.UpdatedAt)), 0)
	}
	return r, nil
}
