// SPDX-License-Identifier: Apache-2.0

package hosthop

import (
	"fmt"
	"unsafe"

	"github.com/pxn-project/pxn/internal/testmem"
)

// The shared helpers, under the names these tests use.
var (
	mapped     = testmem.Mapped
	addr       = testmem.Addr
	fill       = testmem.Fill
	eventually = testmem.Eventually
	firstDiff  = testmem.FirstDiff
)

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// misaligned returns a pointer 4 bytes past p. checkptr rejects such a
// conversion, hence the directive.
//
//go:nocheckptr
func misaligned(p *uint64) *uint64 {
	return (*uint64)(unsafe.Add(unsafe.Pointer(p), 4))
}
