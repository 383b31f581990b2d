package relay

import "sync"

type tokenKind uint8

const (
	tokDirect tokenKind = iota + 1
	tokFallback
	tokRelay
)

// tokenEntry is what a hop completion finishes: a direct or fallback slice,
// or one write of a relayed Piece.
type tokenEntry struct {
	kind  tokenKind
	slice *slice
	rec   *inflightRec
}

// tokenTable maps hop tokens to what they complete. Tokens are never reused,
// so a late or repeated completion finds nothing and finishes nothing twice.
type tokenTable struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]tokenEntry
}

func (t *tokenTable) init() { t.m = make(map[uint64]tokenEntry) }

func (t *tokenTable) add(e tokenEntry) uint64 {
	t.mu.Lock()
	t.next++
	tok := t.next
	t.m[tok] = e
	t.mu.Unlock()
	return tok
}

func (t *tokenTable) take(tok uint64) (tokenEntry, bool) {
	t.mu.Lock()
	e, ok := t.m[tok]
	if ok {
		delete(t.m, tok)
	}
	t.mu.Unlock()
	return e, ok
}

func (t *tokenTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// finishToken applies one hop completion.
func (e *Engine) finishToken(ent tokenEntry, err error) {
	switch ent.kind {
	case tokDirect, tokFallback:
		ent.slice.finish(err)
	case tokRelay:
		e.finishRelayWrite(ent.rec, err)
	}
}
