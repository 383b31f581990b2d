// SPDX-License-Identifier: Apache-2.0

//go:build pxnseams

package main

/*
#cgo CFLAGS: -I${SRCDIR} -I${SRCDIR}/../../include
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"

size_t pxn_last_error(char *buf, size_t len);

static int seam_submit(void *user, const pxn_transport_op *ops, size_t count)
{
	(void)user; (void)ops; (void)count;
	return PXN_EIO;
}

static size_t seam_poll(void *user, pxn_transport_completion *out, size_t capacity)
{
	(void)user; (void)out; (void)capacity;
	return 0;
}

static int seam_submit_piece(void *user, const pxn_transport_op *ops, size_t count, uint64_t token)
{
	(void)user; (void)ops; (void)count; (void)token;
	return PXN_EIO;
}

static int seam_register(void *user, void *addr, uint64_t len, int kind, uint64_t *key)
{
	(void)user; (void)addr; (void)len; (void)kind;
	*key = 1;
	return PXN_OK;
}

static int seam_deregister(void *user, void *addr, uint64_t len, uint64_t key)
{
	(void)user; (void)addr; (void)len; (void)key;
	return PXN_OK;
}

// The copying transport: it carries each op whose ranges lie inside memory
// a test lent it (seam_lend) with memmove, records every op, and completes
// each at the next poll; an op reaching outside that memory is refused
// unwritten and counted. One engine at a time uses it.
#define SEAM_MAX_OPS 4096
#define SEAM_MAX_LENT 8

typedef struct {
	uint64_t src, len, dst;
	uint32_t read, flags;
	char target[PXN_MAX_SESSION + 1];
} seam_op;

static pthread_mutex_t seam_mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t seam_lent_lo[SEAM_MAX_LENT], seam_lent_hi[SEAM_MAX_LENT];
static size_t seam_nlent;
static seam_op seam_ops[SEAM_MAX_OPS];
static size_t seam_nops, seam_outside;
static pxn_transport_completion seam_done[SEAM_MAX_OPS];
static size_t seam_ndone;

static void seam_reset(void)
{
	pthread_mutex_lock(&seam_mu);
	seam_nlent = seam_nops = seam_outside = seam_ndone = 0;
	pthread_mutex_unlock(&seam_mu);
}

static int seam_lend(void *p, size_t n)
{
	int ok = 0;
	pthread_mutex_lock(&seam_mu);
	if (seam_nlent < SEAM_MAX_LENT) {
		seam_lent_lo[seam_nlent] = (uintptr_t)p;
		seam_lent_hi[seam_nlent] = (uintptr_t)p + n;
		seam_nlent++;
		ok = 1;
	}
	pthread_mutex_unlock(&seam_mu);
	return ok;
}

static int seam_lent(uint64_t p, uint64_t n)
{
	for (size_t i = 0; i < seam_nlent; i++)
		if (p >= seam_lent_lo[i] && p <= seam_lent_hi[i] && n <= seam_lent_hi[i] - p)
			return 1;
	return 0;
}

static int seam_copy_submit(void *user, const pxn_transport_op *ops, size_t count)
{
	(void)user;
	pthread_mutex_lock(&seam_mu);
	if (count > SEAM_MAX_OPS - seam_nops) {
		pthread_mutex_unlock(&seam_mu);
		return PXN_EIO;
	}
	for (size_t i = 0; i < count; i++) {
		const pxn_transport_op *op = &ops[i];
		seam_op *r = &seam_ops[seam_nops++];
		r->src = (uint64_t)(uintptr_t)op->src;
		r->len = op->len;
		r->dst = op->dst;
		r->read = op->read;
		r->flags = op->flags;
		r->target[0] = 0;
		if (op->target != NULL)
			strncat(r->target, op->target, PXN_MAX_SESSION);
		pxn_transport_completion *c = &seam_done[seam_ndone++];
		memset(c, 0, sizeof *c);
		c->token = op->token;
		if (!seam_lent(r->src, r->len) || !seam_lent(r->dst, r->len)) {
			seam_outside++;
			c->status = PXN_EINVAL;
			continue;
		}
		if (r->len > 0 && op->read)
			memmove(op->src, (void *)(uintptr_t)r->dst, r->len);
		else if (r->len > 0)
			memmove((void *)(uintptr_t)r->dst, op->src, r->len);
	}
	pthread_mutex_unlock(&seam_mu);
	return PXN_OK;
}

static size_t seam_copy_poll(void *user, pxn_transport_completion *out, size_t capacity)
{
	(void)user;
	pthread_mutex_lock(&seam_mu);
	size_t n = seam_ndone < capacity ? seam_ndone : capacity;
	memcpy(out, seam_done, n * sizeof *out);
	memmove(seam_done, seam_done + n, (seam_ndone - n) * sizeof *out);
	seam_ndone -= n;
	pthread_mutex_unlock(&seam_mu);
	return n;
}

// Copies up to cap recorded ops to out; *outside gets how many reached
// outside the lent memory. Returns how many were recorded.
static size_t seam_copied(seam_op *out, size_t cap, size_t *outside)
{
	pthread_mutex_lock(&seam_mu);
	size_t n = seam_nops;
	memcpy(out, seam_ops, (n < cap ? n : cap) * sizeof *out);
	*outside = seam_outside;
	pthread_mutex_unlock(&seam_mu);
	return n;
}

static void seam_fill(pxn_options *o, pxn_transport *t, int submit, int poll, int piece, int reg, int dereg, int copying)
{
	t->submit = submit ? (copying ? seam_copy_submit : seam_submit) : NULL;
	t->poll = poll ? (copying ? seam_copy_poll : seam_poll) : NULL;
	t->submit_piece = piece ? seam_submit_piece : NULL;
	o->register_arena = reg ? seam_register : NULL;
	o->deregister_arena = dereg ? seam_deregister : NULL;
}
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// The calls below reach the exported functions the way a C host does,
// with arguments in C memory, for the package's tests: go test does not
// run cgo on test files. The file builds only under the pxnseams tag
// (hack/fuzz.sh, test/fuzz), so the shipped library has none of it.

// seamOpenArgs is what a host puts in pxn_options and its pxn_transport.
// A nil hca is a NULL local_hca; hca gets a NUL after its bytes.
type seamOpenArgs struct {
	size, version             uint32
	hca                       []byte
	transport                 bool
	transportSize             uint32
	submit, poll, piece       bool
	register, deregister      bool
	copier, maxBatches, flags uint32
	device                    int32
	// copying: submit and poll are the copying transport's.
	copying bool
}

// seamOpen calls pxn_open with a; it returns the call's code, the engine
// handle and, for a failure, pxn_last_error's message.
func seamOpen(a seamOpenArgs) (code int, h uint64, msg string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	o := (*C.pxn_options)(C.calloc(1, C.sizeof_pxn_options))
	defer C.free(unsafe.Pointer(o))
	t := (*C.pxn_transport)(C.calloc(1, C.sizeof_pxn_transport))
	defer C.free(unsafe.Pointer(t))
	o.struct_size, o.version = C.uint32_t(a.size), C.uint32_t(a.version)
	o.copier, o.max_batches, o.flags, o.cuda_device = C.uint32_t(a.copier), C.uint32_t(a.maxBatches), C.uint32_t(a.flags), C.int32_t(a.device)
	if a.hca != nil {
		s := (*C.char)(C.calloc(C.size_t(len(a.hca)+1), 1))
		defer C.free(unsafe.Pointer(s))
		if len(a.hca) > 0 {
			C.memcpy(unsafe.Pointer(s), unsafe.Pointer(&a.hca[0]), C.size_t(len(a.hca)))
		}
		o.local_hca = s
	}
	if a.transport {
		o.transport = t
	}
	t.struct_size = C.uint32_t(a.transportSize)
	C.seam_fill(o, t, cBool(a.submit), cBool(a.poll), cBool(a.piece), cBool(a.register), cBool(a.deregister), cBool(a.copying))
	var out C.pxn_engine_t
	code = int(pxn_open(o, &out))
	if code != int(codeOK) {
		msg = seamLastError()
	}
	return code, uint64(out), msg
}

// seamClose calls pxn_close.
func seamClose(h uint64) int { return int(pxn_close(C.pxn_engine_t(h), 10000)) }

func seamLastError() string {
	var buf [C.PXN_ERROR_MAX]C.char
	n := C.pxn_last_error(&buf[0], C.size_t(len(buf)))
	return C.GoStringN(&buf[0], C.int(min(int(n), len(buf)-1)))
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Sizes and versions of the ABI, for the tests.
const (
	seamOptionsSize   = C.sizeof_pxn_options
	seamTransportSize = C.sizeof_pxn_transport
	seamOptionsV2     = C.PXN_OPTIONS_VERSION
	seamOpenCUDA      = C.PXN_OPEN_CUDA_DEVICE
	seamOpWrite       = C.PXN_OP_WRITE
	seamOpRead        = C.PXN_OP_READ
	seamMaxSession    = C.PXN_MAX_SESSION
)

// seamCString is b in C memory with a NUL after it, or NULL for nil; free
// it with C.free.
func seamCString(b []byte) *C.char {
	if b == nil {
		return nil
	}
	s := (*C.char)(C.calloc(C.size_t(len(b)+1), 1))
	if len(b) > 0 {
		C.memcpy(unsafe.Pointer(s), unsafe.Pointer(&b[0]), C.size_t(len(b)))
	}
	return s
}

// seamAlloc returns n zeroed bytes of C memory; seamFree frees them.
func seamAlloc(n int) []byte { return unsafe.Slice((*byte)(C.calloc(C.size_t(n), 1)), n) }

func seamFree(b []byte) { C.free(unsafe.Pointer(&b[0])) }

// seamCopyingReset forgets the copying transport's lent memory, ops and
// completions; seamLend lends it b (C memory from seamAlloc).
func seamCopyingReset() { C.seam_reset() }

func seamLend(b []byte) bool {
	return C.seam_lend(unsafe.Pointer(&b[0]), C.size_t(len(b))) == 1
}

// seamOp is an op the copying transport was handed.
type seamOp struct {
	src, len, dst uint64
	read          bool
	flags         uint32
	target        string
}

// seamCopied returns the ops the copying transport was handed, and how
// many of them reached outside the memory lent to it.
func seamCopied() ([]seamOp, int) {
	buf := (*C.seam_op)(C.calloc(C.SEAM_MAX_OPS, C.sizeof_seam_op))
	defer C.free(unsafe.Pointer(buf))
	var outside C.size_t
	n := int(C.seam_copied(buf, C.SEAM_MAX_OPS, &outside))
	recs := unsafe.Slice(buf, n)
	ops := make([]seamOp, n)
	for i := range ops {
		o := &recs[i]
		ops[i] = seamOp{src: uint64(o.src), len: uint64(o.len), dst: uint64(o.dst), read: o.read != 0,
			flags: uint32(o.flags), target: C.GoString(&o.target[0])}
	}
	return ops, int(outside)
}

// seamRequest is one pxn_request; a nil target is NULL, and target gets a
// NUL after its bytes.
type seamRequest struct {
	op     uint32
	src    uintptr
	len    uint64
	target []byte
	dst    uint64
}

// seamSubmit calls pxn_submit with reqs (NULL for nullReqs, with
// len(reqs) as the count) and an out pointer (NULL for nullOut).
func seamSubmit(h uint64, reqs []seamRequest, nullReqs, nullOut bool) (code int, batch uint64, msg string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	n := max(len(reqs), 1)
	cs := (*C.pxn_request)(C.calloc(C.size_t(n), C.sizeof_pxn_request))
	defer C.free(unsafe.Pointer(cs))
	arr := unsafe.Slice(cs, n)
	for i, r := range reqs {
		c := &arr[i]
		c.op, c.len, c.dst = C.uint32_t(r.op), C.uint64_t(r.len), C.uint64_t(r.dst)
		*(*uintptr)(unsafe.Pointer(&c.src)) = r.src
		c.target = seamCString(r.target)
		if c.target != nil {
			defer C.free(unsafe.Pointer(c.target))
		}
	}
	if nullReqs {
		cs = nil
	}
	out := (*C.pxn_batch_t)(C.malloc(C.sizeof_pxn_batch_t))
	defer C.free(unsafe.Pointer(out))
	*out = 0xdead
	if nullOut {
		code = int(pxn_submit(C.pxn_engine_t(h), cs, C.size_t(len(reqs)), nil))
	} else {
		code = int(pxn_submit(C.pxn_engine_t(h), cs, C.size_t(len(reqs)), out))
		batch = uint64(*out)
	}
	if code != int(codeOK) {
		msg = seamLastError()
	}
	return code, batch, msg
}

// seamStatus calls pxn_get_status.
func seamStatus(h, batch uint64, index int) (code int, state int32, transferred uint64) {
	var st C.pxn_task_status
	code = int(pxn_get_status(C.pxn_engine_t(h), C.pxn_batch_t(batch), C.size_t(index), &st))
	return code, int32(st.state), uint64(st.transferred)
}

// seamFreeBatch calls pxn_free_batch.
func seamFreeBatch(h, batch uint64) int {
	return int(pxn_free_batch(C.pxn_engine_t(h), C.pxn_batch_t(batch)))
}

// seamRegisterTarget calls pxn_register_target; nil strings are NULL.
func seamRegisterTarget(h uint64, session, hca []byte, base, n uint64) (int, string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, c := seamCString(session), seamCString(hca)
	defer C.free(unsafe.Pointer(s))
	defer C.free(unsafe.Pointer(c))
	return seamResult(int(pxn_register_target(C.pxn_engine_t(h), s, c, C.uint64_t(base), C.uint64_t(n))))
}

// seamTargetInfo is a pxn_target_info; hca is copied as is, NUL or not.
type seamTargetInfo struct {
	hcaCount                    uint32
	hca                         [C.PXN_HCA_NAME_MAX]byte
	base, len, route, remoteKey uint64
	null                        bool
}

// seamRegisterTargetInfo calls pxn_register_target_info (info NULL for
// in.null).
func seamRegisterTargetInfo(h uint64, session []byte, in seamTargetInfo) (int, string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := seamCString(session)
	defer C.free(unsafe.Pointer(s))
	info := (*C.pxn_target_info)(C.calloc(1, C.sizeof_pxn_target_info))
	defer C.free(unsafe.Pointer(info))
	info.hca_count, info.range_base, info.range_len = C.uint32_t(in.hcaCount), C.uint64_t(in.base), C.uint64_t(in.len)
	info.route, info.remote_key = C.uint64_t(in.route), C.uint64_t(in.remoteKey)
	C.memcpy(unsafe.Pointer(&info.hca[0]), unsafe.Pointer(&in.hca[0]), C.size_t(len(in.hca)))
	if in.null {
		info = nil
	}
	return seamResult(int(pxn_register_target_info(C.pxn_engine_t(h), s, info)))
}

// seamUnregisterTarget calls pxn_unregister_target.
func seamUnregisterTarget(h uint64, session []byte) (int, string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := seamCString(session)
	defer C.free(unsafe.Pointer(s))
	return seamResult(int(pxn_unregister_target(C.pxn_engine_t(h), s)))
}

func seamResult(code int) (int, string) {
	if code != int(codeOK) {
		return code, seamLastError()
	}
	return code, ""
}
