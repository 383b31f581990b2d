// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
)

// engine is what one engine handle stands for: the relay engine and what the
// C side added around it.
type engine struct {
	// mu is read-held by every call on the engine and write-held by close,
	// so close waits for calls in progress and frees nothing under them.
	mu      sync.RWMutex
	closed  bool
	closing atomic.Bool

	eng   *relay.Engine
	first *firstHop
	// arena is the staging arena's registration with the host's NIC.
	arena *cArena
	// abi is the ABI the host was built against.
	abi hostABI
	// maxBatches bounds batches; reserved counts submits between their
	// check and their insertion into batches.
	maxBatches int
	reserved   int
	// table is the directory when the host registers its targets; nil when
	// a resolve callback is the directory.
	table *tableDirectory
	// release frees the C memory behind the hop and the directory; it runs
	// once the relay engine has stopped calling them.
	release func()

	sessions interner

	batchMu sync.RWMutex
	batches map[uint64]*relay.Batch

	// reqMu guards reqBufs: request vectors lent to pxn_submit, so that a
	// steady stream of submits converts C requests without allocating.
	reqMu   sync.Mutex
	reqBufs [][]relay.Request
}

// requests lends a vector of n zeroed requests; give it back with
// putRequests once Submit has returned (Submit keeps nothing of it).
func (e *engine) requests(n int) []relay.Request {
	e.reqMu.Lock()
	var v []relay.Request
	if k := len(e.reqBufs); k > 0 {
		v = e.reqBufs[k-1]
		e.reqBufs[k-1] = nil
		e.reqBufs = e.reqBufs[:k-1]
	}
	e.reqMu.Unlock()
	if cap(v) < n {
		return make([]relay.Request, n)
	}
	v = v[:n]
	clear(v)
	return v
}

// maxLentRequests bounds the request vectors kept for reuse, in all.
const maxLentRequests = 1 << 16

func (e *engine) putRequests(v []relay.Request) {
	clear(v)
	e.reqMu.Lock()
	defer e.reqMu.Unlock()
	kept := 0
	for _, b := range e.reqBufs {
		kept += cap(b)
	}
	if len(e.reqBufs) < 16 && kept+cap(v) <= maxLentRequests {
		e.reqBufs = append(e.reqBufs, v[:0])
	}
}

// engineSetup is what openEngine hands to newEngine.
type engineSetup struct {
	first      *firstHop
	arena      *cArena
	table      *tableDirectory
	release    func()
	abi        hostABI
	maxBatches int
}

func newEngine(eng *relay.Engine, s engineSetup) *engine {
	return &engine{eng: eng, first: s.first, arena: s.arena, table: s.table, release: s.release, abi: s.abi,
		maxBatches: s.maxBatches, batches: make(map[uint64]*relay.Batch)}
}

// Memory kinds as pxn_register_memory names them.
const (
	memHost   = 0
	memDevice = 1
)

func (e *engine) registerMemory(addr uintptr, n uint64, kind int) error {
	if addr == 0 || n == 0 {
		return fail(codeInvalid, "memory range %#x+%d is empty", addr, n)
	}
	switch kind {
	case memHost:
		// Host memory is what unregistered memory already counts as.
		return nil
	case memDevice:
		if err := e.first.mem.RegisterDevice(addr, n); err != nil {
			return fail(codeInvalid, "register device memory: %w", err)
		}
		return nil
	}
	return fail(codeInvalid, "unknown memory kind %d; want PXN_MEM_HOST or PXN_MEM_DEVICE", kind)
}

func (e *engine) registerTarget(session, hca string, base, n, route, key uint64) error {
	if e.table == nil {
		return fail(codeInvalid, "this engine resolves targets through its resolve callback; pxn_register_target is not used")
	}
	if err := e.table.register(session, hca, base, n, route, key); err != nil {
		return err
	}
	if route != 0 {
		// A cached route of the session carries the handle it had.
		e.eng.InvalidateTarget(session)
	}
	return nil
}

func (e *engine) unregisterTarget(session string) error {
	if e.table == nil {
		return fail(codeInvalid, "this engine resolves targets through its resolve callback; pxn_unregister_target is not used")
	}
	if err := e.table.unregister(session); err != nil {
		return err
	}
	// The relay must not go on forwarding to what the host has forgotten.
	e.eng.InvalidateTarget(session)
	return nil
}

