// SPDX-License-Identifier: Apache-2.0

package rail

import (
	"context"
	"testing"

	"github.com/pxn-project/pxn/pkg/rail/internal/sysfixture"
)

// BenchmarkDiscover8GPU is perf target K1: discovery on the 8-GPU / 10-HCA
// fixture within 50 ms.
func BenchmarkDiscover8GPU(b *testing.B) {
	opts := Options{NodeRoot: fixture(sysfixture.HGX8GPU)}
	b.ReportAllocs()
	for b.Loop() {
		l, err := Discover(context.Background(), opts)
		if err != nil || l.Rails != 8 {
			b.Fatalf("Discover: %v, %v", l, err)
		}
	}
}
