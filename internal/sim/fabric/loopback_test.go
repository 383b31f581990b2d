// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/relay"
)

const loopBase = 0x7f00_0000_0000

func pollAll(h relay.Hop, want int) []relay.HopCompletion {
	out := make([]relay.HopCompletion, 0, want)
	buf := make([]relay.HopCompletion, 3)
	for {
		n := h.Poll(buf)
		if n == 0 {
			return out
		}
		out = append(out, buf[:n]...)
	}
}

func TestLoopbackBounds(t *testing.T) {
	l := NewLoopback(LoopbackOptions{})
	dst := make([]byte, 4096)
	if err := l.AddTarget("kv", "mlx5_3", dst, loopBase); err != nil {
		t.Fatal(err)
	}
	src := mapped(t, 4096)
	fill(src, 1)
	tests := []struct {
		name    string
		op      relay.WriteOp
		wantErr error
	}{
		{"whole buffer", relay.WriteOp{Src: addr(src), Len: 4096, Target: "kv", Dst: loopBase}, nil},
		{"last byte", relay.WriteOp{Src: addr(src), Len: 1, Target: "kv", Dst: loopBase + 4095}, nil},
		{"empty at the end", relay.WriteOp{Len: 0, Target: "kv", Dst: loopBase + 4096}, nil},
		{"one past the end", relay.WriteOp{Src: addr(src), Len: 2, Target: "kv", Dst: loopBase + 4095}, ErrOutOfRange},
		{"below the base", relay.WriteOp{Src: addr(src), Len: 1, Target: "kv", Dst: loopBase - 1}, ErrOutOfRange},
		{"length wraps", relay.WriteOp{Src: addr(src), Len: math.MaxUint64, Target: "kv", Dst: loopBase + 1}, ErrOutOfRange},
		{"dst at the top", relay.WriteOp{Src: addr(src), Len: 16, Target: "kv", Dst: math.MaxUint64 - 7}, ErrOutOfRange},
		{"unknown session", relay.WriteOp{Src: addr(src), Len: 1, Target: "nope", Dst: loopBase}, ErrUnknownSession},
	}
	for i, tt := range tests {
		tt.op.Token = uint64(i) + 100
		clear(dst)
		if err := l.Submit([]relay.WriteOp{tt.op}); err != nil {
			t.Fatalf("%s: Submit: %v", tt.name, err)
		}
		got := pollAll(l, 1)
		if len(got) != 1 || got[0].Token != tt.op.Token {
			t.Fatalf("%s: completions %+v, want one for token %d", tt.name, got, tt.op.Token)
		}
		if tt.wantErr == nil {
			if got[0].Err != nil {
				t.Errorf("%s: %v", tt.name, got[0].Err)
			}
			off := tt.op.Dst - loopBase
			if i := firstDiff(dst[off:off+tt.op.Len], src[:tt.op.Len]); i >= 0 {
				t.Errorf("%s: byte %d differs", tt.name, i)
			}
			continue
		}
		if !errors.Is(got[0].Err, tt.wantErr) {
			t.Errorf("%s: completion error %v, want %v", tt.name, got[0].Err, tt.wantErr)
		}
		if slices.ContainsFunc(dst, func(b byte) bool { return b != 0 }) {
			t.Errorf("%s: a failed op wrote to the target", tt.name)
		}
	}
}

