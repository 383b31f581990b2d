// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// flatPlan is a plan's slices walked Piece by Piece (Plan.PieceSlices),
// with the plan entries and first-hop copies the sender derives from them.
type flatPlan struct {
	Slices  []Slice
	Entries []PlanEntry
	Copies  []slotCopy
}

// slotCopy is one first-hop copy as the sender derives it from a slice:
// Len bytes from Src to Offset in the slot.
type slotCopy struct {
	Src    uint64
	Offset uint64
	Len    uint64
}

func flatten(p *Plan, blocks []Block) flatPlan {
	var f flatPlan
	for i := range p.Pieces {
		f.Slices = append(f.Slices, pieceSlices(p, blocks, i)...)
	}
	for _, s := range f.Slices {
		f.Entries = append(f.Entries, PlanEntry{Dst: s.Dst, Len: s.Len})
		f.Copies = append(f.Copies, slotCopy{Src: s.Src, Offset: s.Offset, Len: s.Len})
	}
	return f
}

// pieceSlices collects Piece i's slices.
func pieceSlices(p *Plan, blocks []Block, i int) []Slice {
	var out []Slice
	it := p.PieceSlices(blocks, i)
	for s, ok := it.Next(); ok; s, ok = it.Next() {
		out = append(out, s)
	}
	return out
}

// span is a Piece's slice numbers and bytes.
type span struct {
	Start, End int
	Len        uint64
}

func spans(p *Plan) []span {
	out := make([]span, len(p.Pieces))
	for i, pc := range p.Pieces {
		out[i] = span{pc.Start, pc.End, pc.Len}
	}
	return out
}

// verifyPlan checks p against blocks from first principles: Pieces tile the
// slices in order and respect both limits, every Piece but the last is full,
// offsets are contiguous from 0, entries and copies mirror the slices, and
// walking the slices in order rebuilds every block exactly.
func verifyPlan(t testing.TB, blocks []Block, tasks int, p *Plan, limitBytes uint64, limitPlans int) {
	t.Helper()
	verifyRampPlan(t, blocks, tasks, p, limitBytes, limitPlans, 0)
}

// rampCap is the byte limit of Piece i under a ramp from first (0: none):
// first, doubled i times, never above limit.
func rampCap(first, limit uint64, i int) uint64 {
	if first == 0 || first >= limit {
		return limit
	}
	c := first
	for range i {
		c = min(2*c, limit)
	}
	return c
}

// verifyRampPlan is verifyPlan for a planner whose ramp starts at first:
// Piece i holds at most rampCap(first, limitBytes, i) bytes, and is full
// to that cap or to the entry limit unless it is the last.
func verifyRampPlan(t testing.TB, blocks []Block, tasks int, p *Plan, limitBytes uint64, limitPlans int, first uint64) {
	t.Helper()
	f := flatten(p, blocks)
	next := 0
	for i, pc := range p.Pieces {
		if pc.Start != next || pc.End <= pc.Start {
			t.Fatalf("piece %d spans [%d, %d), want a non-empty range from %d", i, pc.Start, pc.End, next)
		}
		n := pc.End - pc.Start
		limit := rampCap(first, limitBytes, i)
		if n > limitPlans || pc.Len > limit {
			t.Fatalf("piece %d: %d entries, %d bytes; limits %d, %d", i, n, pc.Len, limitPlans, limit)
		}
		if got := len(pieceSlices(p, blocks, i)); got != n {
			t.Fatalf("piece %d walks %d slices, its range holds %d", i, got, n)
		}
		var off uint64
		for j := pc.Start; j < pc.End; j++ {
			s := f.Slices[j]
			if s.Len == 0 || s.Offset != off {
				t.Fatalf("piece %d slice %d: len %d offset %d, want len > 0 at offset %d", i, j, s.Len, s.Offset, off)
			}
			off += s.Len
		}
		if off != pc.Len {
			t.Fatalf("piece %d: len %d, slices sum to %d", i, pc.Len, off)
		}
		if i < len(p.Pieces)-1 && pc.Len != limit && n != limitPlans {
			t.Fatalf("piece %d of %d is not full: %d bytes, %d entries", i, len(p.Pieces), pc.Len, n)
		}
		next = pc.End
	}
	if next != len(f.Slices) {
		t.Fatalf("pieces cover %d of %d slices", next, len(f.Slices))
	}

	splits := make([]int, len(blocks))
	for k := range p.Splits(blocks) {
		splits[k]++
	}
	var total uint64
	j := 0
	for bi, b := range blocks {
		if b.Task < 0 || b.Task >= tasks {
			t.Fatalf("block %d: task %d not in [0, %d) planned", bi, b.Task, tasks)
		}
		total += b.Len
		src, dst, left := b.Src, b.Dst, b.Len
		first := j
		for left > 0 {
			if j >= len(f.Slices) {
				t.Fatalf("block %d: slices end with %d bytes left", bi, left)
			}
			s := f.Slices[j]
			if s.Task != b.Task || s.Src != src || s.Dst != dst || s.Len > left {
				t.Fatalf("block %d (%+v): slice %d = %+v, want task %d src %#x dst %#x len ≤ %d", bi, b, j, s, b.Task, src, dst, left)
			}
			src += s.Len
			dst += s.Len
			left -= s.Len
			j++
		}
		want := splits[bi]
		if b.Len > 0 {
			want++
		}
		if j-first != want {
			t.Fatalf("block %d (%+v): %d slices, Splits yields it %d times", bi, b, j-first, splits[bi])
		}
	}
	if j != len(f.Slices) {
		t.Fatalf("blocks use %d of %d slices", j, len(f.Slices))
	}
	if p.Bytes != total {
		t.Fatalf("bytes = %d, want %d", p.Bytes, total)
	}
}

