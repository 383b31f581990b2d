// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/pxn-project/pxn/pkg/relay"
)

const tcpBase = 0x5500_0000_0000

// logLines collects a server's log lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(prefix, args string) {
	l.mu.Lock()
	l.lines = append(l.lines, prefix+" "+args)
	l.mu.Unlock()
}

func (l *logLines) find(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.lines, func(s string) bool { return strings.Contains(s, sub) })
}

// startServer registers mem at tcpBase and serves it on addr.
func startServer(t *testing.T, addr string, mem []byte, logs *logLines, afterAck func(*TargetServer, uint64)) (*TargetServer, string) {
	t.Helper()
	opts := TargetServerOptions{}
	if logs != nil {
		opts.Logger = funcr.New(logs.add, funcr.Options{})
	}
	s := NewTargetServer(opts)
	if afterAck != nil {
		s.afterAck = func(n uint64) { afterAck(s, n) }
	}
	if err := s.Register(tcpBase, mem); err != nil {
		t.Fatal(err)
	}
	a, err := s.Listen(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, a.String()
}

func newTCPHop(t *testing.T, opts TCPHopOptions) *TCPHop {
	t.Helper()
	h := NewTCPHop(opts)
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// collect polls h until it has returned want completions.
func collect(t *testing.T, h relay.Hop, want int) []relay.HopCompletion {
	t.Helper()
	var got []relay.HopCompletion
	buf := make([]relay.HopCompletion, 16)
	eventually(t, "completions", func() bool {
		n := h.Poll(buf)
		got = append(got, buf[:n]...)
		return len(got) >= want
	})
	if n := h.Poll(buf); n != 0 || len(got) != want {
		t.Fatalf("%d completions, want %d", len(got)+n, want)
	}
	return got
}

// byToken indexes completions by token and fails on a duplicate.
func byToken(t *testing.T, cs []relay.HopCompletion) map[uint64]error {
	t.Helper()
	m := make(map[uint64]error, len(cs))
	for _, c := range cs {
		if _, dup := m[c.Token]; dup {
			t.Fatalf("token %d completed twice", c.Token)
		}
		m[c.Token] = c.Err
	}
	return m
}

func TestTCPHopWrites(t *testing.T) {
	sizes := []uint64{1, 10 << 10, 8 << 20, 8<<20 + 1, 1, 10 << 10, 3, 8<<20 + 1, 0}
	offs := make([]uint64, len(sizes))
	total := uint64(0)
	for i, n := range sizes {
		offs[i] = total
		total += (n + 8) &^ 7
	}
	mem := make([]byte, total)
	_, srvAddr := startServer(t, "127.0.0.1:0", mem, nil, nil)
	src := mapped(t, int(total))
	fill(src, 11)
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"kv": srvAddr}, QueueDepth: 4})
	var ops []relay.WriteOp
	for i, n := range sizes {
		ops = append(ops, relay.WriteOp{Src: addr(src) + uintptr(offs[i]), Len: n, Target: "kv", Dst: tcpBase + offs[i], Token: uint64(i) + 1})
	}
	// Four at a time: the depth is 4.
	var got []relay.HopCompletion
	for i := 0; i < len(ops); i += 4 {
		batch := ops[i:min(i+4, len(ops))]
		if err := h.Submit(batch); err != nil {
			t.Fatalf("Submit: %v", err)
		}
		got = append(got, collect(t, h, len(batch))...)
	}
	done := byToken(t, got)
	want := make([]byte, total)
	for i, op := range ops {
		if err, ok := done[op.Token]; !ok || err != nil {
			t.Fatalf("op %d (len %d): completed %v, error %v", i, op.Len, ok, err)
		}
		copy(want[offs[i]:offs[i]+op.Len], src[offs[i]:offs[i]+op.Len])
	}
	if i := firstDiff(mem, want); i >= 0 {
		t.Fatalf("target byte %d differs (gaps must stay zero)", i)
	}
	if st := h.Stats(); st.Dials != 1 || st.Succeeded != uint64(len(ops)) {
		t.Fatalf("hop stats %+v", st)
	}
}

