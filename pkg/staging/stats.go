// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"
)

// fallbackReasonNames are the names of the Fallback* reasons in metrics
// labels, reports and logs.
var fallbackReasonNames = [FallbackReasons]string{
	FallbackCreditTimeout: "credit_timeout",
	FallbackRelayStale:    "relay_stale",
	FallbackRelayGone:     "relay_gone",
	FallbackLaneBroken:    "lane_broken",
	FallbackSourceEvent:   "source_event",
	FallbackNoLane:        "no_lane",
	FallbackOther:         "other",
}

// FallbackReasonName is the name of fallback reason r ("credit_timeout",
// "relay_stale", ...), or "" when r is not one.
func FallbackReasonName(r int) string {
	if r < 0 || r >= FallbackReasons {
		return ""
	}
	return fallbackReasonNames[r]
}

// FallbackCounts is a count per fallback reason, indexed by
// FallbackCreditTimeout and the rest; in JSON an object keyed by the
// reasons' names.
type FallbackCounts [FallbackReasons]uint64

// Total sums every reason.
func (c *FallbackCounts) Total() uint64 {
	var n uint64
	for _, x := range c {
		n += x
	}
	return n
}

func (c FallbackCounts) MarshalJSON() ([]byte, error) {
	m := make(map[string]uint64, len(c))
	for i, n := range c {
		m[fallbackReasonNames[i]] = n
	}
	return json.Marshal(m)
}

func (c *FallbackCounts) UnmarshalJSON(b []byte) error {
	var m map[string]uint64
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*c = FallbackCounts{}
	for name, n := range m {
		i := slices.Index(fallbackReasonNames[:], name)
		if i < 0 {
			return fmt.Errorf("fallback reason %q: want one of %v", name, fallbackReasonNames)
		}
		c[i] = n
	}
	return nil
}

// Publish copies src's counters into s under the sequence lock: Gen is odd
// from the first store to the last. Every word is stored atomically, so
// that on any CPU a reader that sees Gen even and unchanged around its
// copy saw none of a publish. Gen and Device of src are ignored. Only the
// rank that owns the control block publishes, from one goroutine.
func (s *RankStats) Publish(src *RankStats) {
	gen := atomic.LoadUint64(&s.Gen) &^ 1
	atomic.StoreUint64(&s.Gen, gen+1)
	atomic.StoreUint64(&s.UpdatedAt, src.UpdatedAt)
	atomic.StoreUint64(&s.RelayedBytes, src.RelayedBytes)
	atomic.StoreUint64(&s.RelayedPieces, src.RelayedPieces)
	atomic.StoreUint64(&s.ForwardedBytes, src.ForwardedBytes)
	atomic.StoreUint64(&s.ForwardedPieces, src.ForwardedPieces)
	atomic.StoreUint64(&s.DirectBytes, src.DirectBytes)
	atomic.StoreUint64(&s.FailedPieces, src.FailedPieces)
	atomic.StoreUint64(&s.SecondHopFailures, src.SecondHopFailures)
	atomic.StoreUint64(&s.InvalidDescs, src.InvalidDescs)
	atomic.StoreUint64(&s.CreditWaits, src.CreditWaits)
	atomic.StoreUint64(&s.LaneQuarantines, src.LaneQuarantines)
	atomic.StoreUint64(&s.PumpCPUNanos, src.PumpCPUNanos)
	atomic.StoreUint32(&s.OutboundLanes, src.OutboundLanes)
	atomic.StoreUint32(&s.InboundLanes, src.InboundLanes)
	for i := range s.FallbackBytes {
		atomic.StoreUint64(&s.FallbackBytes[i], src.FallbackBytes[i])
		atomic.StoreUint64(&s.FallbackPieces[i], src.FallbackPieces[i])
	}
	atomic.StoreUint64(&s.Gen, gen+2)
}

// Load copies s into dst and reports whether the copy is whole: false when
// a publish was under way or ran during the copy (the caller retries, a
// bounded number of times: the block may belong to a hostile process).
// Device, written before the rank was published, is copied as it is;
// DeviceName checks it.
func (s *RankStats) Load(dst *RankStats) bool {
	gen := atomic.LoadUint64(&s.Gen)
	if gen&1 != 0 {
		return false
	}
	dst.Gen = gen
	dst.UpdatedAt = atomic.LoadUint64(&s.UpdatedAt)
	dst.RelayedBytes = atomic.LoadUint64(&s.RelayedBytes)
	dst.RelayedPieces = atomic.LoadUint64(&s.RelayedPieces)
	dst.ForwardedBytes = atomic.LoadUint64(&s.ForwardedBytes)
	dst.ForwardedPieces = atomic.LoadUint64(&s.ForwardedPieces)
	dst.DirectBytes = atomic.LoadUint64(&s.DirectBytes)
	dst.FailedPieces = atomic.LoadUint64(&s.FailedPieces)
	dst.SecondHopFailures = atomic.LoadUint64(&s.SecondHopFailures)
	dst.InvalidDescs = atomic.LoadUint64(&s.InvalidDescs)
	dst.CreditWaits = atomic.LoadUint64(&s.CreditWaits)
	dst.LaneQuarantines = atomic.LoadUint64(&s.LaneQuarantines)
	dst.PumpCPUNanos = atomic.LoadUint64(&s.PumpCPUNanos)
	dst.OutboundLanes = atomic.LoadUint32(&s.OutboundLanes)
	dst.InboundLanes = atomic.LoadUint32(&s.InboundLanes)
	for i := range s.FallbackBytes {
		dst.FallbackBytes[i] = atomic.LoadUint64(&s.FallbackBytes[i])
		dst.FallbackPieces[i] = atomic.LoadUint64(&s.FallbackPieces[i])
	}
	dst.DeviceLen, dst.Device = s.DeviceLen, s.Device
	return atomic.LoadUint64(&s.Gen) == gen
}

// SetDevice records the memory the rank's arena lives in. It is written
// once, before the rank is published READY.
func (s *RankStats) SetDevice(name string) error {
	if len(name) > len(s.Device) || bytes.IndexByte([]byte(name), 0) >= 0 {
		return fmt.Errorf("device name %q: want at most %d bytes, no NUL", name, len(s.Device))
	}
	s.Device = [len(s.Device)]byte{}
	copy(s.Device[:], name)
	s.DeviceLen = uint32(len(name))
	return nil
}

// DeviceName returns the recorded device name, checked: the block may come
// from a hostile process.
func (s *RankStats) DeviceName() (string, error) {
	if s.DeviceLen > uint32(len(s.Device)) {
		return "", fmt.Errorf("device name length %d, want at most %d", s.DeviceLen, len(s.Device))
	}
	name := s.Device[:s.DeviceLen]
	if bytes.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("device name %q holds a NUL byte", name)
	}
	return string(name), nil
}
