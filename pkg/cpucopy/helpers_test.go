// SPDX-License-Identifier: Apache-2.0

package cpucopy

import (
	"fmt"
	"unsafe"

	"github.com/pxn-project/pxn/internal/testmem"
	"github.com/pxn-project/pxn/pkg/sim/hostfault"
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

// simCopier is a HostCopier with the stand-ins that hold its ready events
// and fail its copies, as a test drives them.
type simCopier struct {
	*HostCopier
	*hostfault.Holder
	*hostfault.Faults
}

// newSimCopier returns a copier whose events the Holder holds when hold is
// set; without hold it has no ReadyHolder, as the copier libpxn ships.
func newSimCopier(hold bool) *simCopier {
	h, f := hostfault.NewHolder(), &hostfault.Faults{}
	opts := HostCopierOptions{Faults: f}
	if hold {
		opts.Ready = h
	}
	return &simCopier{HostCopier: NewHostCopier(opts), Holder: h, Faults: f}
}