func TestTCPHopOutOfRangeFailsOnlyThatOp(t *testing.T) {
	mem := make([]byte, 1<<20)
	srv, srvAddr := startServer(t, "127.0.0.1:0", mem, nil, nil)
	src := mapped(t, 4096)
	fill(src, 12)
	h := newTCPHop(t, TCPHopOptions{})
	if err := h.AddTarget("kv", srvAddr); err != nil {
		t.Fatal(err)
	}
	ops := []relay.WriteOp{
		{Src: addr(src), Len: 4096, Target: "kv", Dst: tcpBase, Token: 1},
		{Src: addr(src), Len: 16, Target: "kv", Dst: tcpBase - 8, Token: 2},
		{Src: addr(src), Len: 4096, Target: "kv", Dst: tcpBase + 1<<20 - 4095, Token: 3},
		{Src: addr(src), Len: 4096, Target: "kv", Dst: ^uint64(0) - 100, Token: 4},
		{Src: addr(src), Len: 4096, Target: "kv", Dst: tcpBase + 1<<20 - 4096, Token: 5},
	}
	if err := h.Submit(ops); err != nil {
		t.Fatal(err)
	}
	done := byToken(t, collect(t, h, len(ops)))
	for _, tok := range []uint64{1, 5} {
		if done[tok] != nil {
			t.Errorf("token %d: %v", tok, done[tok])
		}
	}
	for _, tok := range []uint64{2, 3, 4} {
		err := done[tok]
		if !errors.Is(err, relay.ErrHopBusy) && errors.Is(err, ErrWriteRefused) && strings.Contains(err.Error(), "outside registered memory") && strings.Contains(err.Error(), srvAddr) {
			continue
		}
		t.Errorf("token %d: %v, want a refused write naming %s", tok, err, srvAddr)
	}
	if i := firstDiff(mem[:4096], src); i >= 0 {
		t.Fatalf("token 1 byte %d differs", i)
	}
	if i := firstDiff(mem[1<<20-4096:], src); i >= 0 {
		t.Fatalf("token 5 byte %d differs", i)
	}
	if st := h.Stats(); st.Dials != 1 {
		t.Fatalf("refused writes cost the connection: %d dials", st.Dials)
	}
	if st := srv.Stats(); st.Refused != 3 || st.Writes != 2 {
		t.Fatalf("server stats %+v", st)
	}
}

func TestTCPHopUnsendableOps(t *testing.T) {
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"kv": "127.0.0.1:1"}})
	ops := []relay.WriteOp{
		{Src: 0x1000, Len: 1, Target: "nope", Token: 1},
		{Src: 0x1000, Len: maxPayload + 1, Target: "kv", Token: 2},
		{Src: 0, Len: 8, Target: "kv", Token: 3},
	}
	if err := h.Submit(ops); err != nil {
		t.Fatal(err)
	}
	done := byToken(t, collect(t, h, len(ops)))
	if !errors.Is(done[1], ErrUnknownSession) {
		t.Errorf("unknown session: %v", done[1])
	}
	if done[2] == nil || !strings.Contains(done[2].Error(), "frame limit") {
		t.Errorf("too long: %v", done[2])
	}
	if done[3] == nil || !strings.Contains(done[3].Error(), "not addressable") {
		t.Errorf("no source: %v", done[3])
	}
	if st := h.Stats(); st.Dials != 0 || st.Failed != 3 {
		t.Fatalf("stats %+v: unsendable ops must not dial", st)
	}
}