func pieceLens(p *Plan) []uint64 {
	lens := make([]uint64, len(p.Pieces))
	for i, pc := range p.Pieces {
		lens[i] = pc.Len
	}
	return lens
}

func TestPlannerPieceBoundaries(t *testing.T) {
	const S = SlotSize
	tests := []struct {
		name string
		lens []uint64
		want []uint64
	}{
		{"empty request", nil, []uint64{}},
		{"S-1", []uint64{S - 1}, []uint64{S - 1}},
		{"S", []uint64{S}, []uint64{S}},
		{"S+1", []uint64{S + 1}, []uint64{S, 1}},
		{"2S+1", []uint64{2*S + 1}, []uint64{S, S, 1}},
		{"S-1 then 2 splits the second block", []uint64{S - 1, 2}, []uint64{S, 1}},
		{"S-1 then 1 fills exactly", []uint64{S - 1, 1, 1}, []uint64{S, 1}},
		{"S+1 then S-1", []uint64{S + 1, S - 1}, []uint64{S, S}},
		{"one byte", []uint64{1}, []uint64{1}},
	}
	var pl Planner
	var p Plan
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			blocks := make([]Block, len(tc.lens))
			src, dst := uint64(0x7f00_0000_0000), uint64(0x1_0000_0000)
			for i, n := range tc.lens {
				blocks[i] = Block{Src: src, Dst: dst, Len: n, Task: i}
				src += n + 4096
				dst += 2 * n
			}
			if err := pl.Plan(blocks, len(blocks), &p); err != nil {
				t.Fatal(err)
			}
			if got := pieceLens(&p); !slices.Equal(got, tc.want) {
				t.Fatalf("piece lengths = %v, want %v", got, tc.want)
			}
			verifyPlan(t, blocks, len(blocks), &p, SlotSize, MaxPlans)
		})
	}
}

func TestPlannerContiguous5GiB(t *testing.T) {
	blocks := []Block{{Src: 0x7000_0000_0000, Dst: 0x2000_0000_0000, Len: 5 << 30}}
	var pl Planner
	var p Plan
	if err := pl.Plan(blocks, 1, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Pieces) != 640 {
		t.Fatalf("%d pieces, want 640", len(p.Pieces))
	}
	for i, pc := range p.Pieces {
		if pc.Len != SlotSize || pc.End-pc.Start != 1 {
			t.Fatalf("piece %d: %d bytes in %d entries, want one entry of %d", i, pc.Len, pc.End-pc.Start, SlotSize)
		}
		it := p.PieceSlices(blocks, i)
		if e, _ := it.Next(); e.Dst != blocks[0].Dst+uint64(i)*SlotSize {
			t.Fatalf("piece %d goes to %#x", i, e.Dst)
		}
	}
	if got := slices.Collect(p.Splits(blocks)); len(got) != 639 || slices.ContainsFunc(got, func(k int) bool { return k != 0 }) {
		t.Fatalf("splits = %v, want block 0 639 times", got)
	}
	verifyPlan(t, blocks, 1, &p, SlotSize, MaxPlans)
}

