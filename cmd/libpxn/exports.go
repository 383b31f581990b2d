// SPDX-License-Identifier: Apache-2.0

package main

/*
#cgo CFLAGS: -I${SRCDIR} -I${SRCDIR}/../../include
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"math"
	"time"
	"unsafe"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// The Go mirrors of pxn.h's constants must match it: a mismatch indexes
// these arrays out of range and fails the build.
var (
	_ = [1]struct{}{}[C.PXN_OK-int(codeOK)]
	_ = [1]struct{}{}[C.PXN_EINVAL-int(codeInvalid)]
	_ = [1]struct{}{}[C.PXN_BUSY-int(codeBusy)]
	_ = [1]struct{}{}[C.PXN_ENOTSUP-int(codeNotSup)]
	_ = [1]struct{}{}[C.PXN_ECLOSED-int(codeClosed)]
	_ = [1]struct{}{}[C.PXN_EIO-int(codeIO)]
	_ = [1]struct{}{}[C.PXN_ETIMEDOUT-int(codeTimedOut)]
	_ = [1]struct{}{}[C.PXN_EINTERNAL-int(codeInternal)]
	_ = [1]struct{}{}[C.PXN_ETOOMANY-int(codeTooMany)]
	_ = [1]struct{}{}[C.PXN_ESTALE-int(codeStale)]
	_ = [1]struct{}{}[C.PXN_TASK_WAITING-int(taskWaiting)]
	_ = [1]struct{}{}[C.PXN_TASK_PENDING-int(taskPending)]
	_ = [1]struct{}{}[C.PXN_TASK_INVALID-int(taskInvalid)]
	_ = [1]struct{}{}[C.PXN_TASK_CANCELED-int(taskCanceled)]
	_ = [1]struct{}{}[C.PXN_TASK_COMPLETED-int(taskCompleted)]
	_ = [1]struct{}{}[C.PXN_TASK_TIMEOUT-int(taskTimeout)]
	_ = [1]struct{}{}[C.PXN_TASK_FAILED-int(taskFailed)]
	_ = [1]struct{}{}[C.PXN_COPIER_DEFAULT-int(copierDefault)]
	_ = [1]struct{}{}[C.PXN_COPIER_HOST-int(copierHost)]
	_ = [1]struct{}{}[C.PXN_COPIER_CUDA-int(copierCUDA)]
	_ = [1]struct{}{}[C.PXN_MEM_HOST-memHost]
	_ = [1]struct{}{}[C.PXN_MEM_DEVICE-memDevice]
	_ = [1]struct{}{}[C.PXN_MAX_SESSION-staging.MaxSession]
	_ = [1]struct{}{}[C.PXN_HCA_NAME_MAX-1-maxHCAName]
)

// openTimeout bounds pxn_open's wait for the registry lock.
const openTimeout = 10 * time.Second

// maxRailName bounds a rail name read from C.
const maxRailName = 256

// run calls f as an exported function's body: a panic becomes
// PXN_EINTERNAL, and a failure's message is kept for pxn_last_error on the
// calling thread.
func run(f func() error) C.int {
	code, msg := guarded(f)
	if code != codeOK {
		setThreadError(msg)
	}
	return C.int(code)
}

func setThreadError(msg string) {
	if msg == "" {
		C.pxnlib_set_error(nil, 0)
		return
	}
	C.pxnlib_set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
}

// cBytes returns the bytes of the NUL-terminated C string p, looking no
// further than limit bytes; ok is false when there is no NUL within them.
// It reads byte by byte, so a short string at the end of a mapping is safe.
func cBytes(p *C.char, limit int) (b []byte, ok bool) {
	base := unsafe.Pointer(p)
	for n := 0; n <= limit; n++ {
		if *(*byte)(unsafe.Add(base, n)) == 0 {
			return unsafe.Slice((*byte)(base), n), true
		}
	}
	return nil, false
}

// cString is cBytes copied into a Go string; what names the argument in
// the error.
func cString(p *C.char, limit int, what string) (string, error) {
	if p == nil {
		return "", fail(codeInvalid, "%s is NULL", what)
	}
	b, ok := cBytes(p, limit)
	if !ok {
		return "", fail(codeInvalid, "%s is longer than %d bytes", what, limit)
	}
	return string(b), nil
}

// cAddress reads a C pointer field as an address, never as a Go pointer.
func cAddress(p *unsafe.Pointer) uintptr { return *(*uintptr)(unsafe.Pointer(p)) }

// cLookupEnv reads the environment at call time, so a host that sets
// MC_PXN_* after loading the library is seen.
func cLookupEnv(name string) (string, bool) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	v := C.getenv(cname)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

//export pxn_open
func pxn_open(opts *C.pxn_options, out *C.pxn_engine_t) C.int {
	return run(func() error {
		if opts == nil || out == nil {
			return fail(codeInvalid, "pxn_open: opts and out must not be NULL")
		}
		*out = 0
		o, err := readOptions(opts)
		if err != nil {
			return err
		}
		legacy := o.version == 1
		if o.transport == nil {
			return fail(codeInvalid, "pxn_open: options.transport is NULL")
		}
		size := uint32(o.transport.struct_size)
		if size < transportV3Size {
			return fail(codeInvalid, "pxn_open: transport struct_size %d; want at least %d", size, transportV3Size)
		}
		// A table of API version 3 ends at poll: only struct_size bytes
		// are the host's, and the rest of t stays zero.
		var t C.pxn_transport
		n := min(uintptr(size), unsafe.Sizeof(t))
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&t)), n), unsafe.Slice((*byte)(unsafe.Pointer(o.transport)), n))
		if t.submit == nil || t.poll == nil {
			return fail(codeInvalid, "pxn_open: the transport needs both submit and poll")
		}
		var hca string
		if o.local_hca != nil {
			var err error
			if hca, err = cString(o.local_hca, maxHCAName, "options.local_hca"); err != nil {
				return err
			}
		}
		if (o.register_arena == nil) != (o.deregister_arena == nil) {
			return fail(codeInvalid, "pxn_open: register_arena and deregister_arena must both be set or both be NULL")
		}
		maxBatches := int(o.max_batches)
		if maxBatches == 0 {
			maxBatches = C.PXN_DEFAULT_MAX_BATCHES
		}
		if o.flags&^C.PXN_OPEN_CUDA_DEVICE != 0 {
			return fail(codeInvalid, "pxn_open: unknown flags %#x", uint32(o.flags&^C.PXN_OPEN_CUDA_DEVICE))
		}
		dev := deviceChoice{ordinal: int(o.cuda_device), set: o.flags&C.PXN_OPEN_CUDA_DEVICE != 0}
		log := klog.Background()
		cfg := engineconfig.Load(cLookupEnv, nil)
		pxnOn := cfg.Enable && hca != ""
		kind := uint32(o.copier)
		if legacy && kind == copierDefault {
			// API version 2 documented DEFAULT as the host copier, and its
			// hosts may register CPU memory as device memory under it.
			kind = copierHost
		}
		first, err := newFirstHop(kind, pxnOn, dev, cfg.CopyMode, log)
		if err != nil {
			return err
		}
		bufs := &cBuffers{}
		routes := &routeBook{}
		arena := &cArena{regFn: o.register_arena, deregFn: o.deregister_arena, user: C.uintptr_t(cAddress(&o.arena_user)), kind: first.arenaKind}
		stride := opSize
		if legacy {
			stride = legacyOpSize
		}
		hop := &cHop{submitFn: t.submit, pollFn: t.poll, user: C.uintptr_t(cAddress(&t.user)), bufs: bufs,
			opSize: stride, arena: arena, routes: routes}
		var engineHop relay.Hop = hop
		if t.submit_piece != nil && !legacy {
			engineHop = cPieceHop{cHop: hop, pieceFn: t.submit_piece}
		}
		arena.busy = hop.held.Load
		var dir relay.Directory
		var table *tableDirectory
		if o.resolve != nil {
			dir = &callbackDirectory{fn: o.resolve, user: C.uintptr_t(cAddress(&o.resolve_user)), bufs: bufs, routes: routes}
		} else {
			table = newTableDirectory(routes)
			dir = table
		}
		release := func() {
			hop.releaseAll()
			bufs.releaseAll()
		}
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		defer cancel()
		eng, err := engineopen.OpenFromEnv(ctx, cLookupEnv, engineopen.HostDeps{
			Hop: engineHop, Directory: dir, Copier: first.copier, LocalHCA: hca,
			Arenas: first.arenas, Memory: arena, Logger: log,
		})
		if err != nil {
			_ = first.copier.Close()
			_ = first.close()
			release()
			return fail(codeIO, "pxn_open: %w", err)
		}
		if !eng.PXNActive() && first.kind != copierDefault {
			// PXN did not come up (its configuration or registry refused):
			// no copier runs, and its streams go now. The GPU stays
			// retained until pxn_close: a quarantined arena lives in it.
			first.kind = copierDefault
			if err := first.copier.Close(); err != nil {
				log.Info("pxn first hop: closing the unused copier failed", "err", err.Error())
			}
		}
		*out = C.pxn_engine_t(handles.add(newEngine(eng, engineSetup{first: first, table: table, release: release,
			legacy: legacy, maxBatches: maxBatches})))
		return nil
	})
}

// optionsV1Size is pxn_options of options version 1: it ends before
// register_arena.
const optionsV1Size = int(unsafe.Offsetof(C.pxn_options{}.register_arena))

// readOptions copies the host's options, reading no more bytes than the
// version the host states has: a host built against an older header passes
// a shorter struct.
func readOptions(opts *C.pxn_options) (C.pxn_options, error) {
	var o C.pxn_options
	size := int(opts.struct_size)
	if size < optionsV1Size {
		return o, fail(codeInvalid, "pxn_open: options struct_size %d; want at least %d", size, optionsV1Size)
	}
	var want int
	switch v := uint32(opts.version); v {
	case 1:
		want = optionsV1Size
	case C.PXN_OPTIONS_VERSION:
		want = C.sizeof_pxn_options
	default:
		return o, fail(codeNotSup, "pxn_open: options version %d; this library knows versions 1 to %d", v, C.PXN_OPTIONS_VERSION)
	}
	if size < want {
		return o, fail(codeInvalid, "pxn_open: options struct_size %d; version %d needs at least %d", size, uint32(opts.version), want)
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&o)), want), unsafe.Slice((*byte)(unsafe.Pointer(opts)), want))
	return o, nil
}

//export pxn_close
func pxn_close(h C.pxn_engine_t, timeoutMS C.uint32_t) C.int {
	return run(func() error {
		e, err := handles.remove(uint64(h))
		if err != nil {
			return err
		}
		return e.close(time.Duration(timeoutMS) * time.Millisecond)
	})
}

//export pxn_register_memory
func pxn_register_memory(h C.pxn_engine_t, addr unsafe.Pointer, n C.uint64_t, kind C.int) C.int {
	a := uintptr(addr)
	return run(func() error {
		return handles.with(uint64(h), func(e *engine) error {
			return e.registerMemory(a, uint64(n), int(kind))
		})
	})
}

//export pxn_register_target
func pxn_register_target(h C.pxn_engine_t, session, hca *C.char, base, n C.uint64_t) C.int {
	return run(func() error {
		s, err := cString(session, staging.MaxSession, "session")
		if err != nil {
			return err
		}
		name, err := cString(hca, maxHCAName, "hca")
		if err != nil {
			return err
		}
		return handles.with(uint64(h), func(e *engine) error {
			return e.registerTarget(s, name, uint64(base), uint64(n), 0, 0)
		})
	})
}

//export pxn_register_target_info
func pxn_register_target_info(h C.pxn_engine_t, session *C.char, info *C.pxn_target_info) C.int {
	return run(func() error {
		s, err := cString(session, staging.MaxSession, "session")
		if err != nil {
			return err
		}
		if info == nil {
			return fail(codeInvalid, "pxn_register_target_info: info is NULL")
		}
		in := *info
		if in.hca_count != 1 {
			return fail(codeInvalid, "target %q: hca_count %d; a registered range is served by exactly one HCA", s, uint32(in.hca_count))
		}
		name := cChars(in.hca[:])
		return handles.with(uint64(h), func(e *engine) error {
			return e.registerTarget(s, name, uint64(in.range_base), uint64(in.range_len), uint64(in.route), uint64(in.remote_key))
		})
	})
}

//export pxn_unregister_target
func pxn_unregister_target(h C.pxn_engine_t, session *C.char) C.int {
	return run(func() error {
		s, err := cString(session, staging.MaxSession, "session")
		if err != nil {
			return err
		}
		return handles.with(uint64(h), func(e *engine) error {
			return e.unregisterTarget(s)
		})
	})
}

//export pxn_invalidate_target
func pxn_invalidate_target(h C.pxn_engine_t, session *C.char) C.int {
	return run(func() error {
		s := ""
		if session != nil {
			var err error
			if s, err = cString(session, staging.MaxSession, "session"); err != nil {
				return err
			}
		}
		return handles.with(uint64(h), func(e *engine) error {
			e.eng.InvalidateTarget(s)
			return nil
		})
	})
}

//export pxn_submit
func pxn_submit(h C.pxn_engine_t, reqs *C.pxn_request, count C.size_t, out *C.pxn_batch_t) C.int {
	return run(func() error {
		if out == nil {
			return fail(codeInvalid, "pxn_submit: out is NULL")
		}
		*out = 0
		if count > 0 && reqs == nil {
			return fail(codeInvalid, "pxn_submit: %d requests at NULL", count)
		}
		if uint64(count) > math.MaxInt32 {
			return fail(codeInvalid, "pxn_submit: %d requests in one batch", count)
		}
		return handles.with(uint64(h), func(e *engine) error {
			cs := unsafe.Slice(reqs, int(count))
			rs := e.requests(len(cs))
			defer e.putRequests(rs)
			for i := range cs {
				c := &cs[i]
				r := &rs[i]
				switch c.op {
				case C.PXN_OP_WRITE:
					r.Op = relay.Write
				case C.PXN_OP_READ:
					r.Op = relay.Read
				default:
					return fail(codeInvalid, "pxn_submit: request %d: op %d; want PXN_OP_WRITE or PXN_OP_READ", i, c.op)
				}
				r.Src, r.Len, r.Dst = cAddress(&c.src), uint64(c.len), uint64(c.dst)
				r.Stream = cAddress(&c.stream)
				if r.Len > 0 && (r.Src == 0 || uint64(r.Src)+(r.Len-1) < uint64(r.Src)) {
					return fail(codeInvalid, "pxn_submit: request %d: local range %#x+%d", i, r.Src, r.Len)
				}
				if r.Len > 0 && r.Dst+(r.Len-1) < r.Dst {
					return fail(codeInvalid, "pxn_submit: request %d: destination %#x+%d wraps", i, r.Dst, r.Len)
				}
				if c.target == nil {
					return fail(codeInvalid, "pxn_submit: request %d: target is NULL", i)
				}
				b, ok := cBytes(c.target, staging.MaxSession)
				if !ok || len(b) == 0 {
					return fail(codeInvalid, "pxn_submit: request %d: target session must be 1..%d bytes", i, staging.MaxSession)
				}
				r.Target = e.sessions.get(b)
			}
			id, err := e.submit(rs)
			if err != nil {
				return err
			}
			*out = C.pxn_batch_t(id)
			return nil
		})
	})
}

//export pxn_get_status
func pxn_get_status(h C.pxn_engine_t, batch C.pxn_batch_t, index C.size_t, out *C.pxn_task_status) C.int {
	return run(func() error {
		if out == nil {
			return fail(codeInvalid, "pxn_get_status: out is NULL")
		}
		return handles.with(uint64(h), func(e *engine) error {
			st, err := e.status(uint64(batch), uint64(index))
			if err != nil {
				return err
			}
			out.state = C.int32_t(taskState(st, e.legacy))
			out.reserved = 0
			out.transferred = C.uint64_t(st.Transferred)
			if st.State == relay.Failed && st.Err != nil {
				// The call succeeded; the task's failure is still worth a
				// message on this thread.
				setThreadError(st.Err.Error())
			}
			return nil
		})
	})
}

//export pxn_free_batch
func pxn_free_batch(h C.pxn_engine_t, batch C.pxn_batch_t) C.int {
	return run(func() error {
		return handles.with(uint64(h), func(e *engine) error {
			return e.freeBatch(uint64(batch))
		})
	})
}

//export pxn_progress
func pxn_progress(h C.pxn_engine_t) C.int {
	return run(func() error {
		return handles.with(uint64(h), func(e *engine) error {
			e.eng.Progress()
			return nil
		})
	})
}

// countersHeader is the size of pxn_counters' struct_size and pxn_active.
const countersHeader = 8

//export pxn_get_counters
func pxn_get_counters(h C.pxn_engine_t, out *C.pxn_counters) C.int {
	return run(func() error {
		if out == nil {
			return fail(codeInvalid, "pxn_get_counters: out is NULL")
		}
		size := int(out.struct_size)
		if size < countersHeader {
			return fail(codeInvalid, "pxn_get_counters: struct_size %d; want at least %d", size, countersHeader)
		}
		return handles.with(uint64(h), func(e *engine) error {
			s := e.eng.Counters()
			n := min(size, C.sizeof_pxn_counters)
			c := C.pxn_counters{
				struct_size:         C.uint32_t(n),
				relayed_bytes:       C.uint64_t(s.RelayedBytes),
				relayed_pieces:      C.uint64_t(s.RelayedPieces),
				fallback_bytes:      C.uint64_t(s.FallbackBytes),
				fallback_pieces:     C.uint64_t(s.FallbackPieces),
				direct_bytes:        C.uint64_t(s.DirectBytes),
				credit_waits:        C.uint64_t(s.CreditWaits),
				second_hop_failures: C.uint64_t(s.SecondHopFailures),
				forwarded_bytes:     C.uint64_t(s.ForwardedBytes),
				forwarded_pieces:    C.uint64_t(s.ForwardedPieces),
				invalid_descs:       C.uint64_t(s.InvalidDescs),
				failed_pieces:       C.uint64_t(s.FailedPieces),
				lane_quarantines:    C.uint64_t(s.LaneQuarantines),
				copier:              C.uint64_t(e.first.kind),
				live_batches:        C.uint64_t(e.liveBatches()),
				config_refused:      C.uint64_t(s.ConfigRefused),
			}
			if e.eng.PXNActive() {
				c.pxn_active = 1
			}
			copy(unsafe.Slice((*byte)(unsafe.Pointer(out)), n), unsafe.Slice((*byte)(unsafe.Pointer(&c)), n))
			return nil
		})
	})
}

//export pxn_is_active
func pxn_is_active(h C.pxn_engine_t) C.int {
	active := false
	rc := run(func() error {
		return handles.with(uint64(h), func(e *engine) error {
			active = e.eng.PXNActive()
			return nil
		})
	})
	if rc == C.PXN_OK && active {
		return 1
	}
	return rc
}

//export pxn_has_relay
func pxn_has_relay(h C.pxn_engine_t, rail *C.char) C.int {
	has := false
	rc := run(func() error {
		r, err := cString(rail, maxRailName, "rail")
		if err != nil {
			return err
		}
		return handles.with(uint64(h), func(e *engine) error {
			has = e.eng.HasRelay(r)
			return nil
		})
	})
	if rc == C.PXN_OK && has {
		return 1
	}
	return rc
}

//export pxn_wait_relay
func pxn_wait_relay(h C.pxn_engine_t, rail *C.char, timeoutMS C.uint32_t) C.int {
	return run(func() error {
		r, err := cString(rail, maxRailName, "rail")
		if err != nil {
			return err
		}
		return waitRelay(uint64(h), r, time.Duration(timeoutMS)*time.Millisecond)
	})
}