func TestTCPHopServerKilledMidStream(t *testing.T) {
	const ops, opLen, acksBeforeKill = 48, 64 << 10, 10
	mem := make([]byte, ops*opLen)
	reached := make(chan struct{})
	srv, srvAddr := startServer(t, "127.0.0.1:0", mem, nil, func(s *TargetServer, n uint64) {
		if n == acksBeforeKill {
			close(reached)
			<-s.closing
		}
	})
	src := mapped(t, ops*opLen)
	fill(src, 13)
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"kv": srvAddr}, QueueDepth: ops})
	batch := make([]relay.WriteOp, ops)
	for i := range batch {
		batch[i] = relay.WriteOp{Src: addr(src) + uintptr(i*opLen), Len: opLen, Target: "kv", Dst: tcpBase + uint64(i*opLen), Token: uint64(i) + 1}
	}
	if err := h.Submit(batch); err != nil {
		t.Fatal(err)
	}
	<-reached
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	done := byToken(t, collect(t, h, ops))
	ok := 0
	for tok := uint64(1); tok <= ops; tok++ {
		err, seen := done[tok]
		if !seen {
			t.Fatalf("token %d lost", tok)
		}
		if err == nil {
			ok++
			i := int(tok - 1)
			if d := firstDiff(mem[i*opLen:(i+1)*opLen], src[i*opLen:(i+1)*opLen]); d >= 0 {
				t.Fatalf("token %d acked but byte %d differs", tok, d)
			}
			continue
		}
		if !errors.Is(err, ErrTargetLost) || !strings.Contains(err.Error(), srvAddr) || !strings.Contains(err.Error(), `"kv"`) {
			t.Fatalf("token %d: %v, want ErrTargetLost naming \"kv\" and %s", tok, err, srvAddr)
		}
	}
	if ok > acksBeforeKill {
		t.Fatalf("%d ops succeeded, the server acked only %d", ok, acksBeforeKill)
	}
	t.Logf("%d ops acked, %d failed when the target died", ok, ops-ok)

	mem2 := make([]byte, ops*opLen)
	_, again := startServer(t, srvAddr, mem2, nil, nil)
	if again != srvAddr {
		t.Fatalf("restarted on %s, want %s", again, srvAddr)
	}
	for i := range batch[:8] {
		batch[i].Token += 1000
	}
	if err := h.Submit(batch[:8]); err != nil {
		t.Fatal(err)
	}
	for tok, err := range byToken(t, collect(t, h, 8)) {
		if err != nil {
			t.Fatalf("token %d after re-dial: %v", tok, err)
		}
	}
	if i := firstDiff(mem2[:8*opLen], src[:8*opLen]); i >= 0 {
		t.Fatalf("byte %d differs after re-dial", i)
	}
	if st := h.Stats(); st.Dials != 2 || st.Succeeded+st.Failed != ops+8 {
		t.Fatalf("stats %+v, want 2 dials and %d completions", st, ops+8)
	}
}

