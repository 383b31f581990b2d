// SPDX-License-Identifier: Apache-2.0

//go:build pxnseams

package main

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// targetCall is one call FuzzRegisterTargets makes: register_target,
// register_target_info or unregister_target.
type targetCall struct {
	kind       int
	session    []byte
	hca        []byte
	info       seamTargetInfo
	base, n    uint64
	probe      uint64
	infoHCALen int
}

const (
	callRegister = iota
	callRegisterInfo
	callUnregister
)

var (
	fuzzSessions = [][]byte{[]byte("s0"), []byte("s1"), []byte("s2"), []byte("s3"), nil, {},
		bytes.Repeat([]byte{'s'}, seamMaxSession), bytes.Repeat([]byte{'s'}, seamMaxSession+1)}
	fuzzHCAs = [][]byte{[]byte("mlx5_0"), []byte("mlx5_1"), nil, {},
		bytes.Repeat([]byte{'h'}, maxHCAName), bytes.Repeat([]byte{'h'}, maxHCAName+1)}
)

// decodeCall reads one call from 16 bytes: kind, session, HCA, hca_count
// (255: info NULL), base (small unless its low bit is set), length (small
// unless its low bit is set; 0xff in its second byte: wraps past the end),
// route.
func decodeCall(b []byte) targetCall {
	c := targetCall{kind: int(b[0]) % 3, session: fuzzSessions[int(b[1])%len(fuzzSessions)]}
	c.hca = fuzzHCAs[int(b[2])%len(fuzzHCAs)]
	c.base = binary.LittleEndian.Uint64(b[4:12])
	if b[4]&1 == 0 {
		c.base %= 8192
	}
	c.n = uint64(binary.LittleEndian.Uint32(b[12:16]))
	if b[12]&1 == 0 {
		c.n %= 2048
	}
	if b[13] == 0xff {
		c.n = math.MaxUint64 - c.base + 2
	}
	c.probe = c.base + uint64(b[14]) - 128
	c.info = seamTargetInfo{hcaCount: uint32(b[3] % 3), base: c.base, len: c.n, route: uint64(b[15] % 4), remoteKey: uint64(b[15])}
	c.info.null = b[3] == 0xff
	c.infoHCALen = copy(c.info.hca[:], c.hca)
	return c
}

type modelRange struct {
	base, n uint64
	hca     string
}

// expect is what the call must answer against the model: "" for success,
// else words of the PXN_EINVAL message. It updates the model on success.
func expect(model map[string][]modelRange, c targetCall) string {
	switch {
	case c.session == nil:
		return "session is NULL"
	case len(c.session) > seamMaxSession:
		return fmt.Sprintf("session is longer than %d bytes", seamMaxSession)
	}
	s := string(c.session)
	hca := string(c.hca)
	switch c.kind {
	case callUnregister:
		if _, ok := model[s]; !ok {
			return fmt.Sprintf("target %q is not registered", s)
		}
		delete(model, s)
		return ""
	case callRegister:
		switch {
		case c.hca == nil:
			return "hca is NULL"
		case len(c.hca) > maxHCAName:
			return fmt.Sprintf("hca is longer than %d bytes", maxHCAName)
		}
	case callRegisterInfo:
		switch {
		case c.info.null:
			return "info is NULL"
		case c.info.hcaCount != 1:
			return fmt.Sprintf("hca_count %d", c.info.hcaCount)
		}
		hca = string(c.info.hca[:c.infoHCALen])
	}
	switch {
	case s == "":
		return "target session of 0 bytes"
	case hca == "" || len(hca) > maxHCAName:
		return fmt.Sprintf("HCA name of %d bytes", len(hca))
	case c.n == 0 || c.n-1 > math.MaxUint64-c.base:
		return fmt.Sprintf("range %#x+%d is empty or wraps", c.base, c.n)
	}
	for _, r := range model[s] {
		if c.base <= r.base+(r.n-1) && r.base <= c.base+(c.n-1) {
			return fmt.Sprintf("range %#x+%d overlaps registered range %#x+%d", c.base, c.n, r.base, r.n)
		}
	}
	// Kept by base, as the directory does: a refusal names the lowest
	// range the new one overlaps.
	model[s] = append(model[s], modelRange{base: c.base, n: c.n, hca: hca})
	slices.SortFunc(model[s], func(a, b modelRange) int { return cmp.Compare(a.base, b.base) })
	return ""
}

