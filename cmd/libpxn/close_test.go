// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"
)

// TestArenaStaysWhileHostHoldsOps: while the host's transport holds ops the
// hop handed it, the arena refuses to be deregistered (the registry then
// keeps it allocated until the process exits) and stays the registered
// arena; once they completed it deregisters.
func TestArenaStaysWhileHostHoldsOps(t *testing.T) {
	hop := &cHop{}
	a := &cArena{busy: hop.held.Load}
	const base, size = uintptr(1 << 30), uint64(1 << 20)
	if err := a.Register(base, size); err != nil {
		t.Fatal(err)
	}
	hop.held.Store(2)
	err := a.Deregister(base, size)
	if err == nil || !strings.Contains(err.Error(), "still holds 2 ops") {
		t.Fatalf("Deregister with 2 ops held = %v, want a refusal naming them", err)
	}
	if _, _, in := a.holds(base, 64); !in {
		t.Fatal("the arena was forgotten by a refused Deregister")
	}
	hop.held.Store(0)
	if err := a.Deregister(base, size); err != nil {
		t.Fatalf("Deregister with nothing held = %v", err)
	}
	if _, _, in := a.holds(base, 64); in {
		t.Fatal("the arena is still held after Deregister")
	}
}
