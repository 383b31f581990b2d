// SPDX-License-Identifier: Apache-2.0

package memrange

import (
	"math"
	"testing"
	"unsafe"
)

func TestWithinAndValidRange(t *testing.T) {
	tests := []struct {
		base, size, addr, n uint64
		within              bool
	}{
		{100, 10, 100, 10, true},
		{100, 10, 105, 5, true},
		{100, 10, 110, 0, true},
		{100, 10, 99, 1, false},
		{100, 10, 105, 6, false},
		{100, 10, 111, 0, false},
		{math.MaxUint64 - 9, 10, math.MaxUint64 - 1, 1, true},
		{math.MaxUint64 - 9, 10, math.MaxUint64, 2, false},
		{0, 10, 5, math.MaxUint64, false},
	}
	for _, tt := range tests {
		if got := Within(tt.base, tt.size, tt.addr, tt.n); got != tt.within {
			t.Errorf("Within(%#x, %d, %#x, %d) = %v", tt.base, tt.size, tt.addr, tt.n, got)
		}
	}
	ranges := []struct {
		base, size uint64
		valid      bool
	}{
		{0, 1, true},
		{0, 0, false},
		{math.MaxUint64, 1, true},
		{math.MaxUint64, 2, false},
		{1, math.MaxUint64, true},
		{2, math.MaxUint64, false},
	}
	for _, tt := range ranges {
		if got := ValidRange(tt.base, tt.size); got != tt.valid {
			t.Errorf("ValidRange(%#x, %d) = %v", tt.base, tt.size, got)
		}
	}
}

func TestSpans(t *testing.T) {
	var s Spans
	for i, sp := range []Span{{Start: 300, Size: 100}, {Start: 100, Size: 100}, {Start: 1000, Size: 1}} {
		if s.Overlaps(sp.Start, sp.Size) {
			t.Fatalf("span %d %+v overlaps %+v", i, sp, s)
		}
		sp.Ref = i
		before := s
		s = s.Insert(sp)
		if len(before) == len(s) {
			t.Fatalf("insert did not grow the set")
		}
	}
	for i := 1; i < len(s); i++ {
		if s[i-1].Start >= s[i].Start {
			t.Fatalf("not sorted: %+v", s)
		}
	}
	overlaps := []struct {
		start, size uint64
		want        bool
	}{
		{199, 1, true},
		{200, 100, false},
		{250, 51, true},
		{0, 100, false},
		{0, 101, true},
		{1000, 1, true},
		{1001, math.MaxUint64 - 1001, false},
	}
	for _, tt := range overlaps {
		if got := s.Overlaps(tt.start, tt.size); got != tt.want {
			t.Errorf("Overlaps(%d, %d) = %v", tt.start, tt.size, got)
		}
	}
	finds := []struct {
		addr, n uint64
		ref     int
	}{
		{100, 100, 1},
		{150, 1, 1},
		{199, 2, -1},
		{300, 0, 0},
		{399, 1, 0},
		{400, 1, -1},
		{50, 1, -1},
		{1000, 1, 2},
		{1000, 2, -1},
	}
	for _, tt := range finds {
		i := s.Find(tt.addr, tt.n)
		got := -1
		if i >= 0 {
			got = s[i].Ref
		}
		if got != tt.ref {
			t.Errorf("Find(%d, %d) = span of ref %d, want %d", tt.addr, tt.n, got, tt.ref)
		}
	}
}

func TestBytes(t *testing.T) {
	if Bytes(0, 0) != nil {
		t.Fatal("Bytes of 0 bytes is not nil")
	}
	buf := []byte("hostmem")
	b := Bytes(uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uint64(len(buf)))
	b[0] = 'H'
	if string(buf) != "Hostmem" {
		t.Fatalf("Bytes does not alias the memory: %q", buf)
	}
}