// FuzzRegisterTargets makes up to 16 calls of pxn_register_target,
// pxn_register_target_info and pxn_unregister_target on one engine with
// NULL, empty, longest and overlong sessions and HCA names, bad hca_counts,
// empty, wrapping and overlapping ranges. Each answers as a model of the
// rules in pxn.h says, refusals with PXN_EINVAL naming the value; after
// each call the engine's directory resolves both ends of every range the
// model holds to that range and its HCA, and a probe address near the
// call's range resolves exactly when a model range holds it.
func FuzzRegisterTargets(f *testing.F) {
	f.Setenv("MC_PXN_ENABLE", "0")
	call := func(kind, session, hca, count byte, base uint64, n uint32, wrap, probe, route byte) []byte {
		b := []byte{kind, session, hca, count}
		b = binary.LittleEndian.AppendUint64(b, base)
		b = binary.LittleEndian.AppendUint32(b, n)
		b[13], b[14], b[15] = wrap, probe, route
		return b
	}
	f.Add(call(0, 0, 0, 1, 0x1000, 0x100, 0, 128, 0))
	f.Add(slices2(call(0, 0, 0, 1, 0x1000, 0x100, 0, 128, 0), call(1, 0, 1, 1, 0x1080, 0x100, 0, 200, 1)))
	f.Add(slices2(call(1, 1, 0, 1, 0x1000, 0x100, 0, 128, 2), call(2, 1, 0, 0, 0, 0, 0, 128, 0), call(2, 1, 0, 0, 0, 0, 0, 128, 0)))
	f.Add(slices2(call(0, 4, 0, 1, 0, 16, 0, 0, 0), call(0, 7, 0, 1, 0, 16, 0, 0, 0), call(0, 6, 5, 1, 0, 16, 0, 0, 0), call(0, 6, 4, 1, 0, 16, 0, 0, 0)))
	f.Add(slices2(call(1, 2, 0, 2, 0, 16, 0, 0, 0), call(1, 2, 0, 0xff, 0, 16, 0, 0, 0), call(0, 3, 0, 1, 0x1001, 16, 0xff, 0, 0), call(0, 3, 0, 1, 0x1000, 0, 0, 0, 0)))
	f.Fuzz(func(t *testing.T, script []byte) {
		code, h, msg := seamOpen(seamOpenArgs{size: seamOptionsSize, version: seamOptionsV2, transport: true,
			transportSize: seamTransportSize, submit: true, poll: true, copier: copierHost})
		if code != int(codeOK) {
			t.Fatalf("pxn_open: %d %s", code, msg)
		}
		defer seamClose(h)
		model := map[string][]modelRange{}
		for i := 0; len(script) >= 16 && i < 16; i++ {
			c := decodeCall(script[:16])
			script = script[16:]
			want := expect(model, c)
			var code int
			var msg string
			switch c.kind {
			case callRegister:
				code, msg = seamRegisterTarget(h, c.session, c.hca, c.base, c.n)
			case callRegisterInfo:
				code, msg = seamRegisterTargetInfo(h, c.session, c.info)
			default:
				code, msg = seamUnregisterTarget(h, c.session)
			}
			if want == "" && code != int(codeOK) || want != "" && (code != int(codeInvalid) || !strings.Contains(msg, want)) {
				t.Fatalf("call %d %+v = %d %q; want %q (PXN_EINVAL unless empty)", i, c, code, msg, want)
			}
			checkDirectory(t, h, model, c)
		}
	})
}

func slices2(calls ...[]byte) []byte { return bytes.Join(calls, nil) }

// checkDirectory compares the engine's directory with the model.
func checkDirectory(t *testing.T, h uint64, model map[string][]modelRange, c targetCall) {
	t.Helper()
	err := handles.with(h, func(e *engine) error {
		for s, rs := range model {
			for _, r := range rs {
				for _, at := range []uint64{r.base, r.base + (r.n - 1)} {
					got, err := e.table.Resolve(s, at)
					if err != nil || len(got.HCAs) != 1 || got.HCAs[0] != r.hca || len(got.Ranges) != 1 ||
						got.Ranges[0].Addr != r.base || got.Ranges[0].Len != r.n {
						return fmt.Errorf("resolve %q at %#x = %+v, %v; want %+v", s, at, got, err, r)
					}
				}
			}
		}
		s := string(c.session)
		held := false
		for _, r := range model[s] {
			held = held || c.probe >= r.base && c.probe-r.base < r.n
		}
		if _, err := e.table.Resolve(s, c.probe); (err == nil) != held {
			return fmt.Errorf("resolve %q at %#x: %v; a model range holds it: %v", s, c.probe, err, held)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
