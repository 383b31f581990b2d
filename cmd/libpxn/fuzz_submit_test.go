// SPDX-License-Identifier: Apache-2.0

//go:build pxnseams

package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// The memory FuzzSubmit's requests name, in C memory lent to the copying
// transport: each area is areaLen bytes between guards of guardLen bytes
// that nothing may write.
const (
	areaLen  = 4096
	guardLen = 64
)

// submitAreas: sources and destinations of writes, remote sources and
// local destinations of reads.
type submitAreas struct {
	src, dst, rsrc, rdst []byte
}

var (
	areasOnce sync.Once
	areas     submitAreas
)

func theAreas() *submitAreas {
	areasOnce.Do(func() {
		areas = submitAreas{src: seamAlloc(areaLen + 2*guardLen), dst: seamAlloc(areaLen + 2*guardLen),
			rsrc: seamAlloc(areaLen + 2*guardLen), rdst: seamAlloc(areaLen + 2*guardLen)}
	})
	return &areas
}

func (a *submitAreas) all() [][]byte { return [][]byte{a.src, a.dst, a.rsrc, a.rdst} }

// addr is the address of byte off of area b's body.
func addr(b []byte, off int) uint64 { return uint64(uintptr(unsafe.Pointer(&b[guardLen+off]))) }

// fill writes a pattern of seed into every area, guards included.
func (a *submitAreas) fill(seed uint64) {
	x := seed | 1
	for _, b := range a.all() {
		for i := range b {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			b[i] = byte(x)
		}
	}
}

func (a *submitAreas) snapshot() [][]byte {
	out := make([][]byte, 0, 4)
	for _, b := range a.all() {
		out = append(out, bytes.Clone(b))
	}
	return out
}

// A corruption FuzzSubmit applies to one request, and the words the refusal
// must carry.
const (
	corruptNone = iota
	corruptOp
	corruptNullSrc
	corruptSrcWraps
	corruptDstWraps
	corruptNullTarget
	corruptEmptyTarget
	corruptLongTarget
	corruptKinds
)

// refusalWords is what pxn_submit's refusal of r, corrupted by kind, says
// after "request N: ": the bad value.
func refusalWords(r fuzzRequest, kind int) string {
	switch kind {
	case corruptOp:
		return fmt.Sprintf("op %d;", r.op)
	case corruptNullSrc, corruptSrcWraps:
		return fmt.Sprintf("local range %#x+%d", r.src, r.len)
	case corruptDstWraps:
		return fmt.Sprintf("destination %#x+%d wraps", r.dst, r.len)
	case corruptNullTarget:
		return "target is NULL"
	}
	return fmt.Sprintf("target session must be 1..%d bytes", seamMaxSession)
}

// fuzzRequest is a request as FuzzSubmit built it, with its area offsets.
type fuzzRequest struct {
	seamRequest
	read           bool
	srcOff, dstOff int
}

// buildRequests makes up to 8 requests of spec, 8 bytes each, inside the
// areas: op, source and destination offsets, length, target.
func buildRequests(a *submitAreas, spec []byte) []fuzzRequest {
	var rs []fuzzRequest
	for len(spec) >= 8 && len(rs) < 8 {
		b := spec[:8]
		spec = spec[8:]
		r := fuzzRequest{read: b[0]&1 == 1}
		r.srcOff = int(binary.LittleEndian.Uint16(b[1:])) % areaLen
		r.dstOff = int(binary.LittleEndian.Uint16(b[3:])) % areaLen
		n := int(binary.LittleEndian.Uint16(b[5:])) % (areaLen + 1)
		n = min(n, areaLen-max(r.srcOff, r.dstOff))
		r.len = uint64(n)
		switch t := b[7]; {
		case t == 0xff:
			r.target = bytes.Repeat([]byte{'p'}, seamMaxSession)
		default:
			r.target = []byte(fmt.Sprintf("peer%d", t%4))
		}
		if r.read {
			r.op = seamOpRead
			r.src, r.dst = uintptr(addr(a.rdst, r.srcOff)), addr(a.rsrc, r.dstOff)
		} else {
			r.op = seamOpWrite
			r.src, r.dst = uintptr(addr(a.src, r.srcOff)), addr(a.dst, r.dstOff)
		}
		rs = append(rs, r)
	}
	return rs
}