// silentTarget accepts connections and never reads from them.
func silentTarget(t *testing.T) (string, <-chan net.Conn, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c
		}
	}()
	stop := func() { _ = ln.Close() }
	t.Cleanup(func() {
		stop()
		for c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String(), conns, stop
}

func TestTCPHopBusy(t *testing.T) {
	srvAddr, conns, stopListening := silentTarget(t)
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"kv": srvAddr}, QueueDepth: 4})
	op := func(tok uint64) relay.WriteOp { return relay.WriteOp{Target: "kv", Dst: tcpBase, Token: tok} }
	if err := h.Submit([]relay.WriteOp{op(1), op(2), op(3)}); err != nil {
		t.Fatal(err)
	}
	if err := h.Submit([]relay.WriteOp{op(4), op(5)}); !errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("Submit beyond the depth = %v, want ErrHopBusy", err)
	}
	if err := h.Submit([]relay.WriteOp{op(4)}); err != nil {
		t.Fatal(err)
	}
	if err := h.Submit([]relay.WriteOp{op(5)}); !errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("Submit on a full queue = %v, want ErrHopBusy", err)
	}
	if err := h.Submit(make([]relay.WriteOp, 5)); err != nil {
		t.Fatalf("ops with an unknown session take no queue room: %v", err)
	}
	if err := h.Submit([]relay.WriteOp{op(1), op(2), op(3), op(4), op(5)}); err == nil || errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("batch larger than the depth: %v, want a non-busy error", err)
	}
	if n := len(collect(t, h, 5)); n != 5 {
		t.Fatal(n)
	}
	c := <-conns
	stopListening()
	_ = c.Close()
	done := byToken(t, collect(t, h, 4))
	for tok := uint64(1); tok <= 4; tok++ {
		if !errors.Is(done[tok], ErrTargetLost) {
			t.Fatalf("token %d: %v, want ErrTargetLost", tok, done[tok])
		}
	}
	// The queue is free again; the listener is gone, so the re-dial fails.
	if err := h.Submit([]relay.WriteOp{op(6)}); err != nil {
		t.Fatal(err)
	}
	done = byToken(t, collect(t, h, 1))
	if err := done[6]; !errors.Is(err, ErrTargetLost) || !strings.Contains(err.Error(), "dial") || !strings.Contains(err.Error(), srvAddr) {
		t.Fatalf("token 6: %v, want a dial failure naming %s", err, srvAddr)
	}
	if st := h.Stats(); st.Busy != 2 || st.Dials != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestTCPHopClose(t *testing.T) {
	srvAddr, _, _ := silentTarget(t)
	h := NewTCPHop(TCPHopOptions{Targets: map[string]string{"kv": srvAddr}})
	ops := []relay.WriteOp{{Target: "kv", Dst: tcpBase, Token: 1}, {Target: "kv", Dst: tcpBase, Token: 2}}
	if err := h.Submit(ops); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	done := byToken(t, collect(t, h, 2))
	for tok, err := range done {
		if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrTargetLost) {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	if err := h.Submit(ops); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close = %v", err)
	}
}