func TestPlannerPlanLimit(t *testing.T) {
	oneByte := func(n int) []Block {
		b := make([]Block, n)
		for i := range b {
			b[i] = Block{Src: uint64(0x1000 + 2*i), Dst: uint64(0x9000 + 3*i), Len: 1}
		}
		return b
	}
	tests := []struct {
		name    string
		blocks  []Block
		entries []int
	}{
		{"4096 one-byte blocks", oneByte(4096), []int{4096}},
		{"4097 one-byte blocks", oneByte(4097), []int{4096, 1}},
		{"8193 one-byte blocks", oneByte(8193), []int{4096, 4096, 1}},
		{"4095 one-byte blocks then a big one", append(oneByte(4095), Block{Src: 0x10_0000, Dst: 0x20_0000, Len: SlotSize}), []int{4096, 1}},
	}
	var pl Planner
	var p Plan
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := pl.Plan(tc.blocks, 1, &p); err != nil {
				t.Fatal(err)
			}
			got := make([]int, len(p.Pieces))
			for i, pc := range p.Pieces {
				got[i] = pc.End - pc.Start
			}
			if !slices.Equal(got, tc.entries) {
				t.Fatalf("entries per piece = %v, want %v", got, tc.entries)
			}
			verifyPlan(t, tc.blocks, 1, &p, SlotSize, MaxPlans)
		})
	}
}

func TestPlannerTasksMapBack(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const tasks = 37
	blocks := make([]Block, 20000)
	src, dst := uint64(0x7f12_0000_0000), uint64(0x3_0000_0000)
	for i := range blocks {
		var n uint64
		switch rng.IntN(10) {
		case 0:
			n = 0
		case 1:
			n = SlotSize + rng.Uint64N(3*SlotSize)
		case 2:
			n = 1 + rng.Uint64N(16)
		default:
			n = 1 + rng.Uint64N(256<<10)
		}
		blocks[i] = Block{Src: src, Dst: dst, Len: n, Task: rng.IntN(tasks)}
		src += n + rng.Uint64N(2)*64
		dst += n + rng.Uint64N(2)*4096
	}
	var pl Planner
	var p Plan
	if err := pl.Plan(blocks, tasks, &p); err != nil {
		t.Fatal(err)
	}
	verifyPlan(t, blocks, tasks, &p, SlotSize, MaxPlans)
	mixed := 0
	for i := range p.Pieces {
		s := pieceSlices(&p, blocks, i)
		for j := 1; j < len(s); j++ {
			if s[j].Task != s[0].Task {
				mixed++
				break
			}
		}
	}
	if mixed == 0 {
		t.Fatal("no piece carries more than one task")
	}
}

func TestPlannerZeroLength(t *testing.T) {
	blocks := []Block{
		{Src: 0x1000, Dst: 0x2000, Len: 0, Task: 0},
		{Src: 0x1000, Dst: 0x3000, Len: 100, Task: 1},
		{Src: math.MaxUint64, Dst: math.MaxUint64, Len: 0, Task: 0},
		{Src: 0x5000, Dst: 0x6000, Len: 0, Task: 1},
		{Src: 0x7000, Dst: 0x8000, Len: 50, Task: 1},
	}
	var pl Planner
	var p Plan
	if err := pl.Plan(blocks, 3, &p); err != nil {
		t.Fatal(err)
	}
	if got := slices.Collect(p.Splits(blocks)); len(got) != 0 {
		t.Fatalf("splits = %v, want none", got)
	}
	if f := flatten(&p, blocks); len(p.Pieces) != 1 || len(f.Slices) != 2 || p.Pieces[0].Len != 150 {
		t.Fatalf("pieces %+v, slices %+v", p.Pieces, f.Slices)
	}
	verifyPlan(t, blocks, 3, &p, SlotSize, MaxPlans)

	onlyZero := []Block{{Len: 0, Task: 1}, {Src: 4, Dst: 8, Len: 0, Task: 1}}
	if err := pl.Plan(onlyZero, 2, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Pieces) != 0 || p.Bytes != 0 {
		t.Fatalf("zero-length request planned %d pieces, %d bytes", len(p.Pieces), p.Bytes)
	}
}

