// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"context"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
)

const benchPiece = 8 << 20

func gbps(bytes uint64, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e9 }

// BenchmarkTCPHop8MiB writes 8 MiB ops over loopback TCP to a TargetServer,
// keeping the hop's queue full.
func BenchmarkTCPHop8MiB(b *testing.B) {
	const slots, depth = 4, 4
	mem := make([]byte, slots*benchPiece)
	srv := NewTargetServer(TargetServerOptions{})
	defer srv.Close()
	if err := srv.Register(tcpBase, mem); err != nil {
		b.Fatal(err)
	}
	a, err := srv.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	src := mapped(b, benchPiece)
	fill(src, 2)
	h := NewTCPHop(TCPHopOptions{Targets: map[string]string{"kv": a.String()}, QueueDepth: depth})
	defer h.Close()
	comps := make([]relay.HopCompletion, depth)
	op := []relay.WriteOp{{Src: addr(src), Len: benchPiece, Target: "kv"}}
	submitted, completed := 0, 0
	reap := func() {
		n := h.Poll(comps)
		for _, c := range comps[:n] {
			if c.Err != nil {
				b.Fatalf("token %d: %v", c.Token, c.Err)
			}
		}
		completed += n
		if n == 0 {
			// The pump's idle wait.
			time.Sleep(50 * time.Microsecond)
		}
	}
	b.SetBytes(benchPiece)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for submitted < b.N {
		op[0].Token = uint64(submitted)
		op[0].Dst = tcpBase + uint64(submitted%slots)*benchPiece
		switch err := h.Submit(op); err {
		case nil:
			submitted++
		case relay.ErrHopBusy:
			reap()
		default:
			b.Fatal(err)
		}
	}
	for completed < b.N {
		reap()
	}
	b.ReportMetric(gbps(uint64(b.N)*benchPiece, time.Since(start)), "GB/s")
}

// smallOp is the size of the ops of the per-op benchmarks: small enough that
// the hop's own cost, not the copy, is what they measure.
const smallOp = 4 << 10

// BenchmarkLoopbackSubmitPoll submits one small op at a time and polls its
// completion, the second hop's per-op cost on the Loopback.
func BenchmarkLoopbackSubmitPoll(b *testing.B) {
	b.Run("lookup", func(b *testing.B) {
		l := NewLoopback(LoopbackOptions{})
		dst := make([]byte, 16*smallOp)
		if err := l.AddTarget("kv", "mlx5_0", dst, loopBase); err != nil {
			b.Fatal(err)
		}
		src := mapped(b, smallOp)
		fill(src, 3)
		op := []relay.WriteOp{{Src: addr(src), Len: smallOp, Target: "kv"}}
		benchLoopback(b, l, op)
	})
	b.Run("routed", func(b *testing.B) {
		l := NewLoopback(LoopbackOptions{})
		dst := make([]byte, 16*smallOp)
		if err := l.AddTarget("kv", "mlx5_0", dst, loopBase); err != nil {
			b.Fatal(err)
		}
		route, err := l.Route("kv")
		if err != nil {
			b.Fatal(err)
		}
		tg, err := l.Resolve("kv", loopBase)
		if err != nil {
			b.Fatal(err)
		}
		src := mapped(b, smallOp)
		fill(src, 3)
		op := []relay.WriteOp{{Src: addr(src), Len: smallOp, Target: "kv", Route: route, Key: tg.Ranges[0].Key}}
		benchLoopback(b, l, op)
		if st := l.Stats(); st.Lookups != 0 {
			b.Fatalf("%d lookups for routed ops", st.Lookups)
		}
	})
}

func benchLoopback(b *testing.B, l *Loopback, op []relay.WriteOp) {
	comps := make([]relay.HopCompletion, 1)
	b.SetBytes(smallOp)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		op[0].Token = uint64(i)
		op[0].Dst = loopBase + uint64(i%16)*smallOp
		i++
		if err := l.Submit(op); err != nil {
			b.Fatal(err)
		}
		if n := l.Poll(comps); n != 1 || comps[0].Err != nil {
			b.Fatalf("token %d: %d completions, %v", op[0].Token, n, comps[0].Err)
		}
	}
}

// BenchmarkTCPHopSmall writes small ops over loopback TCP to a TargetServer,
// keeping the hop's queue full and polling without sleeping: the hop's
// per-op cost, its goroutines and the server's included.
func BenchmarkTCPHopSmall(b *testing.B) {
	b.Run("lookup", func(b *testing.B) {
		h, src := benchTCPSetup(b)
		benchTCPSmall(b, h, relay.WriteOp{Src: addr(src), Len: smallOp, Target: "kv"})
	})
	b.Run("routed", func(b *testing.B) {
		h, src := benchTCPSetup(b)
		route, err := h.Route("kv")
		if err != nil {
			b.Fatal(err)
		}
		benchTCPSmall(b, h, relay.WriteOp{Src: addr(src), Len: smallOp, Target: "kv", Route: route})
		if st := h.Stats(); st.Lookups != 0 {
			b.Fatalf("%d lookups for routed ops", st.Lookups)
		}
	})
}

const smallDepth = 16

func benchTCPSetup(b *testing.B) (*TCPHop, []byte) {
	mem := make([]byte, smallDepth*smallOp)
	srv := NewTargetServer(TargetServerOptions{})
	b.Cleanup(func() { _ = srv.Close() })
	if err := srv.Register(tcpBase, mem); err != nil {
		b.Fatal(err)
	}
	a, err := srv.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	src := mapped(b, smallOp)
	fill(src, 4)
	h := NewTCPHop(TCPHopOptions{Targets: map[string]string{"kv": a.String()}, QueueDepth: smallDepth})
	b.Cleanup(func() { _ = h.Close() })
	return h, src
}

func benchTCPSmall(b *testing.B, h *TCPHop, proto relay.WriteOp) {
	comps := make([]relay.HopCompletion, smallDepth)
	op := []relay.WriteOp{proto}
	submitted, completed := 0, 0
	run := func(n int) {
		for submitted < n || completed < n {
			if submitted < n {
				op[0].Token = uint64(submitted)
				op[0].Dst = tcpBase + uint64(submitted%smallDepth)*smallOp
				switch err := h.Submit(op); err {
				case nil:
					submitted++
					continue
				case relay.ErrHopBusy:
				default:
					b.Fatal(err)
				}
			}
			k := h.Poll(comps)
			for _, c := range comps[:k] {
				if c.Err != nil {
					b.Fatalf("token %d: %v", c.Token, c.Err)
				}
			}
			completed += k
			if k == 0 {
				// Sleep, not yield: a spinning goroutine keeps the
				// scheduler from polling the network.
				time.Sleep(20 * time.Microsecond)
			}
		}
	}
	// Dial and warm up outside the measurement.
	run(4 * smallDepth)
	warm := submitted
	b.SetBytes(smallOp)
	b.ReportAllocs()
	b.ResetTimer()
	run(warm + b.N)
}