func TestLoopbackFailureHooks(t *testing.T) {
	l := NewLoopback(LoopbackOptions{})
	a, b := make([]byte, 1024), make([]byte, 1024)
	if err := l.AddTarget("a", "mlx5_0", a, loopBase); err != nil {
		t.Fatal(err)
	}
	if err := l.AddTarget("b", "mlx5_1", b, loopBase); err != nil {
		t.Fatal(err)
	}
	src := mapped(t, 1024)
	fill(src, 2)
	sessionDown := errors.New("session a is down")
	rangeBad := errors.New("range is bad")
	l.FailSession("a", sessionDown)
	l.FailRange("b", relay.Range{Addr: loopBase + 512, Len: 16}, rangeBad)
	ops := []relay.WriteOp{
		{Src: addr(src), Len: 8, Target: "a", Dst: loopBase, Token: 1},
		{Src: addr(src), Len: 512, Target: "b", Dst: loopBase, Token: 2},
		{Src: addr(src), Len: 1, Target: "b", Dst: loopBase + 527, Token: 3},
		{Src: addr(src), Len: 8, Target: "b", Dst: loopBase + 528, Token: 4},
		{Src: addr(src), Len: 1024, Target: "b", Dst: loopBase, Token: 5},
	}
	if err := l.Submit(ops); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]error{1: sessionDown, 2: nil, 3: rangeBad, 4: nil, 5: rangeBad}
	got := pollAll(l, len(ops))
	if len(got) != len(ops) {
		t.Fatalf("%d completions, want %d", len(got), len(ops))
	}
	for _, c := range got {
		if w := want[c.Token]; (w == nil) != (c.Err == nil) || (w != nil && !errors.Is(c.Err, w)) {
			t.Errorf("token %d: %v, want %v", c.Token, c.Err, w)
		}
	}
	if slices.ContainsFunc(a, func(b byte) bool { return b != 0 }) {
		t.Error("a failed session was written")
	}
	l.ClearFailures()
	if err := l.Submit(ops[:1]); err != nil {
		t.Fatal(err)
	}
	if got := pollAll(l, 1); len(got) != 1 || got[0].Err != nil {
		t.Fatalf("after ClearFailures: %+v", got)
	}
	if st := l.Stats(); st.Submitted != 6 || st.Succeeded != 3 || st.Failed != 3 || st.Bytes != 528 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLoopbackOutOfOrderRelease(t *testing.T) {
	l := NewLoopback(LoopbackOptions{HoldCompletions: true})
	dst := make([]byte, 5*64)
	if err := l.AddTarget("kv", "mlx5_0", dst, loopBase); err != nil {
		t.Fatal(err)
	}
	src := mapped(t, 5*64)
	fill(src, 3)
	var ops []relay.WriteOp
	for i := range 5 {
		ops = append(ops, relay.WriteOp{Src: addr(src) + uintptr(i*64), Len: 64, Target: "kv", Dst: loopBase + uint64(i*64), Token: uint64(i) + 1})
	}
	if err := l.Submit(ops); err != nil {
		t.Fatal(err)
	}
	if got := l.Held(); !slices.Equal(got, []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("Held = %v", got)
	}
	if got := pollAll(l, 0); len(got) != 0 {
		t.Fatalf("held ops completed: %+v", got)
	}
	if slices.ContainsFunc(dst, func(b byte) bool { return b != 0 }) {
		t.Fatal("a held op was performed")
	}
	if err := l.Complete(3); err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(1); err != nil {
		t.Fatal(err)
	}
	secondHop := errors.New("second hop failed")
	if err := l.Fail(2, secondHop); err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(3); err == nil {
		t.Fatal("token 3 completed twice")
	}
	got := pollAll(l, 3)
	if len(got) != 3 || got[0].Token != 3 || got[1].Token != 1 || got[2].Token != 2 {
		t.Fatalf("completions %+v, want tokens 3, 1, 2 in that order", got)
	}
	if got[0].Err != nil || got[1].Err != nil || !errors.Is(got[2].Err, secondHop) {
		t.Fatalf("completion errors %v %v %v", got[0].Err, got[1].Err, got[2].Err)
	}
	if i := firstDiff(dst[2*64:3*64], src[2*64:3*64]); i >= 0 {
		t.Fatalf("token 3 not performed (byte %d)", i)
	}
	if slices.ContainsFunc(dst[64:128], func(b byte) bool { return b != 0 }) {
		t.Fatal("the failed op was performed")
	}
	if n := l.CompleteAll(); n != 2 {
		t.Fatalf("CompleteAll released %d, want 2", n)
	}
	got = pollAll(l, 2)
	if len(got) != 2 || got[0].Token != 4 || got[1].Token != 5 {
		t.Fatalf("completions %+v, want tokens 4, 5", got)
	}
	if i := firstDiff(dst[3*64:], src[3*64:]); i >= 0 {
		t.Fatalf("byte %d of tokens 4-5 differs", i)
	}
}

