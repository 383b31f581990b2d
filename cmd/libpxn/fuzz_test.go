// SPDX-License-Identifier: Apache-2.0

//go:build pxnseams

package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// openRefusal is what pxn_open must answer for a, before it builds an
// engine: the code and words of the message, or codeOK when a passes
// every check of the options.
func openRefusal(a seamOpenArgs) (int32, string) {
	size, version := int(a.size), a.version
	want := 0
	switch {
	case size < optionsV1Size:
		return codeInvalid, fmt.Sprintf("options struct_size %d; want at least %d", size, optionsV1Size)
	case version == optionsV1:
		want = optionsV1Size
	case version == seamOptionsV2:
		want = seamOptionsSize
	default:
		return codeNotSup, fmt.Sprintf("options version %d;", version)
	}
	switch {
	case size < want:
		return codeInvalid, fmt.Sprintf("options struct_size %d; version %d needs at least %d", size, version, want)
	case !a.transport:
		return codeInvalid, "options.transport is NULL"
	case a.transportSize < transportV3Size:
		return codeInvalid, fmt.Sprintf("transport struct_size %d", a.transportSize)
	case !a.submit || !a.poll:
		return codeInvalid, "needs both submit and poll"
	}
	hca := a.hca
	if i := bytes.IndexByte(hca, 0); i >= 0 {
		hca = hca[:i]
	}
	// A version 1 struct ends before the arena callbacks and flags: the
	// host's bytes past it are not read.
	legacy := version == optionsV1
	switch {
	case a.hca != nil && len(hca) > maxHCAName:
		return codeInvalid, fmt.Sprintf("options.local_hca is longer than %d bytes", maxHCAName)
	case !legacy && a.register != a.deregister:
		return codeInvalid, "register_arena and deregister_arena must both be set"
	case !legacy && a.flags&^seamOpenCUDA != 0:
		return codeInvalid, fmt.Sprintf("unknown flags %#x", a.flags&^seamOpenCUDA)
	}
	return codeOK, ""
}

// FuzzOpen calls pxn_open as a C host would, with options and a transport
// table whose sizes, version, flags, copier, batch bound, HCA name and
// callbacks the fuzzer chose (the callbacks are stand-ins or NULL). Every
// check of the options answers as pxn.h says, with a message naming the
// value; options that pass them open an engine or fail with a message,
// never PXN_EINTERNAL (a panic), and an engine opened closes.
func FuzzOpen(f *testing.F) {
	f.Setenv("MC_PXN_ENABLE", "0")
	full := uint32(seamOptionsSize)
	f.Add(full, uint32(seamOptionsV2), []byte("mlx5_0"), true, uint32(seamTransportSize), uint8(0b11111), uint32(copierHost), uint32(0), uint32(0))
	f.Add(uint32(optionsV1Size), uint32(optionsV1), []byte{}, true, uint32(transportV3Size), uint8(0b00011), uint32(copierDefault), uint32(4), uint32(0))
	f.Add(full, uint32(seamOptionsV2), []byte(nil), true, uint32(seamTransportSize), uint8(0b01011), uint32(copierHost), uint32(0), uint32(0))
	f.Add(full, uint32(seamOptionsV2), []byte(strings.Repeat("m", 64)), true, uint32(seamTransportSize), uint8(0b00011), uint32(copierHost), uint32(0), uint32(0))
	f.Add(full, uint32(3), []byte("mlx5_0"), true, uint32(seamTransportSize), uint8(0b00011), uint32(copierHost), uint32(0), uint32(0))
	f.Add(full-1, uint32(seamOptionsV2), []byte("mlx5_0"), true, uint32(seamTransportSize), uint8(0b00011), uint32(copierHost), uint32(0), uint32(2))
	f.Add(full, uint32(seamOptionsV2), []byte("mlx5_0"), false, uint32(0), uint8(0b00001), uint32(99), uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, size, version uint32, hca []byte, transport bool, transportSize uint32, callbacks uint8, copier, maxBatches, flags uint32) {
		a := seamOpenArgs{size: size, version: version, hca: hca, transport: transport, transportSize: transportSize,
			submit: callbacks&1 != 0, poll: callbacks&2 != 0, piece: callbacks&4 != 0,
			register: callbacks&8 != 0, deregister: callbacks&16 != 0,
			copier: copier, maxBatches: maxBatches, flags: flags}
		if callbacks&32 != 0 {
			a.hca = nil
		}
		code, h, msg := seamOpen(a)
		wantCode, wantMsg := openRefusal(a)
		if wantCode != codeOK {
			if code != int(wantCode) || !strings.Contains(msg, wantMsg) {
				t.Fatalf("pxn_open(%+v) = %d %q, want %d saying %q", a, code, msg, wantCode, wantMsg)
			}
			if h != 0 {
				t.Fatalf("pxn_open(%+v) failed with engine %d", a, h)
			}
			return
		}
		switch {
		case code == int(codeInternal):
			t.Fatalf("pxn_open(%+v) = PXN_EINTERNAL: %s", a, msg)
		case code != int(codeOK):
			if msg == "" || h != 0 {
				t.Fatalf("pxn_open(%+v) = %d with engine %d and message %q", a, code, h, msg)
			}
			return
		case h == 0:
			t.Fatalf("pxn_open(%+v) succeeded with engine 0", a)
		}
		if rc := seamClose(h); rc != int(codeOK) {
			t.Fatalf("pxn_close of engine %d from %+v = %d", h, a, rc)
		}
	})
}

// TestSeamOpensAnEngine: options a host of this ABI would pass open an
// engine through the seam FuzzOpen uses, so that its fuzzing reaches past
// the checks.
func TestSeamOpensAnEngine(t *testing.T) {
	t.Setenv("MC_PXN_ENABLE", "0")
	for _, a := range []seamOpenArgs{
		{size: seamOptionsSize, version: seamOptionsV2, hca: []byte("mlx5_0"), transport: true, transportSize: seamTransportSize,
			submit: true, poll: true, piece: true, register: true, deregister: true, copier: copierHost},
		{size: uint32(optionsV1Size), version: optionsV1, transport: true, transportSize: transportV3Size, submit: true, poll: true},
	} {
		code, h, msg := seamOpen(a)
		if code != int(codeOK) || h == 0 {
			t.Fatalf("pxn_open(%+v) = %d, engine %d: %s", a, code, h, msg)
		}
		if rc := seamClose(h); rc != int(codeOK) {
			t.Fatalf("pxn_close(%d) = %d", h, rc)
		}
		if code, _, msg := seamOpen(seamOpenArgs{size: a.size, version: a.version}); code != int(codeInvalid) || !strings.Contains(msg, "transport is NULL") {
			t.Fatalf("pxn_open without a transport = %d %q", code, msg)
		}
	}
}