func TestPlannerDoesNotMerge(t *testing.T) {
	blocks := []Block{
		{Src: 0x1000, Dst: 0x8000, Len: 0x100, Task: 0},
		{Src: 0x1100, Dst: 0x8100, Len: 0x100, Task: 0},
		{Src: 0x1200, Dst: 0x8200, Len: 0x100, Task: 0},
	}
	var pl Planner
	var p Plan
	if err := pl.Plan(blocks, 1, &p); err != nil {
		t.Fatal(err)
	}
	want := []PlanEntry{{Dst: 0x8000, Len: 0x100}, {Dst: 0x8100, Len: 0x100}, {Dst: 0x8200, Len: 0x100}}
	f := flatten(&p, blocks)
	if len(p.Pieces) != 1 || !slices.Equal(f.Entries, want) {
		t.Fatalf("%d pieces, entries = %+v, want 1 piece of %+v", len(p.Pieces), f.Entries, want)
	}
	wantCopies := []slotCopy{{Src: 0x1000, Offset: 0, Len: 0x100}, {Src: 0x1100, Offset: 0x100, Len: 0x100}, {Src: 0x1200, Offset: 0x200, Len: 0x100}}
	if !slices.Equal(f.Copies, wantCopies) {
		t.Fatalf("copies = %+v, want %+v", f.Copies, wantCopies)
	}
	verifyPlan(t, blocks, 1, &p, SlotSize, MaxPlans)
}

func TestPlannerErrors(t *testing.T) {
	ok := Block{Src: 0x1000, Dst: 0x2000, Len: 64}
	tests := []struct {
		name   string
		bad    Block
		tasks  int
		target error
		parts  []string
	}{
		{"src overflow", Block{Src: math.MaxUint64 - 15, Dst: 0x1000, Len: 17}, 1, ErrAddressOverflow,
			[]string{"block 2", "src 0xfffffffffffffff0", "len 0x11"}},
		{"dst overflow", Block{Src: 0x1000, Dst: 1 << 63, Len: 1 << 63}, 1, ErrAddressOverflow,
			[]string{"block 2", "dst 0x8000000000000000", "len 0x8000000000000000"}},
		{"both overflow", Block{Src: math.MaxUint64, Dst: math.MaxUint64, Len: math.MaxUint64}, 1, ErrAddressOverflow,
			[]string{"block 2", "src 0xffffffffffffffff"}},
		{"negative task", Block{Src: 0x1000, Dst: 0x2000, Len: 1, Task: -1}, 1, ErrTaskRange,
			[]string{"block 2", "task -1", "[0, 1)"}},
		{"task past count", Block{Src: 0x1000, Dst: 0x2000, Len: 1, Task: 4}, 4, ErrTaskRange,
			[]string{"block 2", "task 4", "[0, 4)"}},
		{"request too large", Block{Src: 0x1000, Dst: 0x2000, Len: MaxRequestBytes}, 1, ErrRequestTooLarge,
			[]string{"block 2", "len 0x10000000000", "after 0x80"}},
	}
	var pl Planner
	var p Plan
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := pl.Plan([]Block{ok, ok}, 1, &p); err != nil || len(p.Pieces) != 1 {
				t.Fatalf("warm-up plan: %v, %d pieces", err, len(p.Pieces))
			}
			err := pl.Plan([]Block{ok, ok, tc.bad, ok}, tc.tasks, &p)
			if !errors.Is(err, tc.target) {
				t.Fatalf("err = %v, want %v", err, tc.target)
			}
			for _, part := range tc.parts {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error %q lacks %q", err, part)
				}
			}
			if len(p.Pieces) != 0 || p.Bytes != 0 {
				t.Fatalf("plan not emptied after error: %+v", p)
			}
		})
	}
	if err := pl.Plan(nil, -1, &p); !errors.Is(err, ErrTaskRange) {
		t.Fatalf("negative task count: err = %v", err)
	}
}

func TestPlannerAddressSpaceEnd(t *testing.T) {
	blocks := []Block{{Src: math.MaxUint64 - SlotSize - 1, Dst: math.MaxUint64 - 1, Len: 1}, {Src: math.MaxUint64 - SlotSize, Dst: 0, Len: SlotSize}}
	var pl Planner
	var p Plan
	if err := pl.Plan(blocks, 1, &p); err != nil {
		t.Fatalf("ranges ending at 2^64-1 rejected: %v", err)
	}
	verifyPlan(t, blocks, 1, &p, SlotSize, MaxPlans)
}