func TestLoopbackBusy(t *testing.T) {
	l := NewLoopback(LoopbackOptions{QueueDepth: 4, HoldCompletions: true})
	if err := l.AddTarget("kv", "mlx5_0", make([]byte, 8), loopBase); err != nil {
		t.Fatal(err)
	}
	op := func(tok uint64) relay.WriteOp { return relay.WriteOp{Target: "kv", Dst: loopBase, Token: tok} }
	if err := l.Submit([]relay.WriteOp{op(1), op(2), op(3)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Submit([]relay.WriteOp{op(4), op(5)}); !errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("Submit over the depth = %v, want ErrHopBusy", err)
	}
	if got := l.Held(); len(got) != 3 {
		t.Fatalf("a busy Submit accepted part of its batch: held %v", got)
	}
	if err := l.Submit([]relay.WriteOp{op(4)}); err != nil {
		t.Fatal(err)
	}
	l.CompleteAll()
	// Completions not yet polled still count.
	if err := l.Submit([]relay.WriteOp{op(5)}); !errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("Submit with 4 unpolled completions = %v, want ErrHopBusy", err)
	}
	if got := pollAll(l, 4); len(got) != 4 {
		t.Fatalf("%d completions", len(got))
	}
	l.SetHold(false)
	l.SetBusy(true)
	if err := l.Submit([]relay.WriteOp{op(5)}); !errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("forced busy: %v", err)
	}
	l.SetBusy(false)
	if err := l.Submit([]relay.WriteOp{op(5)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Submit(make([]relay.WriteOp, 5)); err == nil || errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("batch larger than the depth: %v, want a non-busy error", err)
	}
	if st := l.Stats(); st.Busy != 3 || st.Submitted != 5 || st.Unpolled != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLoopbackDirectory(t *testing.T) {
	l := NewLoopback(LoopbackOptions{})
	if err := l.AddTarget("kv", "mlx5_2", make([]byte, 100), 1000); err != nil {
		t.Fatal(err)
	}
	tg, err := l.Resolve("kv", 1099)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tg.HCAs, []string{"mlx5_2"}) || !slices.Equal(tg.Ranges, []relay.Range{{Addr: 1000, Len: 100, Key: 1}}) {
		t.Fatalf("Resolve = %+v", tg)
	}
	if err := l.AddTarget("kv", "mlx5_2", make([]byte, 10), 1050); err == nil {
		t.Fatal("overlapping AddTarget accepted")
	}
	if err := l.AddTarget("kv", "mlx5_5", make([]byte, 10), 5000); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tg.HCAs, []string{"mlx5_2"}) || len(tg.Ranges) != 1 {
		t.Fatalf("AddTarget modified a resolved target: %+v", tg)
	}
	tg2, err := l.Resolve("kv", 5000)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tg2.HCAs, []string{"mlx5_2", "mlx5_5"}) || !slices.Equal(tg2.Ranges, []relay.Range{{Addr: 1000, Len: 100, Key: 1}, {Addr: 5000, Len: 10, Key: 2}}) {
		t.Fatalf("Resolve after a second HCA = %+v", tg2)
	}
	if _, err := l.Resolve("kv", 1100); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Resolve past the range: %v", err)
	}
	if _, err := l.Resolve("other", 1000); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("Resolve of an unknown session: %v", err)
	}
	for _, bad := range []struct {
		session, hca string
		n            int
		base         uint64
	}{{"", "h", 1, 0}, {"s", "", 1, 0}, {"s", "h", 0, 0}, {"s", "h", 2, math.MaxUint64}} {
		if err := l.AddTarget(bad.session, bad.hca, make([]byte, bad.n), bad.base); err == nil {
			t.Errorf("AddTarget(%q, %q, %d bytes, %#x) accepted", bad.session, bad.hca, bad.n, bad.base)
		}
	}
}