// corrupt applies corruption kind to r; x varies the bad value.
func corrupt(r *fuzzRequest, kind int, x uint32) {
	switch kind {
	case corruptOp:
		r.op = 2 + x%(math.MaxUint32-2)
	case corruptNullSrc:
		r.src, r.len = 0, max(r.len, 1)
	case corruptSrcWraps:
		k := uint64(x % 4096)
		r.src, r.len = uintptr(math.MaxUint64-k), k+2
	case corruptDstWraps:
		k := uint64(x % 4096)
		r.dst, r.len = math.MaxUint64-k, k+2
	case corruptNullTarget:
		r.target = nil
	case corruptEmptyTarget:
		r.target = []byte{}
	case corruptLongTarget:
		r.target = bytes.Repeat([]byte{'q'}, seamMaxSession+1+int(x%64))
	}
}

// FuzzSubmit calls pxn_submit as a C host would, on an engine with PXN off
// whose transport copies each op inside memory the harness lent it, with
// up to 8 requests the fuzzer placed in that memory, one of them possibly
// corrupted (bad op, NULL or wrapping ranges, NULL, empty or overlong
// target), NULL requests or a NULL out. A bad input gets PXN_EINVAL naming
// the first bad request, batch 0, and no op reaches the transport. A good
// one, none included, gets a batch whose tasks all complete with their
// length; every op lies inside one request's source and destination, and
// every byte of the areas (guards included) either is untouched or, inside
// a request's destination, holds that request's source byte.
func FuzzSubmit(f *testing.F) {
	f.Setenv("MC_PXN_ENABLE", "0")
	one := []byte{0, 0, 0, 0, 0, 0x10, 0, 1}
	two := append(bytes.Clone(one), 1, 0x20, 0, 0x40, 0, 0, 2, 2)
	f.Add(one, uint8(0), uint8(0), uint32(0), false, false)
	f.Add(two, uint8(0), uint8(1), uint32(0), false, false)
	f.Add(append(bytes.Clone(two), 0, 0, 0, 0x08, 0, 0, 0x20, 0xff), uint8(0), uint8(0), uint32(0), false, false)
	for kind := 1; kind < corruptKinds; kind++ {
		f.Add(two, uint8(kind), uint8(kind), uint32(kind*977), false, false)
	}
	f.Add(two, uint8(0), uint8(0), uint32(0), true, false)
	f.Add(two, uint8(0), uint8(0), uint32(0), false, true)
	f.Add([]byte{}, uint8(0), uint8(0), uint32(0), false, false)
	f.Fuzz(func(t *testing.T, spec []byte, kind, at uint8, x uint32, nullReqs, nullOut bool) {
		a := theAreas()
		seamCopyingReset()
		for _, b := range a.all() {
			if !seamLend(b[guardLen : guardLen+areaLen]) {
				t.Fatal("the copying transport took no more memory")
			}
		}
		a.fill(uint64(len(spec))*7919 + uint64(x))
		before := a.snapshot()
		rs := buildRequests(a, spec)
		bad := -1
		if k := int(kind) % corruptKinds; k != corruptNone && len(rs) > 0 {
			bad = int(at) % len(rs)
			corrupt(&rs[bad], k, x)
		}
		reqs := make([]seamRequest, len(rs))
		for i := range rs {
			reqs[i] = rs[i].seamRequest
		}
		code, h, msg := seamOpen(seamOpenArgs{size: seamOptionsSize, version: seamOptionsV2, transport: true,
			transportSize: seamTransportSize, submit: true, poll: true, copier: copierHost, copying: true})
		if code != int(codeOK) {
			t.Fatalf("pxn_open: %d %s", code, msg)
		}
		defer func() {
			if rc := seamClose(h); rc != int(codeOK) {
				t.Errorf("pxn_close = %d", rc)
			}
		}()

		code, batch, msg := seamSubmit(h, reqs, nullReqs, nullOut)
		wantWords := ""
		switch {
		case nullOut:
			wantWords = "out is NULL"
		case nullReqs && len(reqs) > 0:
			wantWords = fmt.Sprintf("%d requests at NULL", len(reqs))
		case bad >= 0:
			wantWords = fmt.Sprintf("request %d: %s", bad, refusalWords(rs[bad], int(kind)%corruptKinds))
		}
		if wantWords != "" {
			if code != int(codeInvalid) || !strings.Contains(msg, wantWords) || batch != 0 {
				t.Fatalf("pxn_submit(%+v) = %d, batch %d, %q; want PXN_EINVAL, batch 0, saying %q", rs, code, batch, msg, wantWords)
			}
			if ops, _ := seamCopied(); len(ops) != 0 {
				t.Fatalf("a refused submit handed %d ops to the transport", len(ops))
			}
			checkUntouched(t, a, before)
			return
		}
		if code != int(codeOK) || batch == 0 {
			t.Fatalf("pxn_submit(%+v) = %d, batch %d: %s", rs, code, batch, msg)
		}
		deadline := time.Now().Add(10 * time.Second)
		for i, r := range rs {
			for {
				rc, state, moved := seamStatus(h, batch, i)
				if rc != int(codeOK) {
					t.Fatalf("pxn_get_status(%d, %d) = %d", batch, i, rc)
				}
				if state == taskCompleted && moved == r.len {
					break
				}
				if state != taskWaiting && state != taskPending {
					t.Fatalf("request %d (%+v) ended in state %d with %d bytes moved", i, r, state, moved)
				}
				if time.Now().After(deadline) {
					t.Fatalf("request %d (%+v) is not final after 10s (state %d)", i, r, state)
				}
			}
		}
		if rc := seamFreeBatch(h, batch); rc != int(codeOK) {
			t.Fatalf("pxn_free_batch(%d) = %d", batch, rc)
		}
		ops, outside := seamCopied()
		if outside != 0 {
			t.Fatalf("%d of %d ops reached outside the memory the requests name", outside, len(ops))
		}
		for _, op := range ops {
			if !opInsideARequest(op, rs) {
				t.Fatalf("op %+v lies inside no request of %+v", op, rs)
			}
		}
		checkCopied(t, a, before, rs)
	})
}

