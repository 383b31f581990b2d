// SPDX-License-Identifier: Apache-2.0

package cpucopy

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

func newCopier(t testing.TB, hold bool) *simCopier {
	t.Helper()
	c := newSimCopier(hold)
	t.Cleanup(func() {
		c.ReleaseAllReady()
		_ = c.Close()
	})
	return c
}

// bell is a doorbell word on its own cache line.
type bell struct {
	seq uint64
	_   [56]byte
}

func (b *bell) load() uint64 { return atomic.LoadUint64(&b.seq) }

func TestHostCopierClassify(t *testing.T) {
	c := newCopier(t, false)
	const a, b = 0x10000, 0x20000
	for _, r := range []struct{ addr, n uint64 }{{a, 0x1000}, {a + 0x1000, 0x1000}, {b, 0x10}} {
		if err := c.RegisterDevice(uintptr(r.addr), r.n); err != nil {
			t.Fatalf("RegisterDevice(%#x, %d): %v", r.addr, r.n, err)
		}
	}
	for _, r := range []struct {
		addr, n uint64
	}{{a, 0}, {a + 0xfff, 2}, {a - 1, 2}, {b + 0xf, 1}, {1 << 40, math.MaxUint64}} {
		if err := c.RegisterDevice(uintptr(r.addr), r.n); err == nil {
			t.Errorf("RegisterDevice(%#x, %d) succeeded, want an error", r.addr, r.n)
		}
	}
	tests := []struct {
		name string
		addr uint64
		n    uint64
		want relay.Kind
	}{
		{"inside", a + 10, 100, relay.Device},
		{"whole range", a, 0x1000, relay.Device},
		{"second range", a + 0x1000, 0x1000, relay.Device},
		{"across two adjacent ranges", a + 0xff0, 0x20, relay.Host},
		{"starts before", a - 1, 2, relay.Host},
		{"ends after", b + 8, 9, relay.Host},
		{"last byte", b + 0xf, 1, relay.Device},
		{"just past", b + 0x10, 1, relay.Host},
		{"between", a + 0x2000, 1, relay.Host},
		{"huge length", a, math.MaxUint64, relay.Host},
		{"low memory", 0, 8, relay.Host},
		{"top of memory", math.MaxUint64, 1, relay.Host},
	}
	for _, tt := range tests {
		if got := c.Classify(uintptr(tt.addr), tt.n); got != tt.want {
			t.Errorf("%s: Classify(%#x, %d) = %v, want %v", tt.name, tt.addr, tt.n, got, tt.want)
		}
		// ClassifyRange agrees, and names the registered range that
		// holds device memory.
		k, start, size := c.ClassifyRange(uintptr(tt.addr), tt.n)
		if k != tt.want {
			t.Errorf("%s: ClassifyRange(%#x, %d) kind %v, want %v", tt.name, tt.addr, tt.n, k, tt.want)
		}
		if k == relay.Device && !(uint64(start) <= tt.addr && tt.addr+tt.n <= uint64(start)+size && (size == 0x1000 || size == 0x10)) {
			t.Errorf("%s: ClassifyRange(%#x, %d) range [%#x, +%#x) does not hold it as registered", tt.name, tt.addr, tt.n, start, size)
		}
	}
}

func TestHostCopierClassifyConcurrent(t *testing.T) {
	c := newCopier(t, false)
	const ranges = 64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range ranges {
			if err := c.RegisterDevice(uintptr(0x100000+i*0x2000), 0x1000); err != nil {
				t.Errorf("RegisterDevice: %v", err)
			}
		}
	}()
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10000 {
				a := uintptr(0x100000 + (i%ranges)*0x2000 + 0x1000)
				if c.Classify(a, 1) != relay.Host {
					t.Errorf("gap at %#x classified as device", a)
					return
				}
			}
		}()
	}
	wg.Wait()
	for i := range ranges {
		if got := c.Classify(uintptr(0x100000+i*0x2000), 0x1000); got != relay.Device {
			t.Fatalf("range %d classified %v", i, got)
		}
	}
}

