// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"math"
	"reflect"
	"testing"
)

func TestSlotOf(t *testing.T) {
	tests := []struct {
		seq  uint64
		want int
	}{
		{1, 0},
		{2, 1},
		{3, 2},
		{17, 16},
		{18, 17},
		{19, 0},
		{20, 1},
		{36, 17},
		{37, 0},
		{641, 640 % 18},
		{MaxLaneSeq, int((MaxLaneSeq - 1) % 18)},
		{math.MaxUint64, int((math.MaxUint64 - 1) % 18)},
	}
	for _, tt := range tests {
		if got := SlotOf(tt.seq); got != tt.want {
			t.Errorf("SlotOf(%d) = %d, want %d", tt.seq, got, tt.want)
		}
	}
}

func TestSlotOfVisitsEverySlotOncePerRound(t *testing.T) {
	for _, first := range []uint64{1, 19, 1000, MaxLaneSeq - SlotsPerLane + 1} {
		var seen [SlotsPerLane]int
		for seq := first; seq < first+SlotsPerLane; seq++ {
			seen[SlotOf(seq)]++
		}
		for slot, n := range seen {
			if n != 1 {
				t.Errorf("seqs %d..%d: slot %d used %d times, want 1", first, first+SlotsPerLane-1, slot, n)
			}
		}
	}
}

func TestSlotReuseNeedsTheSeqKBefore(t *testing.T) {
	if SlotOf(19) != SlotOf(1) || SlotOf(19) != 0 {
		t.Fatalf("seq 19 is in slot %d, seq 1 in slot %d; want both in slot 0", SlotOf(19), SlotOf(1))
	}
	for seq := uint64(1); seq <= 5*SlotsPerLane; seq++ {
		for other := seq + 1; other < seq+SlotsPerLane; other++ {
			if SlotOf(other) == SlotOf(seq) {
				t.Fatalf("seqs %d and %d share slot %d although fewer than K apart", seq, other, SlotOf(seq))
			}
		}
		if SlotOf(seq+SlotsPerLane) != SlotOf(seq) {
			t.Fatalf("seq %d is in slot %d, seq %d in slot %d; want the same", seq, SlotOf(seq), seq+SlotsPerLane, SlotOf(seq+SlotsPerLane))
		}
	}
}

// maskSlot is the power-of-two shortcut that K = 18 forbids.
func maskSlot(seq uint64) int { return int((seq - 1) & (SlotsPerLane - 1)) }

func TestSlotOfIsNotAMask(t *testing.T) {
	tests := []struct {
		seq        uint64
		slot, mask int
	}{
		{3, 2, 0},
		{4, 3, 1},
		{16, 15, 1},
		{19, 0, 16},
		{20, 1, 17},
	}
	for _, tt := range tests {
		if got := SlotOf(tt.seq); got != tt.slot {
			t.Errorf("SlotOf(%d) = %d, want %d", tt.seq, got, tt.slot)
		}
		if got := maskSlot(tt.seq); got != tt.mask {
			t.Errorf("mask slot of %d = %d, want %d", tt.seq, got, tt.mask)
		}
	}

	first := uint64(0)
	masked := map[int]bool{}
	for seq := uint64(1); seq <= SlotsPerLane; seq++ {
		if maskSlot(seq) != SlotOf(seq) && first == 0 {
			first = seq
		}
		masked[maskSlot(seq)] = true
	}
	if first != 3 {
		t.Errorf("first seq where the mask and the modulo differ = %d, want 3", first)
	}
	if len(masked) != 4 {
		t.Errorf("a mask maps one round of %d seqs onto %d slots, want 4 (slots 0, 1, 16, 17)", SlotsPerLane, len(masked))
	}
}

func TestArenaGeometry(t *testing.T) {
	if ArenaSize != 1008<<20 {
		t.Fatalf("ArenaSize = %d, want %d (1008 MiB)", ArenaSize, 1008<<20)
	}
	if LaneBytes != 144<<20 {
		t.Errorf("LaneBytes = %d, want %d (144 MiB)", LaneBytes, 144<<20)
	}
	tests := []struct {
		lane, slot int
		want       uint64
	}{
		{0, 0, 0},
		{0, 1, 8 << 20},
		{0, 17, 136 << 20},
		{1, 0, 144 << 20},
		{2, 3, 312 << 20},
		{6, 0, 864 << 20},
		{6, 17, 1000 << 20},
	}
	for _, tt := range tests {
		if got := SlotOffset(tt.lane, tt.slot); got != tt.want {
			t.Errorf("SlotOffset(%d, %d) = %d, want %d", tt.lane, tt.slot, got, tt.want)
		}
	}
	for lane := 0; lane < LaneCount; lane++ {
		if got, want := LaneOffset(lane), uint64(lane)*144<<20; got != want {
			t.Errorf("LaneOffset(%d) = %d, want %d", lane, got, want)
		}
	}
}