func TestPlannerReuse(t *testing.T) {
	big := make([]Block, 3000)
	for i := range big {
		big[i] = Block{Src: uint64(i) << 20, Dst: uint64(i) << 21, Len: 1 << 19, Task: i % 50}
	}
	small := []Block{{Src: 0x10, Dst: 0x20, Len: 3, Task: 1}}
	var pl Planner
	var p Plan
	for _, step := range []struct {
		blocks []Block
		tasks  int
	}{{big, 50}, {small, 2}, {big, 50}, {small, 200}} {
		if err := pl.Plan(step.blocks, step.tasks, &p); err != nil {
			t.Fatal(err)
		}
		verifyPlan(t, step.blocks, step.tasks, &p, SlotSize, MaxPlans)
	}
}

func TestPlannerSmallLimits(t *testing.T) {
	pl := Planner{pieceBytes: 10, maxPlans: 3}
	blocks := []Block{
		{Src: 100, Dst: 200, Len: 4, Task: 0},
		{Src: 300, Dst: 400, Len: 25, Task: 1},
		{Src: 500, Dst: 600, Len: 1, Task: 0},
		{Src: 700, Dst: 800, Len: 1, Task: 2},
		{Src: 900, Dst: 1000, Len: 1, Task: 2},
		{Src: 1100, Dst: 1200, Len: 1, Task: 2},
		{Src: 1300, Dst: 1400, Len: 2, Task: 0},
	}
	var p Plan
	if err := pl.Plan(blocks, 3, &p); err != nil {
		t.Fatal(err)
	}
	wantPieces := []span{{0, 2, 10}, {2, 3, 10}, {3, 5, 10}, {5, 8, 3}, {8, 9, 2}}
	if !slices.Equal(spans(&p), wantPieces) {
		t.Fatalf("pieces = %+v, want %+v", spans(&p), wantPieces)
	}
	wantSlices := []Slice{
		{Task: 0, Src: 100, Dst: 200, Len: 4, Offset: 0, Whole: true},
		{Task: 1, Src: 300, Dst: 400, Len: 6, Offset: 4},
		{Task: 1, Src: 306, Dst: 406, Len: 10, Offset: 0},
		{Task: 1, Src: 316, Dst: 416, Len: 9, Offset: 0},
		{Task: 0, Src: 500, Dst: 600, Len: 1, Offset: 9, Whole: true},
		{Task: 2, Src: 700, Dst: 800, Len: 1, Offset: 0, Whole: true},
		{Task: 2, Src: 900, Dst: 1000, Len: 1, Offset: 1, Whole: true},
		{Task: 2, Src: 1100, Dst: 1200, Len: 1, Offset: 2, Whole: true},
		{Task: 0, Src: 1300, Dst: 1400, Len: 2, Offset: 0, Whole: true},
	}
	if f := flatten(&p, blocks); !slices.Equal(f.Slices, wantSlices) {
		t.Fatalf("slices = %+v\nwant %+v", f.Slices, wantSlices)
	}
	// Pieces 1 and 2 begin inside block 1; 3 and 4 begin where a block
	// ends.
	if got := slices.Collect(p.Splits(blocks)); !slices.Equal(got, []int{1, 1}) {
		t.Fatalf("splits = %v, want [1 1]", got)
	}
	verifyPlan(t, blocks, 3, &p, 10, 3)
}