// TestHostCopierNoGoroutineBeforeFirstCopy counts the goroutines the copier
// itself starts, through its hooks, not the process's: another test's
// goroutine winding down does not move the count.
func TestHostCopierNoGoroutineBeforeFirstCopy(t *testing.T) {
	c := newCopier(t, false)
	var started atomic.Int32
	c.hooks.goStarted = func() { started.Add(1) }
	if err := c.RegisterDevice(0x1000, 0x1000); err != nil {
		t.Fatal(err)
	}
	ev, err := c.RecordReady(0)
	if err != nil {
		t.Fatal(err)
	}
	if done, err := c.Query(ev); !done || err != nil {
		t.Fatalf("Query(%d) = %v, %v; want complete", ev, done, err)
	}
	if err := c.FailNextCopy(4, errors.New("x")); err != nil {
		t.Fatal(err)
	}
	if n := started.Load(); n != 0 {
		t.Fatalf("%d goroutines started before any Copy", n)
	}
	if n := c.Stats().Lanes; n != 0 {
		t.Fatalf("%d lanes started before any Copy", n)
	}
	src, dst := mapped(t, 64), mapped(t, 64)
	var b bell
	if err := c.Copy(3, ev, []relay.CopyEntry{{Src: addr(src), Dst: addr(dst), Len: 64}}, &b.seq, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "doorbell", func() bool { return b.load() == 1 })
	if n := c.Stats().Lanes; n != 1 {
		t.Fatalf("%d lanes started after one Copy, want 1", n)
	}
	if n := started.Load(); n != 1 {
		t.Fatalf("%d goroutines started after one Copy, want the lane's 1", n)
	}
}

func TestHostCopierEvents(t *testing.T) {
	c := newCopier(t, false)
	e1, _ := c.RecordReady(0)
	e2, _ := c.RecordReady(0xdead)
	if e1 == 0 || e2 == 0 || e1 == e2 {
		t.Fatalf("events %d, %d: want distinct non-zero", e1, e2)
	}
	if got := c.Stats().LiveEvents; got != 2 {
		t.Fatalf("LiveEvents = %d, want 2", got)
	}
	c.Release(e1)
	if _, err := c.Query(e1); !errors.Is(err, ErrUnknownEvent) {
		t.Fatalf("Query of a released event: %v, want ErrUnknownEvent", err)
	}
	if done, err := c.Query(0); !done || err != nil {
		t.Fatalf("Query(0) = %v, %v", done, err)
	}
	var b bell
	if err := c.Copy(0, e1, nil, &b.seq, 1); !errors.Is(err, ErrUnknownEvent) {
		t.Fatalf("Copy after a released event: %v, want ErrUnknownEvent", err)
	}
	c.Release(e2)
	if got := c.Stats().LiveEvents; got != 0 {
		t.Fatalf("LiveEvents = %d after releasing all, want 0", got)
	}
}

// TestHostCopierDoorbellAfterData plays the relay: a watcher that sees a
// slot's doorbell at seq must find the slot's bytes in place. Slots are
// reused only after the watcher consumed them, as the ring's credit demands.
// The buffers are Go memory so that the race detector, too, proves that the
// doorbell orders the copy before the watcher's reads; the watcher reads the
// last byte, the one a copy writes last, first.
func TestHostCopierDoorbellAfterData(t *testing.T) {
	const slots, slotSize, rounds = 6, 256 << 10, 120
	c := newCopier(t, false)
	src := make([]byte, slots*slotSize)
	dst := make([]byte, slots*slotSize)
	bells := make([]bell, slots)
	consumed := make(chan uint64, slots)
	watchErr := make(chan error, 1)
	go func() {
		for seq := uint64(1); seq <= rounds; seq++ {
			s := int((seq - 1) % slots)
			for bells[s].load() != seq {
				time.Sleep(10 * time.Microsecond)
			}
			if end := (s+1)*slotSize - 1; dst[end] != src[end] {
				watchErr <- errorf("seq %d slot %d: last byte not in place when the doorbell rang", seq, s)
				return
			}
			if i := firstDiff(dst[s*slotSize:(s+1)*slotSize], src[s*slotSize:(s+1)*slotSize]); i >= 0 {
				watchErr <- errorf("seq %d slot %d: byte %d not in place when the doorbell rang", seq, s, i)
				return
			}
			consumed <- seq
		}
		watchErr <- nil
	}()
	reaped := uint64(0)
	for seq := uint64(1); seq <= rounds; seq++ {
		for seq-reaped > slots {
			select {
			case reaped = <-consumed:
			case err := <-watchErr:
				t.Fatal(err)
			}
		}
		s := int((seq - 1) % slots)
		fill(src[s*slotSize:(s+1)*slotSize], seq)
		entries := []relay.CopyEntry{
			{Src: addr(src) + uintptr(s*slotSize), Dst: addr(dst) + uintptr(s*slotSize), Len: slotSize / 2},
			{Src: addr(src) + uintptr(s*slotSize+slotSize/2), Dst: addr(dst) + uintptr(s*slotSize+slotSize/2), Len: slotSize / 2},
		}
		if err := c.Copy(int(seq%staging.LaneCount), 0, entries, &bells[s].seq, seq); err != nil {
			t.Fatalf("Copy seq %d: %v", seq, err)
		}
	}
	if err := <-watchErr; err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Copies != rounds || st.Bytes != rounds*slotSize {
		t.Fatalf("stats %+v, want %d copies of %d bytes", st, rounds, slotSize)
	}
}

