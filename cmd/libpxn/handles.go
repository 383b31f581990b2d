// SPDX-License-Identifier: Apache-2.0

package main

import (
	"sync"
	"sync/atomic"
)

// handleTable maps the integer handles a C caller holds to engines. Engine
// and batch handles come from one counter and are never reused, so a stale
// handle, or one of the wrong kind, finds nothing. It is the library's only
// package-level state: a C caller has nothing else to hold it by.
type handleTable struct {
	next    atomic.Uint64
	mu      sync.RWMutex
	engines map[uint64]*engine
}

var handles = handleTable{engines: make(map[uint64]*engine)}

func (t *handleTable) newID() uint64 { return t.next.Add(1) }

func (t *handleTable) add(e *engine) uint64 {
	id := t.newID()
	t.mu.Lock()
	t.engines[id] = e
	t.mu.Unlock()
	return id
}

// remove takes engine id out of the table; later lookups fail.
func (t *handleTable) remove(id uint64) (*engine, error) {
	t.mu.Lock()
	e := t.engines[id]
	delete(t.engines, id)
	t.mu.Unlock()
	if e == nil {
		return nil, fail(codeInvalid, "engine handle %d is not open", id)
	}
	return e, nil
}

// with runs f on engine id while holding it open: pxn_close waits for f to
// return, and f never sees a closed engine.
func (t *handleTable) with(id uint64, f func(e *engine) error) error {
	t.mu.RLock()
	e := t.engines[id]
	t.mu.RUnlock()
	if e == nil {
		return fail(codeInvalid, "engine handle %d is not open", id)
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return fail(codeInvalid, "engine handle %d is not open", id)
	}
	return f(e)
}