func TestPlannerRamp(t *testing.T) {
	const (
		K = 1 << 10
		M = 1 << 20
		S = SlotSize
	)
	contiguous := func(n uint64) []Block { return []Block{{Src: 0x7f00_0000_0000, Dst: 0x1_0000_0000, Len: n}} }
	scattered := func(blocks int, n uint64) []Block {
		b := make([]Block, blocks)
		for i := range b {
			b[i] = Block{Src: 0x7f00_0000_0000 + uint64(blocks-i)*3*n, Dst: 0x1_0000_0000 + uint64(i)*2*n, Len: n}
		}
		return b
	}
	tests := []struct {
		name    string
		first   uint64
		blocks  []Block
		lens    []uint64
		entries []int
	}{
		{"no ramp", 0, contiguous(20 * M), []uint64{S, S, 4 * M}, []int{1, 1, 1}},
		{"a write below the first cap", 256 * K, contiguous(10 * K), []uint64{10 * K}, []int{1}},
		{"exactly the first cap", 256 * K, contiguous(256 * K), []uint64{256 * K}, []int{1}},
		{"one byte past the first cap", 256 * K, contiguous(256*K + 1), []uint64{256 * K, 1}, []int{1, 1}},
		{"4 MiB contiguous", 256 * K, contiguous(4 * M), []uint64{256 * K, 512 * K, M, 2 * M, 256 * K}, []int{1, 1, 1, 1, 1}},
		// kv-small: 32 layers × 2 × 4 pages of 16 KiB.
		{"4 MiB of 16 KiB blocks", 256 * K, scattered(256, 16*K), []uint64{256 * K, 512 * K, M, 2 * M, 256 * K}, []int{16, 32, 64, 128, 16}},
		{"40 MiB: the ramp, then full slots", 256 * K, contiguous(40 * M),
			[]uint64{256 * K, 512 * K, M, 2 * M, 4 * M, S, S, S, S, 256 * K}, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
		{"64 KiB first", 64 * K, contiguous(2 * M), []uint64{64 * K, 128 * K, 256 * K, 512 * K, M, 64 * K}, []int{1, 1, 1, 1, 1, 1}},
		{"a first cap that is no power of two", 3 * M, contiguous(20 * M), []uint64{3 * M, 6 * M, S, 3 * M}, []int{1, 1, 1, 1}},
		{"a first cap of one slot is no ramp", S, contiguous(S + 1), []uint64{S, 1}, []int{1, 1}},
		{"a first cap above the slot is no ramp", 2 * S, contiguous(S + 1), []uint64{S, 1}, []int{1, 1}},
		{"a block cut by the ramp keeps its order", 256 * K, scattered(3, 200*K), []uint64{256 * K, 344 * K}, []int{2, 2}},
	}
	var p Plan
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pl := Planner{FirstPiece: tc.first}
			if err := pl.Plan(tc.blocks, 1, &p); err != nil {
				t.Fatal(err)
			}
			if got := pieceLens(&p); !slices.Equal(got, tc.lens) {
				t.Fatalf("piece lengths = %v, want %v", got, tc.lens)
			}
			got := make([]int, len(p.Pieces))
			for i, pc := range p.Pieces {
				got[i] = pc.End - pc.Start
			}
			if !slices.Equal(got, tc.entries) {
				t.Fatalf("entries per piece = %v, want %v", got, tc.entries)
			}
			verifyRampPlan(t, tc.blocks, 1, &p, SlotSize, MaxPlans, tc.first)
		})
	}
}

// TestPlannerRampAndPlanLimit: a Piece cut at 4096 entries before its ramp
// cap still counts as a step of the ramp, and no Piece carries more than
// 4096 entries whatever its cap.
func TestPlannerRampAndPlanLimit(t *testing.T) {
	blocks := make([]Block, 0, 5001)
	for i := range 5000 {
		blocks = append(blocks, Block{Src: uint64(0x1000 + 2*i), Dst: uint64(0x9000 + 3*i), Len: 1})
	}
	blocks = append(blocks, Block{Src: 0x10_0000, Dst: 0x80_0000, Len: 2 << 20})
	pl := Planner{FirstPiece: 64 << 10}
	var p Plan
	if err := pl.Plan(blocks, 1, &p); err != nil {
		t.Fatal(err)
	}
	// Piece 0: 4096 one-byte blocks (cut by entries, under its 64 KiB
	// cap). Piece 1 (cap 128 KiB): the other 904 and 128 KiB - 904 bytes
	// of the big block; then 256 KiB, 512 KiB, 1 MiB and the rest.
	wantLens := []uint64{4096, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2<<20 - (128<<10 - 904) - (256<<10 + 512<<10 + 1<<20)}
	if got := pieceLens(&p); !slices.Equal(got, wantLens) {
		t.Fatalf("piece lengths = %v, want %v", got, wantLens)
	}
	if n := p.Pieces[0].End - p.Pieces[0].Start; n != MaxPlans {
		t.Fatalf("first piece has %d entries, want %d", n, MaxPlans)
	}
	if n := p.Pieces[1].End - p.Pieces[1].Start; n != 905 {
		t.Fatalf("second piece has %d entries, want 905", n)
	}
	verifyRampPlan(t, blocks, 1, &p, SlotSize, MaxPlans, 64<<10)
}

