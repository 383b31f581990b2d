// SPDX-License-Identifier: Apache-2.0

package relay

import "sync"

type tokenKind uint8

const (
	tokDirect tokenKind = iota + 1
	tokFallback
	tokRelay
)

// tokenEntry is what a hop completion finishes: the slice of a task that a
// direct or fallback write carries, or one write of a relayed Piece.
type tokenEntry struct {
	kind  tokenKind
	slice taskSlice
	rec   *inflightRec
}

// tokenTable maps hop tokens to what they complete. It is a slab: a token
// is a slot index (low 32 bits) and the slot's generation (high 32 bits,
// never 0), so adding and taking allocate nothing once the slab has grown
// to the most tokens ever outstanding. A slot's generation changes every
// time it is taken, so a late or repeated completion finds nothing and
// finishes nothing twice, unless it comes back after 2^32 further uses of
// the same slot.
type tokenTable struct {
	mu    sync.Mutex
	slots []tokenSlot
	free  []uint32
	live  int
}

type tokenSlot struct {
	gen uint32
	ent tokenEntry
}

func (t *tokenTable) add(e tokenEntry) uint64 {
	t.mu.Lock()
	var i uint32
	if n := len(t.free); n > 0 {
		i = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		i = uint32(len(t.slots))
		t.slots = append(t.slots, tokenSlot{gen: 1})
	}
	s := &t.slots[i]
	s.ent = e
	t.live++
	tok := uint64(s.gen)<<32 | uint64(i)
	t.mu.Unlock()
	return tok
}

func (t *tokenTable) take(tok uint64) (tokenEntry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.find(tok)
	if !ok {
		return tokenEntry{}, false
	}
	e := t.slots[i].ent
	t.release(i)
	return e, true
}

// find is the slot of tok while it is out. t.mu is held.
func (t *tokenTable) find(tok uint64) (uint32, bool) {
	i, gen := uint32(tok), uint32(tok>>32)
	if int(i) >= len(t.slots) {
		return 0, false
	}
	s := &t.slots[i]
	return i, s.gen == gen && s.ent.kind != 0
}

// peek returns what tok stands for, if it is still out, and leaves it out.
func (t *tokenTable) peek(tok uint64) (tokenEntry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.find(tok)
	if !ok {
		return tokenEntry{}, false
	}
	return t.slots[i].ent, true
}

// release frees slot i. t.mu is held.
func (t *tokenTable) release(i uint32) {
	s := &t.slots[i]
	s.ent = tokenEntry{}
	s.gen++
	if s.gen == 0 {
		s.gen = 1
	}
	t.free = append(t.free, i)
	t.live--
}

func (t *tokenTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live
}

// takeAll removes every outstanding entry and returns them.
func (t *tokenTable) takeAll() []tokenEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []tokenEntry
	for i := range t.slots {
		if t.slots[i].ent.kind != 0 {
			out = append(out, t.slots[i].ent)
			t.release(uint32(i))
		}
	}
	return out
}
