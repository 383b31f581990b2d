// SPDX-License-Identifier: Apache-2.0

package gpunic_test

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/sim/gpunic"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
)

const nicTargetLen = 4 << 20

// requireEnv makes a missing driver or GPU a failure instead of a skip.
const requireEnv = "PXN_REQUIRE_GPU"

const childEnv = "PXN_GPUNIC_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "nic-target" {
		if err := nicTarget(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// openGPU opens device 0 with its context current on the test's locked
// thread, or skips when this machine has no driver or no device.
func openGPU(t testing.TB) *gpu.GPU {
	t.Helper()
	d, err := cuda.Load()
	if err != nil {
		if os.Getenv(requireEnv) != "1" && (errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrorNoDevice)) {
			t.Skipf("skipping: %v", err)
		}
		t.Fatalf("Load: %v", err)
	}
	if n, err := d.DeviceCount(); err != nil || n == 0 {
		if err == nil && os.Getenv(requireEnv) != "1" {
			t.Skip("skipping: no CUDA device")
		}
		t.Fatalf("device count %d: %v", n, err)
	}
	g, err := gpu.Open(d, 0)
	if err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	if err := d.CtxSetCurrent(g.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.CtxSetCurrent(0)
		runtime.UnlockOSThread()
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return g
}

func alloc(t testing.TB, g *gpu.GPU, n uint64) cuda.DevicePtr {
	t.Helper()
	p, err := g.Driver().MemAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Driver().MemFree(p) })
	return p
}

// targetGPUEnv places the target process on another GPU than device 0;
// busyEnv makes it keep its GPU busy with small memsets until stdin closes
// (a neighbour process with work on the same GPU).
// targetLenEnv sizes the target's buffer (nicTargetLen unless set).
const (
	targetGPUEnv = "PXN_GPUNIC_TARGET_GPU"
	busyEnv      = "PXN_GPUNIC_TARGET_BUSY"
	targetLenEnv = "PXN_GPUNIC_TARGET_LEN"
)

// nicTarget is the child of TestNIC: a zeroed device buffer whose handle it
// prints, then the FNV-64a hash of its bytes once stdin closes.
func nicTarget() error {
	runtime.LockOSThread()
	d, err := cuda.Load()
	if err != nil {
		return err
	}
	ordinal := 0
	if v := os.Getenv(targetGPUEnv); v != "" {
		if ordinal, err = strconv.Atoi(v); err != nil {
			return fmt.Errorf("%s=%q: %w", targetGPUEnv, v, err)
		}
	}
	size := uint64(nicTargetLen)
	if v := os.Getenv(targetLenEnv); v != "" {
		if size, err = strconv.ParseUint(v, 10, 64); err != nil || size == 0 || size%4 != 0 {
			return fmt.Errorf("%s=%q: want a positive multiple of 4", targetLenEnv, v)
		}
	}
	g, err := gpu.Open(d, ordinal)
	if err != nil {
		return err
	}
	defer g.Close()
	return g.Do(func() error {
		buf, err := d.MemAlloc(size)
		if err != nil {
			return err
		}
		defer d.MemFree(buf)
		if err := d.MemsetD32Async(buf, 0, size/4, 0); err != nil {
			return err
		}
		if err := d.StreamSynchronize(0); err != nil {
			return err
		}
		h, err := d.IPCGetMemHandle(buf)
		if err != nil {
			return err
		}
		fmt.Printf("handle %s\n", hex.EncodeToString(h[:]))
		closed := make(chan struct{})
		go func() {
			io.Copy(io.Discard, os.Stdin)
			close(closed)
		}()
		if os.Getenv(busyEnv) == "1" {
			scratch, err := d.MemAlloc(4 << 20)
			if err != nil {
				return err
			}
			defer d.MemFree(scratch)
			for busy := true; busy; {
				select {
				case <-closed:
					busy = false
				default:
				}
				for range 8 {
					if err := d.MemsetD32Async(scratch, 1, 1<<20, 0); err != nil {
						return err
					}
				}
				if err := d.StreamSynchronize(0); err != nil {
					return err
				}
			}
		}
		<-closed
		host := make([]byte, size)
		if err := d.MemcpyDtoH(host, buf); err != nil {
			return err
		}
		sum := fnv.New64a()
		sum.Write(host)
		fmt.Printf("hash %x\n", sum.Sum64())
		return nil
	})
}

func pollAll(t *testing.T, n *gpunic.NIC, want int) []relay.HopCompletion {
	t.Helper()
	var out []relay.HopCompletion
	buf := make([]relay.HopCompletion, 3)
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < want {
		k := n.Poll(buf)
		out = append(out, buf[:k]...)
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d completions", len(out), want)
		}
	}
	return out
}

