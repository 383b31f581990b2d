// SPDX-License-Identifier: Apache-2.0

package cpucopy

import (
	"fmt"
	"unsafe"

	"github.com/pxn-project/pxn/internal/sim/hostfault"
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

// simCopier is a HostCopier with the stand-ins that hold its ready events
// and fail its copies, as a test drives them.
type simCopier struct {
	*HostCopier
	*hostfault.Holder
	*hostfault.Faults
}

// newSimCopier returns a copier whose events the Holder holds when hold is
// set; without hold its hooks hold none, as the copier libpxn ships.
func newSimCopier(hold bool) *simCopier {
	h, f := hostfault.NewHolder(), &hostfault.Faults{}
	hk := &hooks{faults: f}
	if hold {
		hk.ready = h
	}
	return &simCopier{HostCopier: newHostCopier(hk), Holder: h, Faults: f}
}

// heldEvents is the number of c's events that wait for their release.
func heldEvents(c *HostCopier) int {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	return len(c.held)
}