func TestPlannerRampSmallLimits(t *testing.T) {
	pl := Planner{FirstPiece: 2, pieceBytes: 10, maxPlans: 3}
	blocks := []Block{
		{Src: 100, Dst: 200, Len: 3, Task: 0},
		{Src: 300, Dst: 400, Len: 25, Task: 1},
		{Src: 500, Dst: 600, Len: 1, Task: 0},
	}
	var p Plan
	if err := pl.Plan(blocks, 2, &p); err != nil {
		t.Fatal(err)
	}
	// Caps 2, 4, 8, 10, 10: the 29 bytes are 2 + 4 + 8 + 10 + 5.
	wantPieces := []span{{0, 1, 2}, {1, 3, 4}, {3, 4, 8}, {4, 5, 10}, {5, 7, 5}}
	if !slices.Equal(spans(&p), wantPieces) {
		t.Fatalf("pieces = %+v, want %+v", spans(&p), wantPieces)
	}
	wantSlices := []Slice{
		{Task: 0, Src: 100, Dst: 200, Len: 2, Offset: 0},
		{Task: 0, Src: 102, Dst: 202, Len: 1, Offset: 0},
		{Task: 1, Src: 300, Dst: 400, Len: 3, Offset: 1},
		{Task: 1, Src: 303, Dst: 403, Len: 8, Offset: 0},
		{Task: 1, Src: 311, Dst: 411, Len: 10, Offset: 0},
		{Task: 1, Src: 321, Dst: 421, Len: 4, Offset: 0},
		{Task: 0, Src: 500, Dst: 600, Len: 1, Offset: 4, Whole: true},
	}
	if f := flatten(&p, blocks); !slices.Equal(f.Slices, wantSlices) {
		t.Fatalf("slices = %+v\nwant %+v", f.Slices, wantSlices)
	}
	if got := slices.Collect(p.Splits(blocks)); !slices.Equal(got, []int{0, 1, 1, 1}) {
		t.Fatalf("splits = %v, want [0 1 1 1]", got)
	}
	verifyRampPlan(t, blocks, 2, &p, 10, 3, 2)
	// The ramp starts again with each request.
	if err := pl.Plan(blocks[:1], 1, &p); err != nil {
		t.Fatal(err)
	}
	if got := pieceLens(&p); !slices.Equal(got, []uint64{2, 1}) {
		t.Fatalf("second request: piece lengths = %v, want [2 1]", got)
	}
}

func request16KiB(blocks int) []Block {
	b := make([]Block, blocks)
	for i := range b {
		b[i] = Block{
			Src:  0x7f00_0000_0000 + uint64(i)*(16<<10),
			Dst:  0x1_0000_0000 + uint64(i)*(48<<10),
			Len:  16 << 10,
			Task: i,
		}
	}
	return b
}

func TestPlannerWarmAllocs(t *testing.T) {
	for _, first := range []uint64{0, 64 << 10} {
		t.Run(fmt.Sprintf("ramp %d", first), func(t *testing.T) { testPlannerWarmAllocs(t, Planner{FirstPiece: first}) })
	}
}