func TestTargetServerBadFrames(t *testing.T) {
	header := func(magic uint32, version, kind uint16, length uint64) []byte {
		b := make([]byte, frameHeaderSize)
		binary.LittleEndian.PutUint32(b[0:], magic)
		binary.LittleEndian.PutUint16(b[4:], version)
		binary.LittleEndian.PutUint16(b[6:], kind)
		binary.LittleEndian.PutUint64(b[16:], tcpBase)
		binary.LittleEndian.PutUint64(b[24:], length)
		return b
	}
	tests := []struct {
		name  string
		frame []byte
		bad   bool
	}{
		{"bad magic", header(0x12345678, frameVersion, kindWrite, 8), true},
		{"HTTP", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n....."), true},
		{"version 2", header(frameMagic, 2, kindWrite, 8), true},
		{"ack from a client", header(frameMagic, frameVersion, kindAck, 0), true},
		{"unknown kind", header(frameMagic, frameVersion, 7, 0), true},
		{"payload over 64 MiB", header(frameMagic, frameVersion, kindWrite, maxPayload+1), true},
		{"truncated header", header(frameMagic, frameVersion, kindWrite, 8)[:10], false},
		{"truncated payload", append(header(frameMagic, frameVersion, kindWrite, 8), 1, 2, 3), false},
	}
	var logs logLines
	mem := make([]byte, 64)
	srv, srvAddr := startServer(t, "127.0.0.1:0", mem, &logs, nil)
	for i, tt := range tests {
		c, err := net.Dial("tcp", srvAddr)
		if err != nil {
			t.Fatal(err)
		}
		peer := c.LocalAddr().String()
		if _, err := c.Write(tt.frame); err != nil {
			t.Fatal(err)
		}
		if !tt.bad {
			_ = c.(*net.TCPConn).CloseWrite()
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := io.Copy(io.Discard, c)
		_ = c.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: the server kept the connection open", tt.name)
		}
		if n != 0 {
			t.Fatalf("%s: the server answered %d bytes", tt.name, n)
		}
		if tt.bad {
			if got := srv.Stats().BadFrames; got != uint64(i)+1 {
				t.Fatalf("%s: BadFrames = %d", tt.name, got)
			}
		}
		eventually(t, tt.name+" log line naming the peer", func() bool { return logs.find(peer) })
	}
	if !logs.find("bad frame magic") || !logs.find("exceeds the limit") {
		t.Fatalf("log lines do not say what was wrong: %q", logs.lines)
	}
	src := mapped(t, 64)
	fill(src, 14)
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"kv": srvAddr}})
	if err := h.Submit([]relay.WriteOp{{Src: addr(src), Len: 64, Target: "kv", Dst: tcpBase, Token: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := byToken(t, collect(t, h, 1))[1]; err != nil {
		t.Fatalf("the server no longer serves: %v", err)
	}
	if i := firstDiff(mem, src); i >= 0 {
		t.Fatalf("byte %d differs", i)
	}
}

func TestTargetServerRegister(t *testing.T) {
	s := NewTargetServer(TargetServerOptions{})
	defer s.Close()
	if err := s.Register(100, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		base uint64
		n    int
	}{{150, 10}, {50, 51}, {0, 0}, {^uint64(0), 2}} {
		if err := s.Register(r.base, make([]byte, r.n)); err == nil {
			t.Errorf("Register(%d, %d bytes) accepted", r.base, r.n)
		}
	}
	if err := s.Register(200, make([]byte, 1)); err != nil {
		t.Fatalf("adjacent range: %v", err)
	}
	if _, err := s.Listen(context.Background(), "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Listen(context.Background(), "127.0.0.1:0"); err == nil {
		t.Fatal("second Listen accepted")
	}
}

// TestTCPHopConcurrentSubmitters drives two targets from several goroutines
// at once, retrying on ErrHopBusy like the pump, while another goroutine polls.
func TestTCPHopConcurrentSubmitters(t *testing.T) {
	const submitters, perSubmitter, opLen = 4, 150, 4096
	const total = submitters * perSubmitter
	memA, memB := make([]byte, total*opLen), make([]byte, total*opLen)
	_, addrA := startServer(t, "127.0.0.1:0", memA, nil, nil)
	_, addrB := startServer(t, "127.0.0.1:0", memB, nil, nil)
	src := mapped(t, total*opLen)
	fill(src, 15)
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"a": addrA, "b": addrB}, QueueDepth: 8})
	var wg sync.WaitGroup
	for g := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perSubmitter {
				k := g*perSubmitter + i
				session := []string{"a", "b"}[k%2]
				op := []relay.WriteOp{{Src: addr(src) + uintptr(k*opLen), Len: opLen, Target: session, Dst: tcpBase + uint64(k*opLen), Token: uint64(k)}}
				for {
					err := h.Submit(op)
					if err == nil {
						break
					}
					if !errors.Is(err, relay.ErrHopBusy) {
						t.Errorf("Submit token %d: %v", k, err)
						return
					}
					time.Sleep(50 * time.Microsecond)
				}
			}
		}()
	}
	done := byToken(t, collect(t, h, total))
	wg.Wait()
	for k := range total {
		if err, ok := done[uint64(k)]; !ok || err != nil {
			t.Fatalf("token %d: completed %v, %v", k, ok, err)
		}
		mem := memA
		if k%2 == 1 {
			mem = memB
		}
		if i := firstDiff(mem[k*opLen:(k+1)*opLen], src[k*opLen:(k+1)*opLen]); i >= 0 {
			t.Fatalf("token %d byte %d differs", k, i)
		}
	}
	if st := h.Stats(); st.Dials != 2 || st.Succeeded != total {
		t.Fatalf("stats %+v", st)
	}
}

func mustRoute(t *testing.T, r relay.Router, session string) any {
	t.Helper()
	h, err := r.Route(session)
	if err != nil {
		t.Fatalf("Route(%q): %v", session, err)
	}
	return h
}

