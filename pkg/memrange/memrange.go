// SPDX-License-Identifier: Apache-2.0

// Package memrange holds the address arithmetic that the host copier and the
// host stand-ins share: foreign addresses as byte slices, range checks that
// cannot overflow, and a sorted set of non-overlapping ranges.
package memrange

import (
	"math"
	"unsafe"
)

// Bytes returns the n bytes at addr. The caller guarantees that the memory
// stays mapped, and reachable if it is Go memory, while the slice is in use.
// The conversion goes through memory rather than unsafe.Pointer(addr) because
// addr is a foreign address (mmap'd shared memory or a caller's buffer), not
// the result of pointer arithmetic on a Go pointer.
func Bytes(addr uintptr, n uint64) []byte {
	if n == 0 {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// Within reports whether [addr, addr+n) lies in [base, base+size), without
// overflow.
func Within(base, size, addr, n uint64) bool {
	return addr >= base && addr-base <= size && n <= size-(addr-base)
}

// ValidRange reports whether [base, base+size) is a non-empty range whose
// last byte is addressable.
func ValidRange(base, size uint64) bool {
	return size > 0 && size-1 <= math.MaxUint64-base
}

// Span is one registered range; Ref indexes the owner's per-range data.
type Span struct {
	Start, Size uint64
	Ref         int
}

// Spans is sorted by Start and never overlaps. It is copied on Insert, so a
// reader that took the slice under a lock may keep using it.
type Spans []Span

// Find returns the index of the span holding [addr, addr+n), or -1.
func (s Spans) Find(addr, n uint64) int {
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s[m].Start <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	i := lo - 1
	if i < 0 || !Within(s[i].Start, s[i].Size, addr, n) {
		return -1
	}
	return i
}

// Overlaps reports whether [start, start+size) shares a byte with a span.
func (s Spans) Overlaps(start, size uint64) bool {
	last := start + (size - 1)
	for _, x := range s {
		if start <= x.Start+(x.Size-1) && x.Start <= last {
			return true
		}
	}
	return false
}

// Insert returns a new sorted slice holding s and sp. sp must be valid and
// must not overlap s.
func (s Spans) Insert(sp Span) Spans {
	out := make(Spans, 0, len(s)+1)
	i := 0
	for i < len(s) && s[i].Start < sp.Start {
		i++
	}
	out = append(out, s[:i]...)
	out = append(out, sp)
	return append(out, s[i:]...)
}