// doOne submits op alone and returns its completion's error.
func doOne(t *testing.T, l *Loopback, op relay.WriteOp) error {
	t.Helper()
	if err := l.Submit([]relay.WriteOp{op}); err != nil {
		t.Fatalf("Submit token %d: %v", op.Token, err)
	}
	got := pollAll(l, 1)
	if len(got) != 1 || got[0].Token != op.Token {
		t.Fatalf("completions %+v, want one for token %d", got, op.Token)
	}
	return got[0].Err
}

func nonZero(b []byte) bool { return slices.ContainsFunc(b, func(x byte) bool { return x != 0 }) }

// routedLoopback registers session "a" as three buffers, added out of
// address order so that a Key is not a position among sorted ranges, and
// session "b" as one.
func routedLoopback(t *testing.T) (*Loopback, [][]byte) {
	t.Helper()
	l := NewLoopback(LoopbackOptions{})
	bufs := [][]byte{make([]byte, 256), make([]byte, 128), make([]byte, 512), make([]byte, 256)}
	for i, r := range []struct {
		session string
		base    uint64
	}{{"a", loopBase + 0x3000}, {"a", loopBase + 0x1000}, {"a", loopBase + 0x2000}, {"b", loopBase + 0x1000}} {
		if err := l.AddTarget(r.session, "mlx5_0", bufs[i], r.base); err != nil {
			t.Fatal(err)
		}
	}
	return l, bufs
}

func TestLoopbackRoutedOps(t *testing.T) {
	l, bufs := routedLoopback(t)
	src := mapped(t, 512)
	fill(src, 21)
	route, err := l.Route("a")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := l.Resolve("a", loopBase+0x2000)
	if err != nil {
		t.Fatal(err)
	}
	if len(tg.Ranges) != 3 {
		t.Fatalf("Resolve = %+v, want 3 ranges", tg)
	}
	// Each range's Key must take an op to that range's own buffer.
	want := map[uint64][]byte{loopBase + 0x3000: bufs[0], loopBase + 0x1000: bufs[1], loopBase + 0x2000: bufs[2]}
	keys := map[uint64]bool{}
	for i, r := range tg.Ranges {
		if r.Key == 0 || keys[r.Key] {
			t.Fatalf("range %d %+v: keys must be distinct and non-zero", i, r)
		}
		keys[r.Key] = true
		buf := want[r.Addr]
		off := uint64(16 * (i + 1))
		n := r.Len - off
		op := relay.WriteOp{Src: addr(src), Len: n, Target: "a", Dst: r.Addr + off, Token: uint64(i) + 1, Route: route, Key: r.Key}
		if err := doOne(t, l, op); err != nil {
			t.Fatalf("routed op to range %#x key %d: %v", r.Addr, r.Key, err)
		}
		if nonZero(buf[:off]) {
			t.Fatalf("range %#x: bytes before dst written", r.Addr)
		}
		if i := firstDiff(buf[off:], src[:n]); i >= 0 {
			t.Fatalf("range %#x key %d: byte %d differs", r.Addr, r.Key, i)
		}
	}
	// A route without a Key (a directory that gives none) searches the
	// session's ranges, still without a lookup by name.
	clear(bufs[1])
	if err := doOne(t, l, relay.WriteOp{Src: addr(src), Len: 8, Target: "a", Dst: loopBase + 0x1000 + 8, Token: 10, Route: route}); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(bufs[1][8:16], src[:8]); i >= 0 {
		t.Fatalf("routed op without a key: byte %d differs", i)
	}
	if nonZero(bufs[3]) {
		t.Fatal("session b was written by ops routed to a")
	}
	st := l.Stats()
	if st.Lookups != 0 || st.Routed != 4 || st.Routes != 1 || st.Resolves != 1 || st.Succeeded != 4 {
		t.Fatalf("stats %+v, want 4 routed ops, no lookup, 1 route, 1 resolve", st)
	}
	// An op without a route is looked up as before.
	if err := doOne(t, l, relay.WriteOp{Src: addr(src), Len: 8, Target: "b", Dst: loopBase + 0x1000, Token: 11}); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Lookups != 1 || st.Routed != 4 {
		t.Fatalf("stats %+v after an unrouted op, want 1 lookup", st)
	}
	if i := firstDiff(bufs[3][:8], src[:8]); i >= 0 {
		t.Fatalf("unrouted op: byte %d differs", i)
	}
}

