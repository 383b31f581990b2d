// SPDX-License-Identifier: Apache-2.0

package fabric

import "github.com/pxn-project/pxn/internal/testmem"

// The shared helpers, under the names these tests use.
var (
	mapped     = testmem.Mapped
	addr       = testmem.Addr
	fill       = testmem.Fill
	eventually = testmem.Eventually
	firstDiff  = testmem.FirstDiff
)