// TestNIC writes into another process's device buffer through the emulated
// NIC: completions in order, errors for what it cannot do, the rate cap as
// a lower bound on completion time, back-pressure, batches of small ops on
// the SM kernel and on the copy engines, a Piece as one completion, and the
// bytes.
const base = 0x7e0000000000

// startTarget starts a target process and maps its buffer as session t0.
// finish closes the mappings, then the target, and returns its hash line.
func startTarget(t testing.TB, g *gpu.GPU, env ...string) (maps *gpunic.Targets, finish func() string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"=nic-target"), env...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	lines := bufio.NewReader(stdout)
	line, err := lines.ReadString('\n')
	if err != nil {
		t.Fatalf("target: %v\n%s", err, stderr.String())
	}
	raw, err := hex.DecodeString(strings.TrimSpace(strings.TrimPrefix(line, "handle ")))
	if err != nil || len(raw) != 64 {
		t.Fatalf("target said %q", line)
	}
	var h cuda.IPCMemHandle
	copy(h[:], raw)
	size := uint64(nicTargetLen)
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, targetLenEnv+"="); ok {
			if size, err = strconv.ParseUint(v, 10, 64); err != nil {
				t.Fatal(err)
			}
		}
	}
	maps, err = gpunic.OpenTargets(g, []gpunic.Target{{Session: "t0", Addr: base, Len: size, Handle: h}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { maps.Close() })
	return maps, func() string {
		if err := maps.Close(); err != nil {
			t.Fatal(err)
		}
		stdin.Close()
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("target: %v\n%s", err, stderr.String())
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("target: %v\n%s", err, stderr.String())
		}
		return strings.TrimSpace(line)
	}
}

