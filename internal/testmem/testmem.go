// SPDX-License-Identifier: Apache-2.0

// Package testmem has the memory helpers that the host copier's and the
// simulated fabric's tests share: mmap'd buffers outside the Go heap, seeded
// patterns, and polling with a deadline.
package testmem

import (
	"bytes"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// Mapped returns n bytes of anonymous mmap'd memory, outside the Go heap like
// the arenas and control files the engine hands to a copier or hop.
func Mapped(tb testing.TB, n int) []byte {
	tb.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		tb.Fatalf("mmap %d bytes: %v", n, err)
	}
	tb.Cleanup(func() {
		if err := syscall.Munmap(b); err != nil {
			tb.Errorf("munmap: %v", err)
		}
	})
	return b
}

// Addr is the address of b's first byte.
func Addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// Fill writes a pseudo-random pattern chosen by seed, a word at a time where
// b is aligned (the race detector checks every access).
func Fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	i := 0
	if len(b) >= 8 && Addr(b)%8 == 0 {
		words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
		for j := range words {
			words[j] = r.Uint64()
		}
		i = len(words) * 8
	}
	for ; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

// Eventually polls cond until it holds or the deadline passes.
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// FirstDiff returns the first index where a and b differ, or -1.
func FirstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