func TestSlotsTileTheArena(t *testing.T) {
	want := uint64(0)
	for lane := 0; lane < LaneCount; lane++ {
		for slot := 0; slot < SlotsPerLane; slot++ {
			if got := SlotOffset(lane, slot); got != want {
				t.Fatalf("SlotOffset(%d, %d) = %d, want %d (slots must be adjacent)", lane, slot, got, want)
			}
			want += SlotSize
		}
	}
	if want != ArenaSize {
		t.Fatalf("slots cover %d bytes, want the arena's %d", want, ArenaSize)
	}
}

// sharedTypes are every struct that lives in a control file or a lane's
// blocks.
var sharedTypes = []reflect.Type{
	reflect.TypeFor[PlanEntry](),
	reflect.TypeFor[Desc](),
	reflect.TypeFor[Completion](),
	reflect.TypeFor[ReadyWord](),
	reflect.TypeFor[LaneOwner](),
	reflect.TypeFor[SenderProgress](),
	reflect.TypeFor[RelayProgress](),
	reflect.TypeFor[RelayWake](),
	reflect.TypeFor[LaneSenderBlock](),
	reflect.TypeFor[LaneRelayBlock](),
	reflect.TypeFor[LaneSummary](),
	reflect.TypeFor[Header](),
	reflect.TypeFor[RankStats](),
	reflect.TypeFor[ControlBlock](),
}

func TestSharedStructsHaveNoImplicitPadding(t *testing.T) {
	for _, typ := range sharedTypes {
		end := uintptr(0)
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.Offset != end {
				t.Errorf("%s.%s at offset %d, want %d: pad explicitly", typ.Name(), f.Name, f.Offset, end)
			}
			end = f.Offset + f.Type.Size()
		}
		if end != typ.Size() {
			t.Errorf("%s: fields end at %d, size %d: pad explicitly", typ.Name(), end, typ.Size())
		}
	}
}

// lineMates returns the named fields of typ that share a cache line with
// field, and whether field starts a cache line.
func lineMates(typ reflect.Type, field string) (mates []string, aligned bool) {
	f, ok := typ.FieldByName(field)
	if !ok {
		return nil, false
	}
	line := f.Offset / CacheLine
	for i := range typ.NumField() {
		g := typ.Field(i)
		if g.Name == "_" || g.Name == field {
			continue
		}
		first, last := g.Offset/CacheLine, (g.Offset+g.Type.Size()-1)/CacheLine
		if first <= line && line <= last {
			mates = append(mates, g.Name)
		}
	}
	return mates, f.Offset%CacheLine == 0
}

func TestPolledWordsOwnTheirCacheLine(t *testing.T) {
	tests := []struct {
		typ       reflect.Type
		field     string
		wantMates []string
	}{
		{reflect.TypeFor[ReadyWord](), "Seq", []string{"Parts"}},
		{reflect.TypeFor[Completion](), "Seq", []string{"Status"}},
		{reflect.TypeFor[RelayProgress](), "CompletedSeq", []string{"OpenEpoch"}},
		{reflect.TypeFor[Header](), "Heartbeat", nil},
		{reflect.TypeFor[WakeWord](), "Seq", []string{"Sleeping"}},
		{reflect.TypeFor[LaneSummary](), "Owner", nil},
		{reflect.TypeFor[LaneSummary](), "Sender", nil},
		{reflect.TypeFor[LaneSummary](), "Relay", nil},
		{reflect.TypeFor[LaneSenderBlock](), "Sender", nil},
		{reflect.TypeFor[LaneSenderBlock](), "Ready", nil},
		{reflect.TypeFor[LaneSenderBlock](), "Descs", nil},
		{reflect.TypeFor[LaneRelayBlock](), "Relay", nil},
		{reflect.TypeFor[LaneRelayBlock](), "Wake", nil},
		{reflect.TypeFor[LaneRelayBlock](), "Completions", nil},
		{reflect.TypeFor[ControlBlock](), "Lanes", nil},
	}
	for _, tt := range tests {
		mates, aligned := lineMates(tt.typ, tt.field)
		if !aligned {
			t.Errorf("%s.%s does not start a cache line", tt.typ.Name(), tt.field)
		}
		if !reflect.DeepEqual(mates, tt.wantMates) {
			t.Errorf("%s.%s shares its cache line with %v, want %v", tt.typ.Name(), tt.field, mates, tt.wantMates)
		}
	}
	for _, typ := range sharedTypes[1:] {
		if typ.Size()%CacheLine != 0 {
			t.Errorf("%s: size %d is not a multiple of %d", typ.Name(), typ.Size(), CacheLine)
		}
	}
}