// submit starts reqs and returns the new batch's handle.
func (e *engine) submit(reqs []relay.Request) (uint64, error) {
	if e.closing.Load() {
		return 0, fail(codeClosed, "engine is closing")
	}
	e.batchMu.Lock()
	if live := len(e.batches) + e.reserved; live >= e.maxBatches {
		e.batchMu.Unlock()
		return 0, fail(codeTooMany, "the engine holds %d live batches, its max_batches; free every batch whose tasks are final with pxn_free_batch", live)
	}
	e.reserved++
	e.batchMu.Unlock()
	b, err := e.eng.Submit(reqs)
	e.batchMu.Lock()
	e.reserved--
	if err == nil {
		id := handles.newID()
		e.batches[id] = b
		e.batchMu.Unlock()
		return id, nil
	}
	e.batchMu.Unlock()
	return 0, err
}

// liveBatches counts the batches not yet freed.
func (e *engine) liveBatches() int {
	e.batchMu.RLock()
	defer e.batchMu.RUnlock()
	return len(e.batches)
}

func (e *engine) batch(id uint64) (*relay.Batch, error) {
	e.batchMu.RLock()
	b := e.batches[id]
	e.batchMu.RUnlock()
	if b == nil {
		return nil, fail(codeInvalid, "batch handle %d is not a live batch of this engine", id)
	}
	return b, nil
}

// status reports task i of batch id. Without a pump, nothing else polls the
// transport, so it polls first.
func (e *engine) status(id uint64, i uint64) (relay.TaskStatus, error) {
	b, err := e.batch(id)
	if err != nil {
		return relay.TaskStatus{}, err
	}
	if i >= uint64(b.Len()) {
		return relay.TaskStatus{}, fail(codeInvalid, "task %d of a batch of %d", i, b.Len())
	}
	e.eng.Progress()
	return b.Status(int(i))
}

func (e *engine) freeBatch(id uint64) error {
	e.batchMu.Lock()
	defer e.batchMu.Unlock()
	b := e.batches[id]
	if b == nil {
		return fail(codeInvalid, "batch handle %d is not a live batch of this engine", id)
	}
	if err := b.Release(); err != nil {
		return fail(codeBusy, "batch %d still has pending (unfinished) tasks", id)
	}
	delete(e.batches, id)
	return nil
}

// relayWaitStep is how often waitRelay looks again.
const relayWaitStep = time.Millisecond

// waitRelay waits until rail has a live relay. It does not hold the engine:
// it is called without handles.with, and gives up when the engine closes.
func waitRelay(id uint64, rail string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var found bool
		err := handles.with(id, func(e *engine) error {
			if e.closing.Load() {
				return fail(codeClosed, "engine is closing")
			}
			if !e.eng.PXNActive() {
				return fail(codeNotSup, "PXN is off in this process; there is no relay to wait for")
			}
			found = e.eng.HasRelay(rail)
			return nil
		})
		if err != nil || found {
			return err
		}
		if !time.Now().Before(deadline) {
			return fail(codeTimedOut, "no live relay on rail %q after %v", rail, timeout)
		}
		time.Sleep(relayWaitStep)
	}
}

// closeDrainStep is how often close looks at unfinished batches.
const closeDrainStep = 50 * time.Microsecond

// close drains for up to timeout, stops the relay engine and frees the C
// side. The caller has removed e from the handle table.
func (e *engine) close(timeout time.Duration) error {
	e.closing.Store(true)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	deadline := time.Now().Add(timeout)
	for e.pending() > 0 && time.Now().Before(deadline) {
		// Without a pump only Progress completes direct work.
		e.eng.Progress()
		time.Sleep(closeDrainStep)
	}
	if e.arena != nil {
		e.arena.closing.Store(true)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	err := e.eng.Close(ctx)
	cancel()
	left := e.pending()
	e.batches = nil
	e.release()
	if ferr := e.first.close(); ferr != nil && err == nil {
		err = ferr
	}
	switch {
	case left > 0:
		return fail(codeTimedOut, "close: %d batches still had pending tasks after %v; the engine no longer tracks them", left, timeout)
	case err != nil:
		return fail(codeIO, "close: %w", err)
	}
	return nil
}

// pending counts the batches with a task not yet final.
func (e *engine) pending() int {
	e.batchMu.RLock()
	defer e.batchMu.RUnlock()
	n := 0
	for _, b := range e.batches {
		if !b.Done() {
			n++
		}
	}
	return n
}

// maxInterned bounds the session names an interner keeps.
const maxInterned = 4096

// interner returns one Go string per distinct session name, so that a
// steady stream of requests to the same targets does not allocate.
type interner struct {
	mu sync.Mutex
	m  map[string]string
}

func (in *interner) get(b []byte) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	if s, ok := in.m[string(b)]; ok {
		return s
	}
	s := string(b)
	if in.m == nil {
		in.m = make(map[string]string)
	}
	if len(in.m) < maxInterned {
		in.m[s] = s
	}
	return s
}
