// SPDX-License-Identifier: Apache-2.0

package main

/*
#cgo CFLAGS: -I${SRCDIR} -I${SRCDIR}/../../include
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/relay"
)

// cBuffers lends C memory for the arguments of callbacks: the host may read
// it only during the call, and Go memory could not hold the C pointers the
// arguments contain. A buffer goes back to the pool after the call.
type cBuffers struct {
	mu       sync.Mutex
	free     []cBuffer
	released bool
}

type cBuffer struct {
	p unsafe.Pointer
	n int
}

// maxPooledBuffers bounds the idle buffers a pool keeps.
const maxPooledBuffers = 8

func (b *cBuffers) get(n int) (cBuffer, error) {
	b.mu.Lock()
	if b.released {
		b.mu.Unlock()
		return cBuffer{}, relay.ErrClosed
	}
	for i := len(b.free) - 1; i >= 0; i-- {
		if b.free[i].n >= n {
			buf := b.free[i]
			b.free = append(b.free[:i], b.free[i+1:]...)
			b.mu.Unlock()
			return buf, nil
		}
	}
	b.mu.Unlock()
	size := max(n, 4096)
	p := C.malloc(C.size_t(size))
	if p == nil {
		return cBuffer{}, fmt.Errorf("libpxn: out of C memory for %d bytes of callback arguments", size)
	}
	return cBuffer{p: p, n: size}, nil
}

// put takes buf back. A full pool keeps the larger of buf and its smallest
// buffer.
func (b *cBuffers) put(buf cBuffer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.released {
		C.free(buf.p)
		return
	}
	if len(b.free) < maxPooledBuffers {
		b.free = append(b.free, buf)
		return
	}
	small := 0
	for i := range b.free {
		if b.free[i].n < b.free[small].n {
			small = i
		}
	}
	if b.free[small].n < buf.n {
		buf, b.free[small] = b.free[small], buf
	}
	C.free(buf.p)
}

// releaseAll frees the idle buffers; later gets fail. Buffers still lent
// are freed when they come back.
func (b *cBuffers) releaseAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, buf := range b.free {
		C.free(buf.p)
	}
	b.free = nil
	b.released = true
}

// cHop is a relay.Hop over the host's transport callbacks.
type cHop struct {
	submitFn C.pxn_transport_submit_fn
	pollFn   C.pxn_transport_poll_fn
	// user is the host's context pointer, kept as an integer: it is C's to
	// interpret, and the Go collector must never take it for a pointer.
	user C.uintptr_t
	bufs *cBuffers
	// abi decides the layout of the op array the host reads.
	abi    hostABI
	arena  *cArena
	routes *routeBook

	// held counts the completions the host owes: one for each op it took
	// through submit, one for each Piece through submit_piece; a NIC may
	// still read the arena for any of them.
	held atomic.Int64

	pollMu   sync.Mutex
	pollBuf  *C.pxn_transport_completion
	pollCap  int
	released bool
}

var (
	_ relay.Hop    = (*cHop)(nil)
	_ relay.Router = (*cHop)(nil)
)

// opSize is pxn_transport_op of this library's API version.
const opSize = int(unsafe.Sizeof(C.pxn_transport_op{}))

// Route implements relay.Router with the handle the host's directory gave
// for session (nil: none, and the ops go without one).
func (h *cHop) Route(session string) (any, error) {
	if r, ok := h.routes.get(session); ok {
		return cRoute(r), nil
	}
	return nil, nil
}

// Submit hands ops to the host in one call. The op array and the target
// strings live in a lent C buffer that is reused once the call returns.
func (h *cHop) Submit(ops []relay.WriteOp) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("libpxn internal error in transport submit: %v", r)
		}
	}()
	if len(ops) == 0 {
		return nil
	}
	buf, err := h.cOps(ops)
	if err != nil {
		return err
	}
	defer h.bufs.put(buf)
	err = submitResult(int32(C.pxnlib_call_submit(h.submitFn, h.user, (*C.pxn_transport_op)(buf.p), C.size_t(len(ops)))), "submit", len(ops))
	if err == nil {
		h.held.Add(int64(len(ops)))
	}
	return err
}

// submitResult maps the host's answer to a submit of n ops.
func submitResult(rc int32, call string, n int) error {
	switch rc {
	case codeOK:
		return nil
	case codeBusy:
		return relay.ErrHopBusy
	default:
		return &transportError{code: rc, msg: fmt.Sprintf("%s of %d ops refused", call, n)}
	}
}

// cOps lays ops out as the host's op array, followed by their target
// strings, in a lent C buffer the caller puts back.
func (h *cHop) cOps(ops []relay.WriteOp) (cBuffer, error) {
	stride := h.abi.opStride()
	size := len(ops) * stride
	for i := range ops {
		if i == 0 || ops[i].Target != ops[i-1].Target {
			size += len(ops[i].Target) + 1
		}
	}
	buf, err := h.bufs.get(size)
	if err != nil {
		return cBuffer{}, err
	}
	strs := unsafe.Slice((*byte)(unsafe.Add(buf.p, len(ops)*stride)), size-len(ops)*stride)
	off := 0
	var target *C.char
	for i := range ops {
		op := &ops[i]
		if i == 0 || op.Target != ops[i-1].Target {
			n := copy(strs[off:], op.Target)
			strs[off+n] = 0
			target = (*C.char)(unsafe.Pointer(&strs[off]))
			off += n + 1
		}
		c := (*C.pxn_transport_op)(unsafe.Add(buf.p, i*stride))
		*(*uintptr)(unsafe.Pointer(&c.src)) = op.Src
		c.len = C.uint64_t(op.Len)
		c.target = target
		c.dst = C.uint64_t(op.Dst)
		c.token = C.uint64_t(op.Token)
		c.read = 0
		if op.Read {
			c.read = 1
		}
		c.flags = 0
		if !h.abi.opsRouted() {
			continue
		}
		c.route, c.remote_key, c.local_key = 0, 0, 0
		var flags C.uint32_t
		if key, hasKey, in := h.arena.holds(op.Src, op.Len); in && !op.Read {
			flags |= C.PXN_OP_RELAYED
			if hasKey {
				flags |= C.PXN_OP_LOCAL_KEY
				c.local_key = C.uint64_t(key)
			}
		}
		if r, ok := op.Route.(cRoute); ok {
			flags |= C.PXN_OP_ROUTED
			c.route = C.uint64_t(r)
			c.remote_key = C.uint64_t(op.Key)
		}
		c.flags = flags
	}
	return buf, nil
}

// cPieceHop is a cHop whose host takes relayed Pieces whole through its
// submit_piece callback (relay.PieceHop).
type cPieceHop struct {
	*cHop
	pieceFn C.pxn_transport_submit_piece_fn
}

var _ relay.PieceHop = cPieceHop{}

// SubmitPiece hands a relayed Piece's ops to the host in one call, under
// one token.
func (h cPieceHop) SubmitPiece(ops []relay.WriteOp, token uint64) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("libpxn internal error in transport submit_piece: %v", r)
		}
	}()
	buf, err := h.cOps(ops)
	if err != nil {
		return err
	}
	defer h.bufs.put(buf)
	var arr *C.pxn_transport_op
	if len(ops) > 0 {
		arr = (*C.pxn_transport_op)(buf.p)
	}
	err = submitResult(int32(C.pxnlib_call_submit_piece(h.pieceFn, h.user, arr, C.size_t(len(ops)), C.uint64_t(token))), "submit_piece", len(ops))
	if err == nil {
		// One completion reports the whole Piece.
		h.held.Add(1)
	}
	return err
}

// Poll asks the host for up to len(out) completions. Calls are serialized,
// so the host's poll never runs twice at once for one engine.
func (h *cHop) Poll(out []relay.HopCompletion) (n int) {
	defer func() {
		if r := recover(); r != nil {
			n = 0
		}
	}()
	h.pollMu.Lock()
	defer h.pollMu.Unlock()
	if h.released || len(out) == 0 {
		return 0
	}
	if h.pollCap < len(out) {
		C.free(unsafe.Pointer(h.pollBuf))
		h.pollBuf = (*C.pxn_transport_completion)(C.calloc(C.size_t(len(out)), C.size_t(unsafe.Sizeof(C.pxn_transport_completion{}))))
		h.pollCap = 0
		if h.pollBuf == nil {
			return 0
		}
		h.pollCap = len(out)
	}
	got := int(C.pxnlib_call_poll(h.pollFn, h.user, h.pollBuf, C.size_t(len(out))))
	// A host that reports more than it was given room for has already
	// overrun the array; what lies past it is not read.
	got = min(got, len(out))
	cs := unsafe.Slice(h.pollBuf, got)
	final := got
	for i := range cs {
		out[i] = relay.HopCompletion{Token: uint64(cs[i].token)}
		if code := int32(cs[i].status); code != codeOK {
			out[i].Err = &transportError{code: code, msg: cChars(cs[i].message[:])}
			if code == codeTimedOut {
				// Not final: the NIC may still hold the op, and the
				// host reports its token again once it is.
				final--
			}
		}
	}
	if h.held.Add(-int64(final)) < 0 {
		h.held.Store(0)
	}
	return got
}

// releaseAll frees the poll array; the engine has stopped polling.
func (h *cHop) releaseAll() {
	h.pollMu.Lock()
	defer h.pollMu.Unlock()
	C.free(unsafe.Pointer(h.pollBuf))
	h.pollBuf = nil
	h.pollCap = 0
	h.released = true
}

// cChars is the NUL-terminated string in a C char array, read no further
// than the array.
func cChars(a []C.char) string {
	if len(a) == 0 {
		return ""
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), len(a))
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// callbackDirectory is a relay.Directory over the host's resolve callback.
type callbackDirectory struct {
	fn     C.pxn_resolve_fn
	user   C.uintptr_t
	bufs   *cBuffers
	routes *routeBook

	// known holds one Target per (HCA, range) the host has answered with,
	// so that resolving the same targets again does not allocate.
	mu    sync.Mutex
	known map[string]map[relay.Range]relay.Target
	count int
}

var _ relay.Directory = (*callbackDirectory)(nil)

// maxKnownTargets bounds callbackDirectory.known.
const maxKnownTargets = 4096

// maxReportedHCAs bounds the HCA list of a target served by several HCAs:
// only "exactly one" matters to the engine.
const maxReportedHCAs = 8

const targetInfoSize = int(unsafe.Sizeof(C.pxn_target_info{}))

func (d *callbackDirectory) Resolve(session string, dst uint64) (t relay.Target, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = relay.Target{}, fmt.Errorf("libpxn internal error in resolve: %v", r)
		}
	}()
	if err := checkSession(session); err != nil {
		return relay.Target{}, err
	}
	buf, err := d.bufs.get(targetInfoSize + len(session) + 1)
	if err != nil {
		return relay.Target{}, err
	}
	defer d.bufs.put(buf)
	info := (*C.pxn_target_info)(buf.p)
	*info = C.pxn_target_info{}
	name := unsafe.Slice((*byte)(unsafe.Add(buf.p, targetInfoSize)), len(session)+1)
	name[copy(name, session)] = 0
	rc := int32(C.pxnlib_call_resolve(d.fn, d.user, (*C.char)(unsafe.Pointer(&name[0])), C.uint64_t(dst), info))
	if rc != codeOK {
		return relay.Target{}, &transportError{code: rc, msg: fmt.Sprintf("resolve of target %q at %#x failed", session, dst)}
	}
	if info.hca_count == 0 {
		return relay.Target{}, fmt.Errorf("resolve of target %q at %#x: no HCA", session, dst)
	}
	hca := unsafe.Slice((*byte)(unsafe.Pointer(&info.hca[0])), len(info.hca))
	if i := bytes.IndexByte(hca, 0); i >= 0 {
		hca = hca[:i]
	}
	if len(hca) == 0 {
		return relay.Target{}, fmt.Errorf("resolve of target %q at %#x: empty HCA name", session, dst)
	}
	rng := relay.Range{Addr: uint64(info.range_base), Len: uint64(info.range_len)}
	if info.route != 0 {
		rng.Key = uint64(info.remote_key)
	}
	d.routes.set(session, uint64(info.route))
	if n := int(info.hca_count); n > 1 {
		hcas := make([]string, min(n, maxReportedHCAs))
		hcas[0] = string(hca)
		return relay.Target{HCAs: hcas, Ranges: []relay.Range{rng}}, nil
	}
	return d.target(hca, rng), nil
}

// target returns the Target of a single-HCA answer.
func (d *callbackDirectory) target(hca []byte, rng relay.Range) relay.Target {
	d.mu.Lock()
	defer d.mu.Unlock()
	byRange := d.known[string(hca)]
	if t, ok := byRange[rng]; ok {
		return t
	}
	t := relay.Target{HCAs: []string{string(hca)}, Ranges: []relay.Range{rng}}
	if d.count >= maxKnownTargets {
		return t
	}
	if byRange == nil {
		if d.known == nil {
			d.known = make(map[string]map[relay.Range]relay.Target)
		}
		byRange = make(map[relay.Range]relay.Target)
		d.known[t.HCAs[0]] = byRange
	}
	byRange[rng] = t
	d.count++
	return t
}
