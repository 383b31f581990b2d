// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestFallbackReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := range FallbackReasons {
		name := FallbackReasonName(r)
		if name == "" || seen[name] || strings.ToLower(name) != name {
			t.Errorf("reason %d is named %q (seen before: %v)", r, name, seen[name])
		}
		seen[name] = true
	}
	for _, r := range []int{-1, FallbackReasons, 8} {
		if name := FallbackReasonName(r); name != "" {
			t.Errorf("FallbackReasonName(%d) = %q, want none", r, name)
		}
	}
}

func TestFallbackCountsJSON(t *testing.T) {
	var c FallbackCounts
	c[FallbackCreditTimeout], c[FallbackNoLane] = 5, 7
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"credit_timeout":5`) || !strings.Contains(string(b), `"no_lane":7`) || !strings.Contains(string(b), `"relay_gone":0`) {
		t.Errorf("JSON %s does not name every reason with its count", b)
	}
	var back FallbackCounts
	if err := json.Unmarshal(b, &back); err != nil || back != c || back.Total() != 12 {
		t.Errorf("round trip: %v (total %d), %v; want %v", back, back.Total(), err, c)
	}
	if err := json.Unmarshal([]byte(`{"cosmic_rays":1}`), &back); err == nil || !strings.Contains(err.Error(), "cosmic_rays") {
		t.Errorf("unknown reason: %v, want an error naming it", err)
	}
}

func TestRankStatsDevice(t *testing.T) {
	var s RankStats
	if err := s.SetDevice("0000:18:00.0"); err != nil {
		t.Fatal(err)
	}
	if name, err := s.DeviceName(); err != nil || name != "0000:18:00.0" {
		t.Errorf("DeviceName = %q, %v", name, err)
	}
	if err := s.SetDevice(strings.Repeat("x", len(s.Device)+1)); err == nil {
		t.Error("SetDevice took a name longer than the field")
	}
	s.DeviceLen = uint32(len(s.Device) + 1)
	if _, err := s.DeviceName(); err == nil {
		t.Error("DeviceName accepted a length beyond the field")
	}
	s.DeviceLen, s.Device[1] = 3, 0
	if _, err := s.DeviceName(); err == nil {
		t.Error("DeviceName accepted a NUL byte")
	}
}

func TestRankStatsPublishAndLoad(t *testing.T) {
	var block, src, got RankStats
	if err := block.SetDevice("host"); err != nil {
		t.Fatal(err)
	}
	src.RelayedBytes, src.ForwardedPieces, src.OutboundLanes, src.InboundLanes = 1<<30, 9, 2, 3
	src.FallbackPieces[FallbackRelayStale], src.UpdatedAt, src.Gen = 4, 77, 1001
	block.Publish(&src)
	if !block.Load(&got) {
		t.Fatal("Load refused a block with no publish under way")
	}
	if got.Gen != 2 || got.RelayedBytes != src.RelayedBytes || got.ForwardedPieces != 9 || got.OutboundLanes != 2 ||
		got.InboundLanes != 3 || got.FallbackPieces[FallbackRelayStale] != 4 || got.UpdatedAt != 77 || got.DeviceLen != 4 {
		t.Errorf("loaded %+v after one publish of %+v", got, src)
	}
	block.Gen++
	if block.Load(&got) {
		t.Error("Load took a block whose generation is odd (a publish under way)")
	}
	block.Publish(&src)
	if !block.Load(&got) || got.Gen != 4 {
		t.Errorf("a publish after an odd generation left generation %d, want the next even one, 4", got.Gen)
	}
}