func TestLoopbackRoutedWrongKey(t *testing.T) {
	l, bufs := routedLoopback(t)
	src := mapped(t, 512)
	fill(src, 22)
	route, err := l.Route("a")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := l.Resolve("a", loopBase+0x1000)
	if err != nil {
		t.Fatal(err)
	}
	key := map[uint64]uint64{}
	for _, r := range tg.Ranges {
		key[r.Addr] = r.Key
	}
	tests := []struct {
		name string
		dst  uint64
		n    uint64
		key  uint64
	}{
		// dst lies in another registered range of the session: a lookup
		// would find it, but the key says otherwise.
		{"key of another range", loopBase + 0x2000, 8, key[loopBase+0x1000]},
		{"runs past the keyed range", loopBase + 0x1000 + 120, 16, key[loopBase+0x1000]},
		{"below the keyed range", loopBase + 0x1000 - 8, 16, key[loopBase+0x1000]},
		{"key past the last range", loopBase + 0x1000, 8, 4},
		{"huge key", loopBase + 0x1000, 8, math.MaxUint64},
	}
	for i, tt := range tests {
		tok := uint64(100 + i)
		err := doOne(t, l, relay.WriteOp{Src: addr(src), Len: tt.n, Target: "a", Dst: tt.dst, Token: tok, Route: route, Key: tt.key})
		if !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("%s: %v, want ErrOutOfRange", tt.name, err)
		}
		for _, s := range []string{fmt.Sprint("token ", tok), `"a"`, fmt.Sprint("key ", tt.key), fmt.Sprintf("dst %#x", tt.dst), fmt.Sprint("len ", tt.n)} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q does not name %s", tt.name, err, s)
			}
		}
	}
	for i, b := range bufs {
		if nonZero(b) {
			t.Fatalf("buffer %d written by an op with a wrong key", i)
		}
	}
	if st := l.Stats(); st.Failed != uint64(len(tests)) || st.Lookups != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLoopbackForeignRoute(t *testing.T) {
	l, bufs := routedLoopback(t)
	other, _ := routedLoopback(t)
	src := mapped(t, 64)
	fill(src, 23)
	foreign, err := other.Route("a")
	if err != nil {
		t.Fatal(err)
	}
	routeB, err := l.Route("b")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		route any
		want  string
	}{
		{"handle of another loopback", foreign, "not issued by this loopback"},
		{"handle of another session", routeB, `handle is for session "b"`},
		{"not a handle", "a", "handle string"},
	}
	for i, tt := range tests {
		err := doOne(t, l, relay.WriteOp{Src: addr(src), Len: 8, Target: "a", Dst: loopBase + 0x1000, Token: uint64(i) + 1, Route: tt.route, Key: 2})
		if !errors.Is(err, ErrStaleRoute) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want ErrStaleRoute saying %q", tt.name, err, tt.want)
		}
	}
	for i, b := range bufs {
		if nonZero(b) {
			t.Fatalf("buffer %d written through an untrusted handle", i)
		}
	}
	if st := l.Stats(); st.Failed != 3 || st.Routed != 0 || st.Lookups != 0 {
		t.Fatalf("stats %+v: untrusted handles must fail without a lookup", st)
	}
}

