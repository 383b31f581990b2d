// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
)

// recordingRegistrar records the NIC registrations it is asked for, by
// lane of the arena whose base is set once the arena is known.
type recordingRegistrar struct {
	mu    sync.Mutex
	calls []string
	// raw are the calls made before base was known: (base, size) pairs.
	raw  [][2]uint64
	base uintptr
	// failRegister fails every Register from the time it is set.
	failRegister bool
}

func (c *recordingRegistrar) record(op string, base uintptr, size uint64) {
	if c.base == 0 {
		c.raw = append(c.raw, [2]uint64{uint64(base), size})
		c.calls = append(c.calls, op+" ?")
		return
	}
	off := uint64(base - c.base)
	if size != staging.LaneBytes || off%staging.LaneBytes != 0 || off/staging.LaneBytes >= staging.LaneCount {
		c.calls = append(c.calls, fmt.Sprintf("%s %#x+%d", op, off, size))
		return
	}
	c.calls = append(c.calls, fmt.Sprintf("%s lane%d", op, off/staging.LaneBytes))
}

func (c *recordingRegistrar) Register(base uintptr, size uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.record("register", base, size)
	if c.failRegister {
		return errors.New("the NIC is out of memory regions")
	}
	return nil
}

func (c *recordingRegistrar) Deregister(base uintptr, size uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.record("deregister", base, size)
	return nil
}

// take returns the calls recorded since the last take.
func (c *recordingRegistrar) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	got := c.calls
	c.calls = nil
	return got
}

// openLane does what the pump does when it follows lane i's claim once
// nothing reads the lane: it adopts the claim and opens its ring.
func openLane(t *testing.T, r *Rank, i int) error {
	t.Helper()
	r.inbound[i].Sync()
	return r.inbound[i].Open()
}

// waitFree waits until the relay has seen lane i's release.
func waitFree(t *testing.T, r *Rank, i int) {
	t.Helper()
	pollUntil(t, fmt.Sprintf("lane %d free", i), func() bool {
		_, held := r.ctl.Lanes[i].Owner.Load()
		return !held
	})
}

