// SPDX-License-Identifier: Apache-2.0

package main

/*
#cgo CFLAGS: -I${SRCDIR} -I${SRCDIR}/../../include
#include "shim.h"
*/
import "C"

import "unsafe"

// Hosts built against older headers pass shorter structs and expect some
// older meanings. Every difference between them and this library's own ABI
// is decided here.

// optionsV1 is pxn_options' version 1: the options of API version 2.
const optionsV1 = 1

const (
	// optionsV1Size is pxn_options of options version 1: it ends before
	// register_arena.
	optionsV1Size = int(unsafe.Offsetof(C.pxn_options{}.register_arena))
	// legacyOpSize is pxn_transport_op of API version 2: it ends before
	// route.
	legacyOpSize = int(unsafe.Offsetof(C.pxn_transport_op{}.route))
	// transportV3Size is pxn_transport of API version 3: it ends before
	// submit_piece.
	transportV3Size = uint32(unsafe.Offsetof(C.pxn_transport{}.submit_piece))
)

// hostABI is the ABI a host was built against, as its options version
// says.
type hostABI struct {
	// legacy is set for a host of options version 1 (API version 2).
	legacy bool
}

// readOptions copies the host's options, reading no more bytes than the
// version the host states has: a host built against an older header passes
// a shorter struct.
func readOptions(opts *C.pxn_options) (C.pxn_options, hostABI, error) {
	var o C.pxn_options
	size := int(opts.struct_size)
	if size < optionsV1Size {
		return o, hostABI{}, fail(codeInvalid, "pxn_open: options struct_size %d; want at least %d", size, optionsV1Size)
	}
	var want int
	switch v := uint32(opts.version); v {
	case optionsV1:
		want = optionsV1Size
	case C.PXN_OPTIONS_VERSION:
		want = C.sizeof_pxn_options
	default:
		return o, hostABI{}, fail(codeNotSup, "pxn_open: options version %d; this library knows versions 1 to %d", v, C.PXN_OPTIONS_VERSION)
	}
	if size < want {
		return o, hostABI{}, fail(codeInvalid, "pxn_open: options struct_size %d; version %d needs at least %d", size, uint32(opts.version), want)
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&o)), want), unsafe.Slice((*byte)(unsafe.Pointer(opts)), want))
	return o, hostABI{legacy: o.version == optionsV1}, nil
}

// readTransport copies the host's transport table. A table of API version
// 3 ends at poll: only struct_size bytes are the host's, and the rest of the
// copy stays zero.
func readTransport(p *C.pxn_transport) (C.pxn_transport, error) {
	var t C.pxn_transport
	size := uint32(p.struct_size)
	if size < transportV3Size {
		return t, fail(codeInvalid, "pxn_open: transport struct_size %d; want at least %d", size, transportV3Size)
	}
	n := min(uintptr(size), unsafe.Sizeof(t))
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&t)), n), unsafe.Slice((*byte)(unsafe.Pointer(p)), n))
	return t, nil
}

// copier is the copier kind the host asked for: API version 2 documented
// DEFAULT as the host copier, and its hosts may register CPU memory as
// device memory under it.
func (a hostABI) copier(kind uint32) uint32 {
	if a.legacy && kind == copierDefault {
		return copierHost
	}
	return kind
}

// opStride is the stride of the op array the host's transport reads.
func (a hostABI) opStride() int {
	if a.legacy {
		return legacyOpSize
	}
	return opSize
}

// opsRouted says whether the host's ops carry route, the keys and
// meaningful flags; a legacy op is the prefix of the struct up to flags,
// and nothing past it is written.
func (a hostABI) opsRouted() bool { return !a.legacy }

// pieceFn is the host's submit_piece, or nil where relayed Pieces go
// through submit op by op: a legacy host has none.
func (a hostABI) pieceFn(t *C.pxn_transport) C.pxn_transport_submit_piece_fn {
	if a.legacy {
		return nil
	}
	return t.submit_piece
}

// unfinished is the state of a task not yet final: WAITING, as Mooncake's
// RdmaTransport reports it, or PENDING for a legacy host.
func (a hostABI) unfinished() int32 {
	if a.legacy {
		return taskPending
	}
	return taskWaiting
}
