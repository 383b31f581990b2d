package main

import (
	"github.com/pxn-project/pxn/pkg/hosthop"
	"github.com/pxn-project/pxn/pkg/relay"
)

// Copier kinds as pxn_options.copier names them.
const (
	copierDefault uint32 = 0
	copierHost    uint32 = 1
	copierCUDA    uint32 = 2
)

// deviceMemory is what pxn_register_memory needs of a copier: a way to mark
// a range as device memory, so that cross-rail writes from it go through PXN.
type deviceMemory interface {
	RegisterDevice(addr uintptr, n uint64) error
}

// newCopier builds the first-hop copier of kind.
func newCopier(kind uint32) (relay.Copier, deviceMemory, error) {
	switch kind {
	case copierDefault, copierHost:
		c := hosthop.NewHostCopier(hosthop.HostCopierOptions{})
		return c, c, nil
	case copierCUDA:
		return nil, nil, fail(codeNotSup, "copier PXN_COPIER_CUDA is not available in this build of libpxn; use PXN_COPIER_HOST")
	}
	return nil, nil, fail(codeInvalid, "unknown copier kind %d; want PXN_COPIER_DEFAULT, PXN_COPIER_HOST or PXN_COPIER_CUDA", kind)
}