// The arena is registered with the NIC lane by lane. A lane's first claim
// keeps the lane's memory and registration; a later claim of it brings
// new memory, which the relay puts in place when it opens the claim's
// ring, with exactly that lane deregistered before and registered again
// after; until then the relay reads the lane's memory before it. The
// holder before keeps a mapping of the lane after its release: it sees
// nothing of what the next holder stages, and what it writes never
// reaches the relay's view of the lane. A registration that fails there
// quarantines the arena, ends the claim and retires the lane: a later
// claim that finds only that lane free is refused with the reason.
func TestLaneRenewalRegistersTheLaneAgain(t *testing.T) {
	root := regTestRoot(t)
	rec := &recordingRegistrar{}
	o := regOptions(root, "g", "rail0")
	o.Memory = rec
	relay := mustRegister(t, o)
	rec.mu.Lock()
	rec.base = relay.Arena().Base()
	for i, c := range rec.raw {
		if got := uintptr(c[0]); got != relay.laneBase(i) || c[1] != staging.LaneBytes {
			t.Errorf("registration %d: %#x+%d, want lane %d at %#x+%d", i, got, c[1], i, relay.laneBase(i), uint64(staging.LaneBytes))
		}
	}
	rec.mu.Unlock()
	want := slices.Repeat([]string{"register ?"}, staging.LaneCount)
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("at registration the NIC was asked %v, want each lane registered once, in order", got)
	}
	view := func(i int) []byte { return foreignBytes(relay.laneBase(i), 4096) }
	fill := func(b []byte, v byte) {
		for k := range b {
			b[k] = v
		}
	}
	holds := func(b []byte, v byte) bool { return b[0] == v && b[len(b)-1] == v }

	ranks := make([]*Rank, 7)
	for k := range ranks {
		ranks[k] = mustRegister(t, regOptions(root, "g", fmt.Sprintf("rail%d", k+1)))
	}
	first := attachByName(t, ranks[0], relay.Name())
	if first.LaneIndex() != 0 {
		t.Fatalf("the first claim got lane %d, want 0", first.LaneIndex())
	}
	if err := openLane(t, relay, 0); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("a lane's first claim asked the NIC %v, want nothing", got)
	}
	firstMem := foreignBytes(first.StagingBase(), 4096)
	fill(firstMem, 0x11)
	if !holds(view(0), 0x11) {
		t.Fatal("the relay does not see what the lane's first holder staged")
	}
	p, _, errno := unix.Syscall6(unix.SYS_MREMAP, first.StagingBase(), 0, staging.LaneBytes, unix.MREMAP_MAYMOVE, 0, 0)
	if errno != 0 {
		t.Fatalf("mremap: %v", errno)
	}
	kept := foreignBytes(p, 4096)
	defer unix.Munmap(unsafe.Slice(&kept[0], staging.LaneBytes))
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	waitFree(t, relay, 0)

	second := attachByName(t, ranks[1], relay.Name())
	if second.LaneIndex() != 0 {
		t.Fatalf("the second claim got lane %d, want 0, the first's", second.LaneIndex())
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("granting a lane asked the NIC %v before the ring opened, want nothing", got)
	}
	secondMem := foreignBytes(second.StagingBase(), 4096)
	fill(secondMem, 0x22)
	if !holds(view(0), 0x11) || !holds(kept, 0x11) {
		t.Error("the next holder's staging memory is the lane's memory before its ring opened")
	}
	if err := openLane(t, relay, 0); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.take(), []string{"deregister lane0", "register lane0"}; !slices.Equal(got, want) {
		t.Errorf("opening a lane claimed anew asked the NIC %v, want %v", got, want)
	}
	if !holds(view(0), 0x22) {
		t.Error("the relay does not see what the lane's new holder staged")
	}
	if holds(kept, 0x22) {
		t.Error("the holder before sees what the lane's new holder staged")
	}
	fill(kept, 0x33)
	if !holds(view(0), 0x22) || !holds(secondMem, 0x22) {
		t.Error("what the holder before wrote after its release reached the lane")
	}

	third := attachByName(t, ranks[2], relay.Name())
	if third.LaneIndex() != 1 {
		t.Fatalf("the third claim got lane %d, want 1", third.LaneIndex())
	}
	if err := openLane(t, relay, 1); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("lane 1's first claim asked the NIC %v, want nothing", got)
	}

	rec.mu.Lock()
	rec.failRegister = true
	rec.mu.Unlock()
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	waitFree(t, relay, 0)
	again := attachByName(t, ranks[0], relay.Name())
	if again.LaneIndex() != 0 {
		t.Fatalf("the claim after the second holder got lane %d, want 0", again.LaneIndex())
	}
	err := openLane(t, relay, 0)
	if err == nil || !strings.Contains(err.Error(), "register lane 0's new memory") || !strings.Contains(err.Error(), "quarantined") {
		t.Fatalf("opening the lane whose registration fails: %v, want the failure, naming the lane and the quarantine", err)
	}
	if got, want := rec.take(), []string{"deregister lane0", "register lane0"}; !slices.Equal(got, want) {
		t.Errorf("a failing renewal asked the NIC %v, want %v", got, want)
	}
	if !relay.quarantined.Load() {
		t.Error("the arena is not quarantined after a failed registration")
	}
	if relay.inbound[0].Opened() {
		t.Error("the ring of a lane whose registration failed opened")
	}
	if _, held := relay.ctl.Lanes[0].Owner.Load(); held {
		t.Error("the claim of a lane whose registration failed still stands")
	}
	if err := again.Live(staging.MonoNanos()); !errors.Is(err, ErrPeerGone) {
		t.Errorf("the holder of the retired lane: Live = %v, want ErrPeerGone", err)
	}
	if err := openLane(t, relay, 0); err != nil || relay.inbound[0].Opened() {
		t.Errorf("opening the retired lane again: %v, opened %v; want nothing done", err, relay.inbound[0].Opened())
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	rec.failRegister = false
	rec.mu.Unlock()
	for k := 1; k < len(ranks); k++ {
		if k == 2 {
			continue
		}
		if l := attachByName(t, ranks[k], relay.Name()); l.LaneIndex() == 0 {
			t.Fatalf("rank %d was granted the retired lane", k)
		}
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("first claims of the other lanes asked the NIC %v, want nothing", got)
	}
	_, err = ranks[0].Attach(context.Background(), peerByName(t, ranks[0], relay.Name()))
	if err == nil || !strings.Contains(err.Error(), "retired") || !strings.Contains(err.Error(), "registered with the NIC") {
		t.Fatalf("a claim that finds only the retired lane free: %v, want it refused with the reason", err)
	}
}
