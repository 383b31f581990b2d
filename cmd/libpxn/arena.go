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
// deregister_arena callbacks (none: the arena is only recorded), and what
// the hop needs to mark a second-hop op, whose source lies in the arena,
// with the arena's key.
type cArena struct {
	regFn   C.pxn_register_arena_fn
	deregFn C.pxn_deregister_arena_fn
	// user is the host's context pointer, kept as an integer.
	user C.uintptr_t
	kind int

	// base and size are set by Register before any peer can send to this
	// rank, and read by the pump's hop submits; hasKey says key came from
	// the host.
	base   atomic.Uintptr
	size   atomic.Uint64
	key    atomic.Uint64
	hasKey atomic.Bool

	// busy counts the second-hop ops the host's transport still holds
	// (nil: none are tracked). While it is above zero the arena is neither
	// deregistered nor freed.
	busy func() int64

	mu         sync.Mutex
	registered bool
}

var _ staging.MemoryRegistrar = (*cArena)(nil)

func (a *cArena) Register(base uintptr, size uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.registered {
		return fmt.Errorf("libpxn: staging arena registered twice (%#x+%d)", base, size)
	}
	if a.regFn != nil {
		var key C.uint64_t
		rc := int32(C.pxnlib_call_register_arena(a.regFn, a.user, C.uintptr_t(base), C.uint64_t(size), C.int(a.kind), &key))
		if rc != codeOK {
			return &transportError{code: rc, msg: fmt.Sprintf("register_arena refused the staging arena %#x+%d; this rank does not relay", base, size)}
		}
		a.key.Store(uint64(key))
		a.hasKey.Store(true)
	}
	a.size.Store(size)
	a.base.Store(base)
	a.registered = true
	return nil
}

func (a *cArena) Deregister(base uintptr, size uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.registered || a.base.Load() != base || a.size.Load() != size {
		return fmt.Errorf("libpxn: deregister of %#x+%d, which is not the registered arena", base, size)
	}
	// The registry keeps an arena it could not deregister allocated until
	// the process exits: a close whose drain ran out must not free memory
	// that a work request the host still holds may read.
	if a.busy != nil {
		if n := a.busy(); n > 0 {
			return fmt.Errorf("libpxn: staging arena %#x+%d stays registered: the host's transport still holds %d ops that may read it", base, size, n)
		}
	}
	a.registered = false
	a.base.Store(0)
	a.size.Store(0)
	if a.deregFn == nil {
		return nil
	}
	key := a.key.Load()
	a.hasKey.Store(false)
	if rc := int32(C.pxnlib_call_deregister_arena(a.deregFn, a.user, C.uintptr_t(base), C.uint64_t(size), C.uint64_t(key))); rc != codeOK {
		return &transportError{code: rc, msg: fmt.Sprintf("deregister_arena of the staging arena %#x+%d failed", base, size)}
	}
	return nil
}

// holds reports whether [src, src+n) lies in the arena, and its key.
func (a *cArena) holds(src uintptr, n uint64) (key uint64, hasKey, in bool) {
	if a == nil {
		return 0, false, false
	}
	base, size := a.base.Load(), a.size.Load()
	if base == 0 || src < base || uint64(src-base) > size || n > size-uint64(src-base) {
		return 0, false, false
	}
	return a.key.Load(), a.hasKey.Load(), true
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
