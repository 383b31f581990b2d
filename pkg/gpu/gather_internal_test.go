// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu/kernel"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

func TestUseGather(t *testing.T) {
	ents := func(lens ...uint64) []relay.CopyEntry {
		out := make([]relay.CopyEntry, len(lens))
		for i, n := range lens {
			out[i] = relay.CopyEntry{Src: 0x1000, Dst: 0x2000, Len: n}
		}
		return out
	}
	const th = 512 << 10
	tests := []struct {
		name string
		mode GatherMode
		ents []relay.CopyEntry
		want bool
	}{
		{"auto, small entries", GatherAuto, ents(2048, 2048, 2048), true},
		{"auto, mean just below", GatherAuto, ents(th-1, th-1), true},
		{"auto, mean at threshold", GatherAuto, ents(th, th), false},
		{"auto, one entry", GatherAuto, ents(2048), false},
		{"auto, one live entry among empty ones", GatherAuto, ents(0, 2048, 0), false},
		{"auto, empties do not lower the mean", GatherAuto, ents(0, 0, 0, 0, 0, 0, th, th), false},
		{"auto, none", GatherAuto, nil, false},
		{"ce", GatherCE, ents(16, 16), false},
		{"sm, one entry", GatherSM, ents(8 << 20), true},
	}
	for _, tt := range tests {
		if got := useGather(tt.mode, th, tt.ents); got != tt.want {
			t.Errorf("%s: useGather = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The inline kernel's parameter is the shim's pxn_inline_plan: the PTX
// declares its size, and a plan built to another size would hand the
// kernel shifted entries.
func TestInlinePlanMatchesThePTX(t *testing.T) {
	m := regexp.MustCompile(`\.param \.align 8 \.b8 ` + kernel.GatherInlineEntry + `_param_0\[(\d+)\]`).FindSubmatch(kernel.GatherPTX())
	if m == nil {
		t.Fatalf("the PTX declares no by-value parameter of %s", kernel.GatherInlineEntry)
	}
	if n, _ := strconv.Atoi(string(m[1])); n != cuda.InlinePlanBytes {
		t.Fatalf("%s takes %d bytes, the shim builds %d", kernel.GatherInlineEntry, n, cuda.InlinePlanBytes)
	}
	// The shim launches the uploaded-plan kernel with nine arguments, the
	// doorbell last.
	params := regexp.MustCompile(kernel.GatherEntry+`_param_(\d+)`).FindAllSubmatch(kernel.GatherPTX(), -1)
	last := -1
	for _, p := range params {
		if n, _ := strconv.Atoi(string(p[1])); n > last {
			last = n
		}
	}
	if last != 8 {
		t.Fatalf("%s takes %d parameters, the shim passes 9", kernel.GatherEntry, last+1)
	}
	if cuda.InlineEntries > staging.MaxPlans || cuda.MaxParts != staging.MaxParts {
		t.Fatalf("inline entries %d, parts %d: want at most %d and %d", cuda.InlineEntries, cuda.MaxParts, staging.MaxPlans, staging.MaxParts)
	}
}
