// SPDX-License-Identifier: Apache-2.0

package inspect

import (
	"fmt"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

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
		return nil, fmt.Errorf("%w: %v", folder.ErrCorruptEntry, err)
	}
	if st.OutboundLanes > staging.LaneCount*staging.LaneCount || st.InboundLanes > staging.LaneCount {
		return nil, fmt.Errorf("%w: %d outbound and %d inbound lanes", folder.ErrCorruptEntry, st.OutboundLanes, st.InboundLanes)
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
