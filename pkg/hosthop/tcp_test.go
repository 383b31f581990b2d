package hosthop

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
