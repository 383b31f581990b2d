// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"
)

// TestArenaStaysWhileHostHoldsOps: once the engine closes, while the
// host's transport holds ops the hop handed it, no range of the arena is
// deregistered (the registry then keeps it allocated until the process
// exits) and each stays registered; once they completed they deregister.
// Before the close a lane deregisters for its new memory whatever other
// lanes' ops are held: the relay renews a lane only once none of its own
// is.
func TestArenaStaysWhileHostHoldsOps(t *testing.T) {
	hop := &cHop{}
	a := &cArena{busy: hop.held.Load}
	const base, size = uintptr(1 << 30), uint64(1 << 20)
	for i := range 3 {
		if err := a.Register(base+uintptr(i)*uintptr(size), size); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Register(base, size); err == nil || !strings.Contains(err.Error(), "registered twice") {
		t.Fatalf("a second Register of one range = %v, want it refused", err)
	}
	for i := range 3 {
		if _, _, in := a.holds(base+uintptr(i)*uintptr(size)+64, 64); !in {
			t.Fatalf("range %d is not held", i)
		}
	}
	if _, _, in := a.holds(base+uintptr(size)-32, 64); in {
		t.Fatal("an op across two ranges is held")
	}
	hop.held.Store(2)
	lane1 := base + uintptr(size)
	if err := a.Deregister(lane1, size); err != nil {
		t.Fatalf("Deregister of a lane before the close with 2 ops held = %v, want it done", err)
	}
	if _, _, in := a.holds(lane1, 64); in {
		t.Fatal("a deregistered lane is still held")
	}
	if err := a.Register(lane1, size); err != nil {
		t.Fatalf("Register of a lane again: %v", err)
	}
	a.closing.Store(true)
	err := a.Deregister(base, size)
	if err == nil || !strings.Contains(err.Error(), "still holds 2 ops") {
		t.Fatalf("Deregister with 2 ops held = %v, want a refusal naming them", err)
	}
	if _, _, in := a.holds(base, 64); !in {
		t.Fatal("the range was forgotten by a refused Deregister")
	}
	hop.held.Store(0)
	for i := range 3 {
		if err := a.Deregister(base+uintptr(i)*uintptr(size), size); err != nil {
			t.Fatalf("Deregister with nothing held = %v", err)
		}
	}
	if _, _, in := a.holds(base, 64); in {
		t.Fatal("the arena is still held after Deregister")
	}
	if err := a.Deregister(base, size); err == nil {
		t.Fatal("a second Deregister of one range succeeded")
	}
}
