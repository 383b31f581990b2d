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

// verifyPlan checks p against blocks from first principles: Pieces tile the
// slices in order and respect both limits, every Piece but the last is full,
// offsets are contiguous from 0, entries and copies mirror the slices, and
// walking the slices in order rebuilds every block exactly.
func verifyPlan(t testing.TB, blocks []Block, tasks int, p *Plan, limitBytes uint64, limitPlans int) {
	t.Helper()
	if len(p.Entries) != len(p.Slices) || len(p.Copies) != len(p.Slices) {
		t.Fatalf("%d slices, %d entries, %d copies", len(p.Slices), len(p.Entries), len(p.Copies))
	}
	next := 0
	for i, pc := range p.Pieces {
		if pc.Start != next || pc.End <= pc.Start {
			t.Fatalf("piece %d spans [%d, %d), want a non-empty range from %d", i, pc.Start, pc.End, next)
		}
		n := pc.End - pc.Start
		if n > limitPlans || pc.Len > limitBytes {
			t.Fatalf("piece %d: %d entries, %d bytes; limits %d, %d", i, n, pc.Len, limitPlans, limitBytes)
		}
		var off uint64
		for j := pc.Start; j < pc.End; j++ {
			s := p.Slices[j]
			if s.Len == 0 || s.Offset != off {
				t.Fatalf("piece %d slice %d: len %d offset %d, want len > 0 at offset %d", i, j, s.Len, s.Offset, off)
			}
			if p.Entries[j] != (PlanEntry{Dst: s.Dst, Len: s.Len}) {
				t.Fatalf("entry %d = %+v, slice %+v", j, p.Entries[j], s)
			}
			if p.Copies[j] != (CopyEntry{Src: s.Src, Offset: s.Offset, Len: s.Len}) {
				t.Fatalf("copy %d = %+v, slice %+v", j, p.Copies[j], s)
			}
			off += s.Len
		}
		if off != pc.Len {
			t.Fatalf("piece %d: len %d, slices sum to %d", i, pc.Len, off)
		}
		if i < len(p.Pieces)-1 && pc.Len != limitBytes && n != limitPlans {
			t.Fatalf("piece %d of %d is not full: %d bytes, %d entries", i, len(p.Pieces), pc.Len, n)
		}
		if !slices.Equal(p.PieceSlices(i), p.Slices[pc.Start:pc.End]) {
			t.Fatalf("PieceSlices(%d) differs from its range", i)
		}
		next = pc.End
	}
	if next != len(p.Slices) {
		t.Fatalf("pieces cover %d of %d slices", next, len(p.Slices))
	}

	want := make([]TaskTotals, tasks)
	var total uint64
	j := 0
	for bi, b := range blocks {
		want[b.Task].Blocks++
		want[b.Task].Bytes += b.Len
		total += b.Len
		src, dst, left := b.Src, b.Dst, b.Len
		for left > 0 {
			if j >= len(p.Slices) {
				t.Fatalf("block %d: slices end with %d bytes left", bi, left)
			}
			s := p.Slices[j]
			if s.Task != b.Task || s.Src != src || s.Dst != dst || s.Len > left {
				t.Fatalf("block %d (%+v): slice %d = %+v, want task %d src %#x dst %#x len ≤ %d", bi, b, j, s, b.Task, src, dst, left)
			}
			want[b.Task].Slices++
			src += s.Len
			dst += s.Len
			left -= s.Len
			j++
		}
	}
	if j != len(p.Slices) {
		t.Fatalf("blocks use %d of %d slices", j, len(p.Slices))
	}
	if !slices.Equal(p.Tasks, want) {
		t.Fatalf("tasks = %+v, want %+v", p.Tasks, want)
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
		if e := p.PieceEntries(i)[0]; e.Dst != blocks[0].Dst+uint64(i)*SlotSize {
			t.Fatalf("piece %d goes to %#x", i, e.Dst)
		}
	}
	if p.Tasks[0] != (TaskTotals{Blocks: 1, Slices: 640, Bytes: 5 << 30}) {
		t.Fatalf("task 0 = %+v", p.Tasks[0])
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
		s := p.PieceSlices(i)
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
	want := []TaskTotals{
		{Blocks: 2, Slices: 0, Bytes: 0},
		{Blocks: 3, Slices: 2, Bytes: 150},
		{},
	}
	if !slices.Equal(p.Tasks, want) {
		t.Fatalf("tasks = %+v, want %+v", p.Tasks, want)
	}
	if len(p.Pieces) != 1 || len(p.Slices) != 2 || p.Pieces[0].Len != 150 {
		t.Fatalf("pieces %+v, slices %+v", p.Pieces, p.Slices)
	}
	verifyPlan(t, blocks, 3, &p, SlotSize, MaxPlans)

	onlyZero := []Block{{Len: 0, Task: 1}, {Src: 4, Dst: 8, Len: 0, Task: 1}}
	if err := pl.Plan(onlyZero, 2, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Pieces) != 0 || len(p.Slices) != 0 || p.Bytes != 0 {
		t.Fatalf("zero-length request planned %d pieces, %d slices, %d bytes", len(p.Pieces), len(p.Slices), p.Bytes)
	}
	if p.Tasks[1] != (TaskTotals{Blocks: 2}) {
		t.Fatalf("task 1 = %+v, want 2 blocks and nothing to stage", p.Tasks[1])
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
	if !slices.Equal(p.PieceEntries(0), want) {
		t.Fatalf("entries = %+v, want %+v", p.PieceEntries(0), want)
	}
	wantCopies := []CopyEntry{{Src: 0x1000, Offset: 0, Len: 0x100}, {Src: 0x1100, Offset: 0x100, Len: 0x100}, {Src: 0x1200, Offset: 0x200, Len: 0x100}}
	if !slices.Equal(p.PieceCopies(0), wantCopies) {
		t.Fatalf("copies = %+v, want %+v", p.PieceCopies(0), wantCopies)
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
			if len(p.Pieces)+len(p.Slices)+len(p.Entries)+len(p.Copies)+len(p.Tasks) != 0 || p.Bytes != 0 {
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
	wantPieces := []Piece{{0, 2, 10}, {2, 3, 10}, {3, 5, 10}, {5, 8, 3}, {8, 9, 2}}
	if !slices.Equal(p.Pieces, wantPieces) {
		t.Fatalf("pieces = %+v, want %+v", p.Pieces, wantPieces)
	}
	wantSlices := []Slice{
		{Task: 0, Src: 100, Dst: 200, Len: 4, Offset: 0},
		{Task: 1, Src: 300, Dst: 400, Len: 6, Offset: 4},
		{Task: 1, Src: 306, Dst: 406, Len: 10, Offset: 0},
		{Task: 1, Src: 316, Dst: 416, Len: 9, Offset: 0},
		{Task: 0, Src: 500, Dst: 600, Len: 1, Offset: 9},
		{Task: 2, Src: 700, Dst: 800, Len: 1, Offset: 0},
		{Task: 2, Src: 900, Dst: 1000, Len: 1, Offset: 1},
		{Task: 2, Src: 1100, Dst: 1200, Len: 1, Offset: 2},
		{Task: 0, Src: 1300, Dst: 1400, Len: 2, Offset: 0},
	}
	if !slices.Equal(p.Slices, wantSlices) {
		t.Fatalf("slices = %+v\nwant %+v", p.Slices, wantSlices)
	}
	verifyPlan(t, blocks, 3, &p, 10, 3)
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
	blocks := request16KiB(20000)
	var pl Planner
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

func BenchmarkPlanner5GiB16KiB(b *testing.B) {
	blocks := request16KiB(5 << 30 / (16 << 10))
	var pl Planner
	var p Plan
	if err := pl.Plan(blocks, len(blocks), &p); err != nil {
		b.Fatal(err)
	}
	if len(blocks) != 327680 || len(p.Pieces) != 640 {
		b.Fatalf("%d blocks in %d pieces, want 327680 in 640", len(blocks), len(p.Pieces))
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := pl.Plan(blocks, len(blocks), &p); err != nil {
			b.Fatal(err)
		}
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
		verifyPlan(t, blocks, tasks, &p, limitBytes, limitPlans)
	})
}
