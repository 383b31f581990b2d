// SPDX-License-Identifier: Apache-2.0

package main

/*
#cgo CFLAGS: -I${SRCDIR} -I${SRCDIR}/../../include
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pxn-project/pxn/pkg/staging"
)

// cArena is the engine's staging arena as the host's transport sees it: a
// staging.MemoryRegistrar over the host's register_arena and
// deregister_arena callbacks (none: the arena is only recorded), called
// once for each lane of the arena, and again for a lane given new memory,
// and what the hop needs to mark a second-hop op, whose source lies in
// the arena, with the key of its lane's registration.
type cArena struct {
	regFn   C.pxn_register_arena_fn
	deregFn C.pxn_deregister_arena_fn
	// user is the host's context pointer, kept as an integer.
	user C.uintptr_t
	kind int

	// lanes are the ranges registered, one a lane, written under mu by
	// Register and Deregister and read by the pump's hop submits.
	lanes [staging.LaneCount]arenaRange

	// busy counts the second-hop ops the host's transport still holds
	// (nil: none are tracked). Once closing is set (the engine is
	// closing), no range is deregistered while it is above zero, so the
	// arena is not freed either. Before that a lane is deregistered only
	// for its new memory, which the relay puts in place once no op that
	// reads the lane is held.
	busy    func() int64
	closing atomic.Bool

	mu sync.Mutex
}

// arenaRange is one registered range of the arena: base is stored last
// by Register and first (as 0) by Deregister, so a reader that sees a
// base sees its size and key.
type arenaRange struct {
	base   atomic.Uintptr
	size   atomic.Uint64
	key    atomic.Uint64
	hasKey atomic.Bool
}

var _ staging.MemoryRegistrar = (*cArena)(nil)

func (a *cArena) Register(base uintptr, size uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var free *arenaRange
	for i := range a.lanes {
		r := &a.lanes[i]
		switch b := r.base.Load(); {
		case b == base:
			return fmt.Errorf("libpxn: staging arena range %#x+%d registered twice", base, size)
		case b == 0 && free == nil:
			free = r
		}
	}
	if free == nil {
		return fmt.Errorf("libpxn: staging arena range %#x+%d: %d ranges are registered already, one a lane", base, size, len(a.lanes))
	}
	free.hasKey.Store(false)
	if a.regFn != nil {
		var key C.uint64_t
		rc := int32(C.pxnlib_call_register_arena(a.regFn, a.user, C.uintptr_t(base), C.uint64_t(size), C.int(a.kind), &key))
		if rc != codeOK {
			return &transportError{code: rc, msg: fmt.Sprintf("register_arena refused the staging arena %#x+%d; this rank does not relay", base, size)}
		}
		free.key.Store(uint64(key))
		free.hasKey.Store(true)
	}
	free.size.Store(size)
	free.base.Store(base)
	return nil
}

func (a *cArena) Deregister(base uintptr, size uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var r *arenaRange
	for i := range a.lanes {
		if a.lanes[i].base.Load() == base && a.lanes[i].size.Load() == size {
			r = &a.lanes[i]
		}
	}
	if base == 0 || r == nil {
		return fmt.Errorf("libpxn: deregister of %#x+%d, which is not a registered range of the arena", base, size)
	}
	// The registry keeps an arena it could not deregister allocated until
	// the process exits: a close whose drain ran out must not free memory
	// that a work request the host still holds may read.
	if a.busy != nil && a.closing.Load() {
		if n := a.busy(); n > 0 {
			return fmt.Errorf("libpxn: staging arena range %#x+%d stays registered: the host's transport still holds %d ops that may read the arena", base, size, n)
		}
	}
	r.base.Store(0)
	r.size.Store(0)
	if a.deregFn == nil {
		return nil
	}
	key := r.key.Load()
	r.hasKey.Store(false)
	if rc := int32(C.pxnlib_call_deregister_arena(a.deregFn, a.user, C.uintptr_t(base), C.uint64_t(size), C.uint64_t(key))); rc != codeOK {
		return &transportError{code: rc, msg: fmt.Sprintf("deregister_arena of the staging arena range %#x+%d failed", base, size)}
	}
	return nil
}

// holds reports whether [src, src+n) lies in one registered range of the
// arena, and that range's key.
func (a *cArena) holds(src uintptr, n uint64) (key uint64, hasKey, in bool) {
	if a == nil {
		return 0, false, false
	}
	for i := range a.lanes {
		r := &a.lanes[i]
		base := r.base.Load()
		if base == 0 || src < base {
			continue
		}
		size := r.size.Load()
		if uint64(src-base) > size || n > size-uint64(src-base) {
			continue
		}
		return r.key.Load(), r.hasKey.Load(), true
	}
	return 0, false, false
}

// cRoute is a route handle the host's directory returned, as the relay
// carries it in WriteOp.Route.
type cRoute uint64

// routeBook holds the route handle the host's directory gave last for each
// session: the hop's relay.Router answers from it when the relay's route
// cache first meets the session, right after the relay resolved it.
type routeBook struct {
	mu sync.Mutex
	m  map[string]uint64
}

// maxRouteBook bounds the sessions a routeBook remembers.
const maxRouteBook = 4096

func (b *routeBook) set(session string, route uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if route == 0 {
		delete(b.m, session)
		return
	}
	if b.m == nil {
		b.m = make(map[string]uint64)
	}
	if _, ok := b.m[session]; !ok && len(b.m) >= maxRouteBook {
		clear(b.m)
	}
	b.m[session] = route
}

func (b *routeBook) get(session string) (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.m[session]
	return r, ok
}

func (b *routeBook) forget(session string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, session)
}
