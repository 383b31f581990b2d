// SPDX-License-Identifier: Apache-2.0

package gpu

import "testing"

func TestHostMap(t *testing.T) {
	var m hostMap
	if _, ok := m.device(0x1000, 8); ok {
		t.Fatal("empty map translated an address")
	}
	for _, r := range []hostRange{{host: 0x10000, size: 0x2000, dev: 0x7000000}, {host: 0x40000, size: 0x1000, dev: 0x9000000}} {
		if err := m.add(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.add(hostRange{host: 0x11000, size: 0x1000, dev: 1}); err == nil {
		t.Fatal("overlapping range accepted")
	}
	tests := []struct {
		p    uintptr
		n    uint64
		want uint64
		ok   bool
	}{
		{0x10000, 8, 0x7000000, true},
		{0x11ff8, 8, 0x7001ff8, true},
		{0x11ffc, 8, 0, false},
		{0x12000, 8, 0, false},
		{0x40008, 8, 0x9000008, true},
		{0xfff8, 8, 0, false},
	}
	for _, tt := range tests {
		got, ok := m.device(tt.p, tt.n)
		if ok != tt.ok || (ok && uint64(got) != tt.want) {
			t.Errorf("device(%#x, %d) = %#x, %v; want %#x, %v", tt.p, tt.n, uint64(got), ok, tt.want, tt.ok)
		}
	}
	if !m.remove(0x10000) || m.remove(0x10000) {
		t.Fatal("remove did not remove exactly once")
	}
	if _, ok := m.device(0x10000, 8); ok {
		t.Fatal("removed range still translates")
	}
	if n := testing.AllocsPerRun(100, func() { m.device(0x40008, 8) }); n != 0 {
		t.Fatalf("device allocates %v times per call", n)
	}
}