// submitWait submits ops and returns their completions by token.
func submitWait(t *testing.T, h *TCPHop, ops ...relay.WriteOp) map[uint64]error {
	t.Helper()
	if err := h.Submit(ops); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return byToken(t, collect(t, h, len(ops)))
}

// The race detector sees no order in a writev to a socket, so the tests below
// never let a target write bytes that the test has touched since it
// registered them: each op that should land has a region of its own.

func TestTCPHopRoutedOps(t *testing.T) {
	const opLen = 4096
	mem := make([]byte, 9*opLen)
	srv, srvAddr := startServer(t, "127.0.0.1:0", mem, nil, nil)
	src := mapped(t, 8*opLen)
	fill(src, 31)
	// Two sessions on one address share its connection and its queue.
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"a": srvAddr, "b": srvAddr}})
	ra, rb := mustRoute(t, h, "a"), mustRoute(t, h, "b")
	if again := mustRoute(t, h, "a"); again != ra {
		t.Fatal("a second Route of a live session returned another handle")
	}
	if ra == rb {
		t.Fatal("two sessions share a handle")
	}
	if st := h.Stats(); st.Dials != 0 {
		t.Fatalf("Route dialed: %+v", st)
	}
	var ops []relay.WriteOp
	for i := range 8 {
		session, route := "a", ra
		if i%2 == 1 {
			session, route = "b", rb
		}
		ops = append(ops, relay.WriteOp{Src: addr(src) + uintptr(i*opLen), Len: opLen, Target: session, Dst: tcpBase + uint64(i*opLen), Token: uint64(i) + 1, Route: route})
	}
	for tok, err := range submitWait(t, h, ops...) {
		if err != nil {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	if i := firstDiff(mem[:8*opLen], src); i >= 0 {
		t.Fatalf("byte %d differs", i)
	}
	st := h.Stats()
	if st.Routed != 8 || st.Lookups != 0 || st.Dials != 1 || st.Routes != 3 {
		t.Fatalf("stats %+v, want 8 routed ops, no lookup, 1 dial, 3 routes", st)
	}
	// Without a handle, the same target is looked up.
	ops[0].Route, ops[0].Token, ops[0].Dst = nil, 100, tcpBase+8*opLen
	if err := submitWait(t, h, ops[0])[100]; err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(mem[8*opLen:], src[:opLen]); i >= 0 {
		t.Fatalf("unrouted op: byte %d differs", i)
	}
	if st := h.Stats(); st.Lookups != 1 || st.Routed != 8 {
		t.Fatalf("stats %+v after an unrouted op", st)
	}
	if st := srv.Stats(); st.Writes != 9 || st.Accepted != 1 {
		t.Fatalf("server stats %+v", st)
	}
}

// TestTCPHopRoutedBusy checks that routed and looked-up ops count against one
// queue per address.
func TestTCPHopRoutedBusy(t *testing.T) {
	srvAddr, _, _ := silentTarget(t)
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"a": srvAddr, "b": srvAddr}, QueueDepth: 4})
	ra := mustRoute(t, h, "a")
	routed := func(tok uint64) relay.WriteOp { return relay.WriteOp{Target: "a", Dst: tcpBase, Token: tok, Route: ra} }
	looked := func(tok uint64) relay.WriteOp { return relay.WriteOp{Target: "b", Dst: tcpBase, Token: tok} }
	if err := h.Submit([]relay.WriteOp{routed(1), routed(2), looked(3), looked(4), routed(5)}); err == nil || errors.Is(err, relay.ErrHopBusy) || !strings.Contains(err.Error(), "5 ops for "+srvAddr) {
		t.Fatalf("batch of 5 for one address with depth 4: %v, want a non-busy error naming it", err)
	}
	if err := h.Submit([]relay.WriteOp{routed(1), looked(2), routed(3)}); err != nil {
		t.Fatal(err)
	}
	if err := h.Submit([]relay.WriteOp{looked(4), routed(5)}); !errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("Submit beyond the depth = %v, want ErrHopBusy", err)
	}
	if err := h.Submit([]relay.WriteOp{routed(4)}); err != nil {
		t.Fatal(err)
	}
	if err := h.Submit([]relay.WriteOp{looked(5)}); !errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("Submit on a full queue = %v, want ErrHopBusy", err)
	}
	// Lookups: 2 in the refused batch, 1 accepted, 1 and 1 refused as busy.
	if st := h.Stats(); st.Busy != 2 || st.Submitted != 4 || st.Routed != 3 || st.Lookups != 5 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTCPHopRouteSurvivesReconnect: a handle names an address, not a
