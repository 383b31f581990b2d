// SPDX-License-Identifier: Apache-2.0

package gpunic

import "testing"

func TestNICPace(t *testing.T) {
	n := &NIC{rate: 50}
	if f := n.pace(1000, 50_000); f != 2000 {
		t.Fatalf("first op finishes at %d, want 2000", f)
	}
	if f := n.pace(1500, 100_000); f != 4000 {
		t.Fatalf("queued op finishes at %d, want 4000 (after the first)", f)
	}
	if f := n.pace(10_000, 50); f != 10_001 {
		t.Fatalf("op on an idle wire finishes at %d, want 10001", f)
	}
	if f := (&NIC{}).pace(5, 1<<30); f != 0 {
		t.Fatalf("uncapped NIC paced an op to %d", f)
	}
}