func TestNIC(t *testing.T) {
	g := openGPU(t)
	d := g.Driver()
	maps, finish := startTarget(t, g)
	src := alloc(t, g, nicTargetLen)
	host := make([]byte, nicTargetLen)
	for i := range host {
		host[i] = byte(i*7 + i>>12)
	}
	if err := d.MemcpyHtoD(src, host); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, nicTargetLen)

	nic, err := gpunic.New(g, maps, gpunic.Options{QueueDepth: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer nic.Close()
	ops := []relay.WriteOp{
		{Src: uintptr(src), Len: 1 << 20, Target: "t0", Dst: base, Token: 1},
		{Src: uintptr(src) + 3<<20, Len: 4096, Target: "t0", Dst: base + 2<<20, Token: 2},
		{Src: uintptr(src), Len: 4096, Target: "t0", Dst: base, Token: 3, Read: true},
		{Src: uintptr(src), Len: 4096, Target: "nobody", Dst: base, Token: 4},
		{Src: uintptr(src), Len: 8192, Target: "t0", Dst: base + nicTargetLen - 4096, Token: 5},
		{Src: uintptr(src), Len: 0, Target: "t0", Dst: base, Token: 6},
	}
	copy(want[:1<<20], host[:1<<20])
	copy(want[2<<20:2<<20+4096], host[3<<20:3<<20+4096])
	if err := nic.Submit(ops); err != nil {
		t.Fatal(err)
	}
	if err := nic.Submit(make([]relay.WriteOp, 9)); err == nil || errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("a batch deeper than the queue: %v", err)
	}
	if err := nic.Submit(make([]relay.WriteOp, 3)); !errors.Is(err, relay.ErrHopBusy) {
		t.Fatalf("a full queue: %v", err)
	}
	got := pollAll(t, nic, len(ops))
	for i, c := range got {
		bad := c.Token == 3 || c.Token == 4 || c.Token == 5
		if c.Token != uint64(i+1) || (c.Err != nil) != bad {
			t.Errorf("completion %d: token %d, err %v", i, c.Token, c.Err)
		}
	}

	// 3 MiB at 2 GB/s: the wire needs 1.57 ms, and the completion may not
	// come earlier however fast the copy is.
	slow, err := gpunic.New(g, maps, gpunic.Options{RateGBps: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	start := time.Now()
	if err := slow.Submit([]relay.WriteOp{{Src: uintptr(src), Len: 1 << 20, Target: "t0", Dst: base + 1<<20, Token: 7},
		{Src: uintptr(src) + 2<<20, Len: 2 << 20, Target: "t0", Dst: base + 2<<20, Token: 8}}); err != nil {
		t.Fatal(err)
	}
	copy(want[1<<20:2<<20], host[:1<<20])
	copy(want[2<<20:], host[2<<20:])
	done := pollAll(t, slow, 2)
	if el := time.Since(start); el < 1500*time.Microsecond || done[0].Err != nil || done[1].Err != nil {
		t.Fatalf("3 MiB at 2 GB/s completed after %v: %+v", el, done)
	}
	// Batches of small ops, unaligned and in reverse order, through each
	// way the NIC can move them; each pass sees the previous one's bytes
	// overwritten.
	for _, mode := range []gpu.GatherMode{gpu.GatherSM, gpu.GatherAuto, gpu.GatherCE} {
		sn, err := gpunic.New(g, maps, gpunic.Options{Copy: mode, RateGBps: 50})
		if err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		if used, why := sn.Scatter(); used != (mode != gpu.GatherCE) {
			t.Fatalf("%v: scatter kernel %v (%s)", mode, used, why)
		}
		var batch []relay.WriteOp
		shift := uint64(mode) * 13
		for i := uint64(0); i < 600; i++ {
			s, d, l := (599-i)*5003+7+shift, i*4099+1, 3001+i%5
			batch = append(batch, relay.WriteOp{Src: uintptr(src) + uintptr(s), Len: l, Target: "t0", Dst: base + d, Token: 100 + i})
			copy(want[d:d+l], host[s:s+l])
		}
		for off := 0; off < len(batch); off += 32 {
			if err := sn.Submit(batch[off:min(off+32, len(batch))]); err != nil {
				t.Fatalf("%v: %v", mode, err)
			}
		}
		for i, c := range pollAll(t, sn, len(batch)) {
			if c.Token != 100+uint64(i) || c.Err != nil {
				t.Fatalf("%v: completion %d: token %d, err %v", mode, i, c.Token, c.Err)
			}
		}
		if err := sn.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Ops submitted while the NIC's GPU work runs wait for more (fewer
	// than flushOps); they complete only after their own GPU work, in
	// order, however often the NIC is polled meanwhile. Each round's 1 MiB
	// writes cover the whole buffer, so only the last round's small
	// writes remain.
	busy, err := gpunic.New(g, maps, gpunic.Options{})
	if err != nil {
		t.Fatal(err)
	}
	token := uint64(1000)
	for round := 0; round < 8; round++ {
		var ops []relay.WriteOp
		for i := 0; i < 400; i++ {
			ops = append(ops, relay.WriteOp{Src: uintptr(src) + uintptr(i%4)<<20, Len: 1 << 20, Target: "t0", Dst: base + uint64(i%4)<<20, Token: token})
			token++
		}
		if err := busy.Submit(ops); err != nil {
			t.Fatal(err)
		}
		var done []relay.HopCompletion
		out := make([]relay.HopCompletion, 7)
		for k := 0; k < 5; k++ {
			if err := busy.Submit([]relay.WriteOp{{Src: uintptr(src) + uintptr(k)*4096, Len: 4096, Target: "t0", Dst: base + uint64(round*5+k)*4096, Token: token}}); err != nil {
				t.Fatal(err)
			}
			token++
			n := busy.Poll(out)
			done = append(done, out[:n]...)
		}
		done = append(done, pollAll(t, busy, 405-len(done))...)
		for i, c := range done {
			if c.Err != nil || c.Token != token-405+uint64(i) {
				t.Fatalf("round %d: completion %d: token %d (want %d), %v", round, i, c.Token, token-405+uint64(i), c.Err)
			}
		}
	}
	for i := 0; i < 4; i++ {
		copy(want[i<<20:(i+1)<<20], host[i<<20:(i+1)<<20])
	}
	for k := 0; k < 5; k++ {
		d := (7*5 + k) * 4096
		copy(want[d:d+4096], host[k*4096:k*4096+4096])
	}
	// A Piece of 600 small unaligned writes: one completion, the bytes.
	pn, err := gpunic.New(g, maps, gpunic.Options{RateGBps: 50})
	if err != nil {
		t.Fatal(err)
	}
	var piece []relay.WriteOp
	for i := uint64(0); i < 600; i++ {
		s, d, l := i*5003+11, (599-i)*4099+3, 2001+i%7
		piece = append(piece, relay.WriteOp{Src: uintptr(src) + uintptr(s), Len: l, Target: "t0", Dst: base + d})
		copy(want[d:d+l], host[s:s+l])
	}
	if err := pn.SubmitPiece(piece, 4242); err != nil {
		t.Fatal(err)
	}
	if got := pollAll(t, pn, 1); got[0].Token != 4242 || got[0].Err != nil {
		t.Fatalf("Piece: %+v", got)
	}
	if err := errors.Join(slow.Close(), nic.Close(), busy.Close(), pn.Close()); err != nil {
		t.Fatal(err)
	}
	sum := fnv.New64a()
	sum.Write(want)
	if line := finish(); line != fmt.Sprintf("hash %x", sum.Sum64()) {
		t.Fatalf("target bytes differ: %s, want hash %x", line, sum.Sum64())
	}
}