// connection, so it outlives a connection's failure.
func TestTCPHopRouteSurvivesReconnect(t *testing.T) {
	mem := make([]byte, 4096)
	srv, srvAddr := startServer(t, "127.0.0.1:0", mem, nil, nil)
	src := mapped(t, 4096)
	fill(src, 32)
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"kv": srvAddr}})
	route := mustRoute(t, h, "kv")
	op := relay.WriteOp{Src: addr(src), Len: 4096, Target: "kv", Dst: tcpBase, Token: 1, Route: route}
	if err := submitWait(t, h, op)[1]; err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	op.Token = 2
	if err := submitWait(t, h, op)[2]; !errors.Is(err, ErrTargetLost) {
		t.Fatalf("routed op to a closed server: %v, want ErrTargetLost", err)
	}
	mem2 := make([]byte, 4096)
	startServer(t, srvAddr, mem2, nil, nil)
	op.Token = 3
	if err := submitWait(t, h, op)[3]; err != nil {
		t.Fatalf("routed op after the server came back: %v", err)
	}
	if i := firstDiff(mem2, src); i >= 0 {
		t.Fatalf("byte %d differs after the reconnect", i)
	}
	if st := h.Stats(); st.Lookups != 0 || st.Routed != 3 || st.Dials < 2 {
		t.Fatalf("stats %+v, want 3 routed ops over at least 2 connections", st)
	}
}