func TestHostCopierLaneOrder(t *testing.T) {
	c := newCopier(t, false)
	const n = LaneQueueDepth
	srcs := mapped(t, n*256)
	dst := mapped(t, 256)
	for i := range n {
		fill(srcs[i*256:(i+1)*256], uint64(i)+1)
	}
	var b bell
	stop := make(chan struct{})
	monotonic := make(chan error, 1)
	go func() {
		last := uint64(0)
		for {
			v := b.load()
			if v < last {
				monotonic <- errorf("doorbell went back from %d to %d", last, v)
				return
			}
			last = v
			select {
			case <-stop:
				monotonic <- nil
				return
			default:
				runtime.Gosched()
			}
		}
	}()
	for i := range n {
		e := []relay.CopyEntry{{Src: addr(srcs) + uintptr(i*256), Dst: addr(dst), Len: 256}}
		if err := c.Copy(5, 0, e, &b.seq, uint64(i)+1); err != nil {
			t.Fatalf("Copy %d: %v", i, err)
		}
	}
	eventually(t, "last doorbell", func() bool { return b.load() == n })
	close(stop)
	if err := <-monotonic; err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(dst, srcs[(n-1)*256:]); i >= 0 {
		t.Fatalf("destination differs from the last copy at byte %d: copies ran out of order", i)
	}
}

func TestHostCopierHoldReady(t *testing.T) {
	c := newCopier(t, true)
	src, dst := mapped(t, 4096), mapped(t, 4096)
	src2, dst2 := mapped(t, 16), mapped(t, 16)
	fill(src, 1)
	fill(src2, 2)
	ev, err := c.RecordReady(0x1234)
	if err != nil {
		t.Fatal(err)
	}
	if done, err := c.Query(ev); done || err != nil {
		t.Fatalf("Query(held) = %v, %v; want incomplete", done, err)
	}
	if got := c.HeldReady(); len(got) != 1 || got[0] != ev {
		t.Fatalf("HeldReady = %v, want [%d]", got, ev)
	}
	var b1, b2, bOther bell
	if err := c.Copy(1, ev, []relay.CopyEntry{{Src: addr(src), Dst: addr(dst), Len: 4096}}, &b1.seq, 7); err != nil {
		t.Fatal(err)
	}
	// Same lane, no event: a stream does not run past the held wait.
	if err := c.Copy(1, 0, []relay.CopyEntry{{Src: addr(src2), Dst: addr(dst2), Len: 16}}, &b2.seq, 8); err != nil {
		t.Fatal(err)
	}
	// The engine may release its handle once the copy is enqueued.
	c.Release(ev)
	// Another lane runs meanwhile.
	if err := c.Copy(2, 0, []relay.CopyEntry{{Src: addr(src2), Dst: addr(dst2), Len: 0}}, &bOther.seq, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "other lane's doorbell", func() bool { return bOther.load() == 1 })
	if b1.load() != 0 || b2.load() != 0 {
		t.Fatalf("doorbells %d, %d rang before the ready event", b1.load(), b2.load())
	}
	for i, v := range dst {
		if v != 0 {
			t.Fatalf("destination byte %d written before the ready event", i)
		}
	}
	// The source is read only after release: this write must land.
	fill(src, 3)
	if err := c.ReleaseReady(ev); err != nil {
		t.Fatal(err)
	}
	eventually(t, "doorbells after release", func() bool { return b1.load() == 7 && b2.load() == 8 })
	if i := firstDiff(dst, src); i >= 0 {
		t.Fatalf("byte %d differs from the source as of the release", i)
	}
	if i := firstDiff(dst2, src2); i >= 0 {
		t.Fatalf("second copy: byte %d differs", i)
	}
	if err := c.ReleaseReady(ev); !errors.Is(err, ErrUnknownEvent) {
		t.Fatalf("second ReleaseReady: %v, want ErrUnknownEvent", err)
	}
	if n := heldEvents(c.HostCopier); n != 0 {
		t.Fatalf("%d events held", n)
	}
}

