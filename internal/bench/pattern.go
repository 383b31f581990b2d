// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
)

// patternWord is the 64-bit word at word index i of the source buffer of a
// rank seeded with seed. Every word is computed alone, so a target can check
// any range without the sender's buffer.
func patternWord(seed, i uint64) uint64 {
	z := seed*0x9e3779b97f4a7c15 + i*0xbf58476d1ce4e5b9 + 1
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// fillPattern writes the pattern of seed for source offsets
// [off, off+len(b)) into b.
func fillPattern(b []byte, seed, off uint64) {
	for i := range b {
		pos := off + uint64(i)
		if pos%8 == 0 && i+8 <= len(b) {
			binary.LittleEndian.PutUint64(b[i:], patternWord(seed, pos/8))
			continue
		}
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], patternWord(seed, pos/8))
		b[i] = w[pos%8]
	}
}

// fillPatternFast fills a whole buffer from offset 0.
func fillPatternFast(b []byte, seed uint64) {
	n := len(b) &^ 7
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], patternWord(seed, uint64(i/8)))
	}
	fillPattern(b[n:], seed, uint64(n))
}

// checkPattern compares b with the pattern of seed at source offset off and
// returns the first mismatch.
func checkPattern(b []byte, seed, off uint64) error { return comparePattern(b, seed, off, false) }

// checkOwnOrNone checks the destination of a write that did not complete:
// each byte is the pattern of seed at source offset off, or zero (the
// destination was cleared before the round); any other byte is some other
// write's.
func checkOwnOrNone(b []byte, seed, off uint64) error { return comparePattern(b, seed, off, true) }

func comparePattern(b []byte, seed, off uint64, zeroOK bool) error {
	const chunk = 1 << 20
	want := make([]byte, chunk)
	for start := 0; start < len(b); start += chunk {
		n := min(chunk, len(b)-start)
		fillPattern(want[:n], seed, off+uint64(start))
		for i := 0; i < n; i++ {
			got := b[start+i]
			if got == want[i] || zeroOK && got == 0 {
				continue
			}
			if zeroOK {
				return fmt.Errorf("byte %d (source offset %d, seed %d): got %#x, neither its own %#x nor untouched", start+i, off+uint64(start+i), seed, got, want[i])
			}
			return fmt.Errorf("byte %d (source offset %d, seed %d): got %#x, want %#x", start+i, off+uint64(start+i), seed, got, want[i])
		}
	}
	return nil
}

// parallel runs fn over [0, n) in pieces of step bytes on every CPU and
// returns the first error.
func parallel(n, step uint64, fn func(a, e uint64) error) error {
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for a := uint64(0); a < n; a += step {
		e := min(a+step, n)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(a, e); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}