func TestTCPHopStaleRoute(t *testing.T) {
	const n = 4096
	// Region 0 of each server is where no op may land; A's region 1 takes
	// the probes, region 2 the first op; B's region 1 the op after the move.
	memA, memB := make([]byte, 3*n), make([]byte, 2*n)
	srvA, addrA := startServer(t, "127.0.0.1:0", memA, nil, nil)
	srvB, addrB := startServer(t, "127.0.0.1:0", memB, nil, nil)
	src := mapped(t, n)
	fill(src, 33)
	// "probe" stays on A: an op to it, acked after a stale op, proves
	// that the stale op never reached A (the server acks in order).
	h := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"kv": addrA, "probe": addrA}})
	other := newTCPHop(t, TCPHopOptions{Targets: map[string]string{"kv": addrA}})
	loop := NewLoopback(LoopbackOptions{})
	if err := loop.AddTarget("kv", "mlx5_0", make([]byte, 8), tcpBase); err != nil {
		t.Fatal(err)
	}
	tok := uint64(0)
	op := func(route any, region uint64) relay.WriteOp {
		tok++
		return relay.WriteOp{Src: addr(src), Len: n, Target: "kv", Dst: tcpBase + region*n, Token: tok, Route: route}
	}
	probes := uint64(0)
	probe := func() {
		t.Helper()
		tok++
		p := relay.WriteOp{Src: addr(src), Len: 8, Target: "probe", Dst: tcpBase + n + 8*probes, Token: tok}
		probes++
		if err := submitWait(t, h, p)[tok]; err != nil {
			t.Fatalf("probe: %v", err)
		}
	}
	old := mustRoute(t, h, "kv")
	o := op(old, 2)
	if err := submitWait(t, h, o)[o.Token]; err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(memA[2*n:], src); i >= 0 {
		t.Fatalf("first op: byte %d differs", i)
	}

	// Handles this hop did not issue for the op's session.
	for _, bad := range []struct {
		name  string
		route any
		want  string
	}{
		{"another hop's handle", mustRoute(t, other, "kv"), "not issued by this hop"},
		{"a loopback's handle", mustRoute(t, loop, "kv"), "not issued by this hop"},
		{"another session's handle", mustRoute(t, h, "probe"), `handle is for session "probe"`},
	} {
		o := op(bad.route, 0)
		if err := submitWait(t, h, o)[o.Token]; !errors.Is(err, ErrStaleRoute) || !strings.Contains(err.Error(), bad.want) {
			t.Fatalf("%s: %v, want ErrStaleRoute saying %q", bad.name, err, bad.want)
		}
	}

	// Moved: the old handle must not reach A, nor guess B.
	if err := h.AddTarget("kv", addrB); err != nil {
		t.Fatal(err)
	}
	o = op(old, 0)
	err := submitWait(t, h, o)[o.Token]
	if !errors.Is(err, ErrStaleRoute) || errors.Is(err, ErrUnknownSession) || !strings.Contains(err.Error(), addrA) || !strings.Contains(err.Error(), addrB) {
		t.Fatalf("op through the handle of a moved session: %v, want ErrStaleRoute naming %s and %s", err, addrA, addrB)
	}
	probe()
	if st := srvA.Stats(); st.Writes != 2 || st.Refused != 0 {
		t.Fatalf("server A: %+v, want only the first op and the probe", st)
	}
	moved := mustRoute(t, h, "kv")
	if moved == old {
		t.Fatal("Route returned the retired handle")
	}
	// Mapping to the same address again keeps the handle.
	if err := h.AddTarget("kv", addrB); err != nil {
		t.Fatal(err)
	}
	o = op(moved, 1)
	if err := submitWait(t, h, o)[o.Token]; err != nil {
		t.Fatalf("op through the new handle: %v", err)
	}
	if i := firstDiff(memB[n:], src); i >= 0 {
		t.Fatalf("server B byte %d differs", i)
	}

	// Removed: both handles fail, and so do Route and unrouted ops.
	if err := h.RemoveTarget("kv"); err != nil {
		t.Fatal(err)
	}
	for _, route := range []any{moved, old, nil} {
		o := op(route, 0)
		if err := submitWait(t, h, o)[o.Token]; !errors.Is(err, ErrUnknownSession) || !strings.Contains(err.Error(), `"kv"`) {
			t.Fatalf("op after RemoveTarget (route %v): %v, want ErrUnknownSession naming \"kv\"", route != nil, err)
		}
	}
	if _, err := h.Route("kv"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("Route after RemoveTarget: %v", err)
	}
	if err := h.RemoveTarget("kv"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("second RemoveTarget: %v", err)
	}
	probe()
	if st := srvB.Stats(); st.Writes != 1 || st.Refused != 0 {
		t.Fatalf("server B: %+v after ops to a removed session, want only the op after the move", st)
	}
	if st := srvA.Stats(); st.Writes != 3 || st.Refused != 0 {
		t.Fatalf("server A: %+v, want the first op and two probes", st)
	}
	if nonZero(memA[:n]) || nonZero(memB[:n]) {
		t.Fatal("an op through a handle not honoured was written")
	}
	for k := range probes {
		if i := firstDiff(memA[n+8*k:n+8*k+8], src[:8]); i >= 0 {
			t.Fatalf("probe %d byte %d differs", k, i)
		}
	}
	if _, err := h.Route("nope"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("Route of an unknown session: %v", err)
	}
	if st := h.Stats(); st.Routed != 2 || st.Lookups != 3 {
		t.Fatalf("stats %+v: want 2 routed ops sent, and lookups only for the 2 probes and the unrouted op", st)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Route("probe"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Route after Close: %v", err)
	}
}