// opInsideARequest says whether op moves part of one request: same
// direction and target, its destination inside the request's and its
// source at the same offset.
func opInsideARequest(op seamOp, rs []fuzzRequest) bool {
	for _, r := range rs {
		if op.read != r.read || op.target != string(r.target) || op.flags != 0 {
			continue
		}
		if op.dst < r.dst || op.len > r.len || op.dst-r.dst > r.len-op.len {
			continue
		}
		if op.src-uint64(r.src) == op.dst-r.dst {
			return true
		}
	}
	return false
}

func checkUntouched(t *testing.T, a *submitAreas, before [][]byte) {
	t.Helper()
	for i, b := range a.all() {
		if j := firstDiff(b, before[i]); j >= 0 {
			t.Fatalf("area %d byte %d changed although nothing was accepted", i, j-guardLen)
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// checkCopied: the sources are untouched, and each destination byte is
// untouched or, inside requests' destinations, one such request's source
// byte.
func checkCopied(t *testing.T, a *submitAreas, before [][]byte, rs []fuzzRequest) {
	t.Helper()
	if j := firstDiff(a.src, before[0]); j >= 0 {
		t.Fatalf("write source byte %d changed", j-guardLen)
	}
	if j := firstDiff(a.rsrc, before[2]); j >= 0 {
		t.Fatalf("read source byte %d changed", j-guardLen)
	}
	for _, side := range []struct {
		read     bool
		dst, src []byte
		was      []byte
	}{{false, a.dst, before[0], before[1]}, {true, a.rdst, before[2], before[3]}} {
		for j := range side.dst {
			off := j - guardLen
			covered, ok := false, false
			for _, r := range rs {
				d, s := r.dstOff, r.srcOff
				if r.read {
					d, s = r.srcOff, r.dstOff
				}
				if r.read != side.read || off < d || off >= d+int(r.len) {
					continue
				}
				covered = true
				ok = ok || side.dst[j] == side.src[guardLen+s+(off-d)]
			}
			if !covered && side.dst[j] != side.was[j] {
				t.Fatalf("read=%v: byte %d outside every request's destination changed (requests %+v)", side.read, off, rs)
			}
			if covered && !ok {
				t.Fatalf("read=%v: byte %d holds no covering request's source byte (requests %+v)", side.read, off, rs)
			}
		}
	}
}