func TestHostCopierLaneFull(t *testing.T) {
	c := newCopier(t, true)
	ev, _ := c.RecordReady(0)
	bells := make([]bell, LaneQueueDepth+1)
	for i := range LaneQueueDepth {
		if err := c.Copy(0, ev, nil, &bells[i].seq, uint64(i)+1); err != nil {
			t.Fatalf("Copy %d: %v", i, err)
		}
	}
	err := c.Copy(0, ev, nil, &bells[LaneQueueDepth].seq, LaneQueueDepth+1)
	if !errors.Is(err, ErrLaneFull) {
		t.Fatalf("Copy on a full lane: %v, want ErrLaneFull", err)
	}
	if err := c.Copy(1, 0, nil, &bells[LaneQueueDepth].seq, 1); err != nil {
		t.Fatalf("another lane is not full: %v", err)
	}
	if err := c.ReleaseReady(ev); err != nil {
		t.Fatal(err)
	}
	eventually(t, "all doorbells", func() bool {
		for i := range LaneQueueDepth {
			if bells[i].load() != uint64(i)+1 {
				return false
			}
		}
		return true
	})
	if err := c.Copy(0, 0, nil, &bells[0].seq, 100); err != nil {
		t.Fatalf("Copy after the lane drained: %v", err)
	}
}

