// Package hosthop holds the CPU-only implementations of the engine's
// dependencies: a host-memory Copier that stands in for the NVLink first hop,
// an in-process Loopback hop and a TCP hop that stand in for RDMA, and a
// static Directory of target sessions.
package hosthop

import (
	"errors"
	"math"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/relay"
)

var (
	// ErrClosed is returned by a copier or hop that has been closed.
	ErrClosed = errors.New("hosthop: closed")
	// ErrUnknownSession means that a target session is not registered.
	ErrUnknownSession = errors.New("hosthop: unknown target session")
	// ErrOutOfRange means that a destination lies outside every registered
	// range of its target.
	ErrOutOfRange = errors.New("hosthop: destination outside registered memory")
	// ErrStaleRoute is wrapped by the completion of an op whose route
	// handle the hop does not honour: one issued by another hop or for
	// another session, or one retired since its target was removed or
	// moved. The op is not performed.
	ErrStaleRoute = errors.New("hosthop: route handle not honoured")
)

// bytesAt returns the n bytes at addr. The caller guarantees that the memory
// stays mapped, and reachable if it is Go memory, while the slice is in use.
// The conversion goes through memory rather than unsafe.Pointer(addr) because
// addr is a foreign address (mmap'd shared memory or a caller's buffer), not
// the result of pointer arithmetic on a Go pointer.
func bytesAt(addr uintptr, n uint64) []byte {
	if n == 0 {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// within reports whether [addr, addr+n) lies in [base, base+size), without
// overflow.
func within(base, size, addr, n uint64) bool {
	return addr >= base && addr-base <= size && n <= size-(addr-base)
}

// validRange reports whether [base, base+size) is a non-empty range whose last
// byte is addressable.
func validRange(base, size uint64) bool {
	return size > 0 && size-1 <= math.MaxUint64-base
}

// span is one registered range; ref indexes the owner's per-range data.
type span struct {
	start, size uint64
	ref         int
}

// spans is sorted by start and never overlaps. It is copied on insert, so a
// reader that took the slice under a lock may keep using it.
type spans []span

// find returns the index of the span holding [addr, addr+n), or -1.
func (s spans) find(addr, n uint64) int {
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s[m].start <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	i := lo - 1
	if i < 0 || !within(s[i].start, s[i].size, addr, n) {
		return -1
	}
	return i
}

// overlaps reports whether [start, start+size) shares a byte with a span.
func (s spans) overlaps(start, size uint64) bool {
	last := start + (size - 1)
	for _, x := range s {
		if start <= x.start+(x.size-1) && x.start <= last {
			return true
		}
	}
	return false
}

// insert returns a new sorted slice holding s and sp. sp must be valid and
// must not overlap s.
func (s spans) insert(sp span) spans {
	out := make(spans, 0, len(s)+1)
	i := 0
	for i < len(s) && s[i].start < sp.start {
		i++
	}
	out = append(out, s[:i]...)
	out = append(out, sp)
	return append(out, s[i:]...)
}

// pollInto moves up to len(out) completions from the front of *done into out.
func pollInto(out []relay.HopCompletion, done *[]relay.HopCompletion) int {
	n := copy(out, *done)
	rest := copy(*done, (*done)[n:])
	clear((*done)[rest:])
	*done = (*done)[:rest]
	return n
}