func testPlannerWarmAllocs(t *testing.T, pl Planner) {
	blocks := request16KiB(20000)
	var p Plan
	if err := pl.Plan(blocks, len(blocks), &p); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(5, func() {
		if err := pl.Plan(blocks, len(blocks), &p); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("warm planner allocates %v times per plan", allocs)
	}
	smaller := blocks[:777]
	allocs = testing.AllocsPerRun(5, func() {
		if err := pl.Plan(smaller, len(smaller), &p); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("warm planner allocates %v times for a smaller plan", allocs)
	}
}

// BenchmarkPlanner5GiB16KiB is P7: a 5 GiB request of 16 KiB blocks, without
// a ramp and with the engine's default one.
func BenchmarkPlanner5GiB16KiB(b *testing.B) {
	blocks := request16KiB(5 << 30 / (16 << 10))
	for _, bc := range []struct {
		name   string
		first  uint64
		pieces int
	}{
		{"full", 0, 640},
		// 256 KiB + 512 KiB + … + 4 MiB (7.75 MiB in 5 Pieces), then 639
		// full slots and the last 0.25 MiB.
		{"ramp256KiB", 256 << 10, 645},
	} {
		b.Run(bc.name, func(b *testing.B) {
			pl := Planner{FirstPiece: bc.first}
			var p Plan
			if err := pl.Plan(blocks, len(blocks), &p); err != nil {
				b.Fatal(err)
			}
			if len(blocks) != 327680 || len(p.Pieces) != bc.pieces {
				b.Fatalf("%d blocks in %d pieces, want 327680 in %d", len(blocks), len(p.Pieces), bc.pieces)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := pl.Plan(blocks, len(blocks), &p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkPlannerContiguous5GiB(b *testing.B) {
	blocks := []Block{{Src: 0x7f00_0000_0000, Dst: 0x1_0000_0000, Len: 5 << 30}}
	var pl Planner
	var p Plan
	if err := pl.Plan(blocks, 1, &p); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := pl.Plan(blocks, 1, &p); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzPlanner decodes three bytes per block: length, task and a shift that
// scales the length. With pieceBytes 0 the real limits apply; otherwise the
// planner uses small ones so that every cut rule fires on short inputs.
func FuzzPlanner(f *testing.F) {
	f.Add([]byte{1, 0, 0}, uint64(0), uint64(0), uint8(0), uint8(0), uint8(1))
	f.Add([]byte{255, 1, 20, 0, 0, 0, 8, 2, 3}, uint64(0x7f00_0000_0000), uint64(0x1000), uint8(0), uint8(0), uint8(3))
	f.Add([]byte{7, 0, 1, 9, 1, 0, 1, 0, 0, 1, 0, 0}, uint64(5), uint64(9), uint8(9), uint8(2), uint8(2))
	f.Add([]byte{16, 0, 0}, uint64(math.MaxUint64-10), uint64(0), uint8(3), uint8(1), uint8(1))
	f.Add([]byte{16, 5, 0}, uint64(0), uint64(0), uint8(3), uint8(1), uint8(2))
	f.Add([]byte{255, 0, 16, 3, 0, 2, 9, 0, 0}, uint64(0x1000), uint64(0x9000), uint8(0), uint8(0x10|1), uint8(1))
	f.Add([]byte{40, 0, 0, 1, 0, 0, 1, 0, 0}, uint64(3), uint64(7), uint8(16), uint8(0x18|2), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, srcBase, dstBase uint64, pieceBytes, maxPlans, taskCount uint8) {
		if len(data) > 3*128 {
			data = data[:3*128]
		}
		tasks := int(taskCount % 16)
		pl := Planner{}
		limitBytes, limitPlans := uint64(SlotSize), MaxPlans
		maxShift := 20
		if pieceBytes != 0 {
			limitBytes, limitPlans = uint64(pieceBytes), int(maxPlans%8)+1
			pl = Planner{pieceBytes: limitBytes, maxPlans: limitPlans}
			maxShift = 3
		}
		// The high bits of maxPlans pick a ramp: none, or a first Piece
		// of 1 to 31 bytes (with small limits) or that many 16 KiB.
		if r := uint64(maxPlans >> 3); r != 0 {
			pl.FirstPiece = r
			if pieceBytes == 0 {
				pl.FirstPiece = r << 14
			}
		}
		var blocks []Block
		firstBad := -1
		src, dst := srcBase, dstBase
		for i := 0; i+3 <= len(data); i += 3 {
			n := uint64(data[i]) << min(int(data[i+2]&31), maxShift)
			b := Block{Src: src, Dst: dst, Len: n, Task: int(data[i+1] % 17)}
			_, srcCarry := bits.Add64(b.Src, b.Len, 0)
			_, dstCarry := bits.Add64(b.Dst, b.Len, 0)
			if firstBad < 0 && (b.Task >= tasks || srcCarry != 0 || dstCarry != 0) {
				firstBad = len(blocks)
			}
			blocks = append(blocks, b)
			src += n + uint64(data[i+2]>>5)
			dst -= n + 1
		}
		var p Plan
		err := pl.Plan(blocks, tasks, &p)
		if firstBad >= 0 {
			if err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("block %d:", firstBad)) {
				t.Fatalf("block %d is invalid (%+v), err = %v", firstBad, blocks[firstBad], err)
			}
			return
		}
		if err != nil {
			t.Fatalf("valid request rejected: %v", err)
		}
		verifyRampPlan(t, blocks, tasks, &p, limitBytes, limitPlans, pl.FirstPiece)
	})
}