func TestHostCopierCopyErrors(t *testing.T) {
	c := newCopier(t, false)
	var b bell
	buf := mapped(t, 64)
	tests := []struct {
		name     string
		lane     int
		entries  []relay.CopyEntry
		doorbell *uint64
		want     string
	}{
		{"negative lane", -1, nil, &b.seq, "lane -1 out of range"},
		{"lane past the last", staging.LaneCount, nil, &b.seq, "lane 7 out of range"},
		{"huge lane", math.MaxInt, nil, &b.seq, "out of range"},
		{"nil doorbell", 0, nil, nil, "nil doorbell"},
		{"misaligned doorbell", 0, nil, misaligned(&b.seq), "not 8-byte aligned"},
		{"nil source", 0, []relay.CopyEntry{{Src: 0, Dst: addr(buf), Len: 8}}, &b.seq, "entry 0"},
		{"overflowing destination", 0, []relay.CopyEntry{{Src: addr(buf), Dst: addr(buf), Len: 8}, {Src: addr(buf), Dst: math.MaxUint64 - 3, Len: 8}}, &b.seq, "entry 1"},
	}
	for _, tt := range tests {
		err := c.Copy(tt.lane, 0, tt.entries, tt.doorbell, 1)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Copy = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	if n := c.Stats().Lanes; n != 0 {
		t.Fatalf("rejected copies started %d lanes", n)
	}
	if b.load() != 0 {
		t.Fatalf("a rejected copy rang the doorbell")
	}
	if err := c.FailNextCopy(staging.LaneCount, errors.New("x")); err == nil {
		t.Fatal("FailNextCopy accepted lane 7")
	}
}

func TestHostCopierFailNextCopy(t *testing.T) {
	c := newCopier(t, false)
	src, dst := mapped(t, 32), mapped(t, 32)
	fill(src, 9)
	injected := errors.New("injected doorbell failure")
	if err := c.FailNextCopy(2, injected); err != nil {
		t.Fatal(err)
	}
	var b bell
	e := []relay.CopyEntry{{Src: addr(src), Dst: addr(dst), Len: 32}}
	if err := c.Copy(3, 0, e, &b.seq, 1); err != nil {
		t.Fatalf("lane 3 is not failed: %v", err)
	}
	eventually(t, "lane 3 doorbell", func() bool { return b.load() == 1 })
	clear(dst)
	if err := c.Copy(2, 0, e, &b.seq, 2); !errors.Is(err, injected) {
		t.Fatalf("Copy on lane 2 = %v, want the injected error", err)
	}
	if err := c.Copy(2, 0, e, &b.seq, 3); err != nil {
		t.Fatalf("the failure is for one copy only: %v", err)
	}
	eventually(t, "lane 2 doorbell", func() bool { return b.load() == 3 })
	if got := c.Stats().Copies; got != 2 {
		t.Fatalf("%d copies ran, want 2 (the failed one enqueues nothing)", got)
	}
}

func TestHostCopierCloseDrains(t *testing.T) {
	c := NewHostCopier()
	const perLane = LaneQueueDepth
	src := mapped(t, 1<<20)
	fill(src, 5)
	dst := mapped(t, staging.LaneCount*(1<<20))
	bells := make([]bell, staging.LaneCount)
	for seq := uint64(1); seq <= perLane; seq++ {
		for lane := range staging.LaneCount {
			e := []relay.CopyEntry{{Src: addr(src), Dst: addr(dst) + uintptr(lane<<20), Len: 1 << 20}}
			if err := c.Copy(lane, 0, e, &bells[lane].seq, seq); err != nil {
				t.Fatalf("Copy lane %d seq %d: %v", lane, seq, err)
			}
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for lane := range staging.LaneCount {
		if got := bells[lane].load(); got != perLane {
			t.Errorf("lane %d doorbell %d after Close, want %d", lane, got, perLane)
		}
		if i := firstDiff(dst[lane<<20:(lane+1)<<20], src); i >= 0 {
			t.Errorf("lane %d byte %d not copied by Close", lane, i)
		}
	}
	var b bell
	if err := c.Copy(0, 0, nil, &b.seq, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Copy after Close = %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got := c.Stats().Copies; got != perLane*staging.LaneCount {
		t.Fatalf("Copies = %d", got)
	}
}

func TestHostCopierCloseDropsHeld(t *testing.T) {
	c := newSimCopier(true)
	src, dst := mapped(t, 64), mapped(t, 64)
	fill(src, 1)
	ev, _ := c.RecordReady(0)
	var held, behind, other bell
	e := []relay.CopyEntry{{Src: addr(src), Dst: addr(dst), Len: 64}}
	if err := c.Copy(0, ev, e, &held.seq, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Copy(0, 0, e, &behind.seq, 2); err != nil {
		t.Fatal(err)
	}
	if err := c.Copy(1, 0, nil, &other.seq, 3); err != nil {
		t.Fatal(err)
	}
	err := c.Close()
	if err == nil || !strings.Contains(err.Error(), "dropped 2 copies") {
		t.Fatalf("Close = %v, want a report of 2 dropped copies", err)
	}
	if held.load() != 0 || behind.load() != 0 || other.load() != 3 {
		t.Fatalf("doorbells %d %d %d, want 0 0 3", held.load(), behind.load(), other.load())
	}
	for i, v := range dst {
		if v != 0 {
			t.Fatalf("byte %d of a dropped copy was written", i)
		}
	}
}

// TestHostCopierGateReuse checks the reuse of held events' gates: a gate is
// reused only once no event and no waiting copy refers to it, and starts
// closed again.
func TestHostCopierGateReuse(t *testing.T) {
	c := newCopier(t, true)
	src, dst := mapped(t, 64), mapped(t, 64)
	fill(src, 44)
	e := []relay.CopyEntry{{Src: addr(src), Dst: addr(dst), Len: 64}}
	pooled := func() int {
		c.evMu.Lock()
		defer c.evMu.Unlock()
		return len(c.gates)
	}
	record := func() relay.Event {
		t.Helper()
		ev, err := c.RecordReady(0)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	var a, b, other bell
	// Lane 0: copy A behind first, then copy B behind second.
	first, second := record(), record()
	if err := c.Copy(0, first, e, &a.seq, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Copy(0, second, e, &b.seq, 2); err != nil {
		t.Fatal(err)
	}
	// second ends before B runs: its gate must wait for B.
	c.Release(second)
	if err := c.ReleaseReady(second); err != nil {
		t.Fatal(err)
	}
	if n := pooled(); n != 0 {
		t.Fatalf("%d gates reused while a copy waits on one", n)
	}
	third := record()
	if done, err := c.Query(third); done || err != nil {
		t.Fatalf("Query(third) = %v, %v; want incomplete", done, err)
	}
	if err := c.ReleaseReady(first); err != nil {
		t.Fatal(err)
	}
	eventually(t, "copies behind released events", func() bool { return a.load() == 1 && b.load() == 2 })
	c.Release(first)
	if n := pooled(); n != 2 {
		t.Fatalf("%d gates kept for reuse, want 2 (first and second)", n)
	}

	// A reused gate starts closed: a copy behind it waits.
	fourth := record()
	if done, err := c.Query(fourth); done || err != nil {
		t.Fatalf("Query on a reused gate = %v, %v; want incomplete", done, err)
	}
	if err := c.Copy(0, fourth, e, &a.seq, 3); err != nil {
		t.Fatal(err)
	}
	if err := c.Copy(1, 0, nil, &other.seq, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "other lane", func() bool { return other.load() == 1 })
	if err := c.Copy(1, 0, nil, &other.seq, 2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "other lane again", func() bool { return other.load() == 2 })
	if a.load() != 1 {
		t.Fatalf("doorbell %d: a copy ran past a reused, unreleased gate", a.load())
	}
	if err := c.ReleaseReady(fourth); err != nil {
		t.Fatal(err)
	}
	eventually(t, "copy behind the reused gate", func() bool { return a.load() == 3 })
	c.Release(fourth)

	// Copies that fail give their reference back.
	fifth := record()
	injected := errors.New("injected")
	if err := c.FailNextCopy(2, injected); err != nil {
		t.Fatal(err)
	}
	if err := c.Copy(2, fifth, e, &other.seq, 3); !errors.Is(err, injected) {
		t.Fatalf("Copy = %v, want the injected error", err)
	}
	if err := c.ReleaseReady(fifth); err != nil {
		t.Fatal(err)
	}
	c.Release(fifth)
	c.Release(third)
	if err := c.ReleaseReady(third); err != nil {
		t.Fatal(err)
	}
	if n := pooled(); n != 3 {
		t.Fatalf("%d gates kept for reuse, want 3: a failed Copy kept a reference", n)
	}
	if st := c.Stats(); st.LiveEvents != 0 || heldEvents(c.HostCopier) != 0 {
		t.Fatalf("stats %+v, %d held", st, heldEvents(c.HostCopier))
	}
}

// A lane has drained only once its worker has made the last write of every
// copy enqueued on it, part words and doorbell included, or dropped it at
// Close; its doorbell words say nothing about it.
func TestHostCopierDrained(t *testing.T) {
	c := newSimCopier(true)
	src, dst := mapped(t, 8192), mapped(t, 8192)
	fill(src, 1)
	for _, lane := range []int{-1, 0, 1, staging.LaneCount} {
		if !c.Drained(lane) {
			t.Fatalf("Drained(%d) before any copy = false", lane)
		}
	}
	ev, err := c.RecordReady(0)
	if err != nil {
		t.Fatal(err)
	}
	var b bell
	var words [staging.MaxParts - 1]uint64
	e := []relay.CopyEntry{{Src: addr(src), Dst: addr(dst), Len: 4096}, {Src: addr(src) + 4096, Dst: addr(dst) + 4096, Len: 4096}}
	if err := c.CopyParts(1, ev, e, []uint32{1}, &b.seq, &words, 7); err != nil {
		t.Fatal(err)
	}
	// A doorbell that someone else stored does not drain the lane.
	atomic.StoreUint64(&b.seq, 7)
	atomic.StoreUint64(&words[0], 7)
	if c.Drained(1) || !c.Drained(0) {
		t.Fatalf("Drained(1), Drained(0) = %v, %v with a copy held on lane 1; want false, true", c.Drained(1), c.Drained(0))
	}
	atomic.StoreUint64(&b.seq, 0)
	if err := c.ReleaseReady(ev); err != nil {
		t.Fatal(err)
	}
	eventually(t, "lane 1 drained", func() bool { return c.Drained(1) })
	if b.load() != 7 || firstDiff(dst, src) >= 0 {
		t.Fatalf("lane drained before its copy ended: doorbell %d, first differing byte %d", b.load(), firstDiff(dst, src))
	}
	ev, err = c.RecordReady(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Copy(1, ev, e, &b.seq, 8); err != nil {
		t.Fatal(err)
	}
	if c.Drained(1) {
		t.Fatal("Drained(1) with a copy held")
	}
	if err := c.Close(); err == nil {
		t.Fatal("Close dropped no copy")
	}
	if !c.Drained(1) || b.load() != 7 {
		t.Fatalf("after Close: Drained(1) %v, doorbell %d; want true, 7", c.Drained(1), b.load())
	}
}