func TestLoopbackRemoveTarget(t *testing.T) {
	l, bufs := routedLoopback(t)
	src := mapped(t, 64)
	fill(src, 24)
	old, err := l.Route("a")
	if err != nil {
		t.Fatal(err)
	}
	op := relay.WriteOp{Src: addr(src), Len: 64, Target: "a", Dst: loopBase + 0x1000, Token: 1, Route: old, Key: 2}
	if err := doOne(t, l, op); err != nil {
		t.Fatal(err)
	}
	clear(bufs[1])
	// Held across the removal: performed after it, so it must fail.
	l.SetHold(true)
	op.Token = 2
	if err := l.Submit([]relay.WriteOp{op}); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveTarget("a"); err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(2); err != nil {
		t.Fatal(err)
	}
	l.SetHold(false)
	if got := pollAll(l, 1); len(got) != 1 || !errors.Is(got[0].Err, ErrUnknownSession) || !errors.Is(got[0].Err, ErrStaleRoute) {
		t.Fatalf("held routed op after RemoveTarget: %+v, want ErrUnknownSession", got)
	}
	op.Token = 3
	if err := doOne(t, l, op); !errors.Is(err, ErrUnknownSession) || !strings.Contains(err.Error(), `"a"`) {
		t.Fatalf("routed op after RemoveTarget: %v, want ErrUnknownSession naming \"a\"", err)
	}
	if err := doOne(t, l, relay.WriteOp{Src: addr(src), Len: 8, Target: "a", Dst: loopBase + 0x1000, Token: 4}); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("unrouted op after RemoveTarget: %v", err)
	}
	if _, err := l.Route("a"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("Route after RemoveTarget: %v", err)
	}
	if _, err := l.Resolve("a", loopBase+0x1000); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("Resolve after RemoveTarget: %v", err)
	}
	if err := l.RemoveTarget("a"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("second RemoveTarget: %v", err)
	}
	for i, b := range bufs {
		if nonZero(b) {
			t.Fatalf("buffer %d written after its session was removed", i)
		}
	}
	// Session b is untouched by the removal of a.
	if err := doOne(t, l, relay.WriteOp{Src: addr(src), Len: 8, Target: "b", Dst: loopBase + 0x1000, Token: 5}); err != nil {
		t.Fatalf("session b after removing a: %v", err)
	}

	// Registered again: a new handle that works, while the old one still
	// fails and the old buffers stay untouched.
	fresh := make([]byte, 64)
	if err := l.AddTarget("a", "mlx5_0", fresh, loopBase+0x1000); err != nil {
		t.Fatal(err)
	}
	route, err := l.Route("a")
	if err != nil {
		t.Fatal(err)
	}
	if route == old {
		t.Fatal("Route returned the removed session's handle")
	}
	tg, err := l.Resolve("a", loopBase+0x1000)
	if err != nil || len(tg.Ranges) != 1 {
		t.Fatalf("Resolve after re-adding: %+v, %v", tg, err)
	}
	op = relay.WriteOp{Src: addr(src), Len: 64, Target: "a", Dst: loopBase + 0x1000, Token: 6, Route: route, Key: tg.Ranges[0].Key}
	if err := doOne(t, l, op); err != nil {
		t.Fatalf("routed op through the new handle: %v", err)
	}
	if i := firstDiff(fresh, src); i >= 0 {
		t.Fatalf("new buffer byte %d differs", i)
	}
	op.Token, op.Route = 7, old
	if err := doOne(t, l, op); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("old handle after re-adding: %v, want ErrUnknownSession", err)
	}
	if nonZero(bufs[0]) || nonZero(bufs[1]) || nonZero(bufs[2]) {
		t.Fatal("a removed session's buffer was written")
	}
}
