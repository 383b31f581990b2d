// SPDX-License-Identifier: Apache-2.0

package cuda

/*
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// MemHandle is a CUmemGenericAllocationHandle: physical memory made with
// cuMemCreate or imported with cuMemImportFromShareableHandle.
type MemHandle uint64

// Device attributes of virtual memory management.
const (
	AttrHandleTypePosixFDSupported    DeviceAttribute = 103
	AttrGPUDirectRDMAWithVMMSupported DeviceAttribute = 110
	memAllocationTypePinned                           = 1
	memHandleTypePosixFD                              = 1
	memLocationTypeDevice                             = 1
	memAccessProtReadWrite                            = 3
	memAllocGranularityMinimum                        = 0
	memAllocGranularityRecommended                    = 1
)

// AllocationProp is the part of a CUmemAllocationProp this package sets: a
// pinned allocation on Device that can be exported as a POSIX file
// descriptor, and registered with an RDMA NIC when GPUDirectRDMA is set.
type AllocationProp struct {
	Device        Device
	GPUDirectRDMA bool
}

func (p AllocationProp) c() C.CUmemAllocationProp {
	var cp C.CUmemAllocationProp
	C.memset(unsafe.Pointer(&cp), 0, C.size_t(C.sizeof_CUmemAllocationProp))
	cp._type = memAllocationTypePinned
	cp.requestedHandleTypes = memHandleTypePosixFD
	cp.location._type = memLocationTypeDevice
	cp.location.id = C.int(p.Device)
	if p.GPUDirectRDMA {
		cp.allocFlags.gpuDirectRDMACapable = 1
	}
	return cp
}

// ErrNoFDShare is wrapped by FDShareSupport's error when the device cannot
// export memory as a POSIX file descriptor.
var ErrNoFDShare = errors.New("cuda: device cannot share memory by POSIX file descriptor")

// FDShareSupport reports whether memory of dev can be made with cuMemCreate
// and shared as a POSIX file descriptor: nil when it can; otherwise an
// error that says why (an entry point missing from the driver wraps
// ErrNotAvailable, a device attribute that says no wraps ErrNoFDShare).
func (d *Driver) FDShareSupport(dev Device) error {
	for _, i := range []C.int{C.PXN_cuMemGetAllocationGranularity, C.PXN_cuMemCreate, C.PXN_cuMemRelease,
		C.PXN_cuMemAddressReserve, C.PXN_cuMemAddressFree, C.PXN_cuMemMap, C.PXN_cuMemUnmap, C.PXN_cuMemSetAccess,
		C.PXN_cuMemExportToShareableHandle, C.PXN_cuMemImportFromShareableHandle, C.PXN_cuMemGetAllocationPropertiesFromHandle} {
		if !d.has(i) {
			return fmt.Errorf("cuda: %s: %w", C.GoString(C.pxn_cu_symbol_name(i)), ErrNotAvailable)
		}
	}
	for _, a := range []struct {
		attr DeviceAttribute
		name string
	}{
		{AttrVirtualMemoryManagementSupported, "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"},
		{AttrHandleTypePosixFDSupported, "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED"},
	} {
		v, err := d.DeviceAttribute(a.attr, dev)
		if err != nil {
			return err
		}
		if v == 0 {
			return fmt.Errorf("%w: device %d has %s = 0", ErrNoFDShare, int(dev), a.name)
		}
	}
	return nil
}

// MemGetAllocationGranularity is cuMemGetAllocationGranularity of prop:
// the minimum granularity, or the recommended one when recommended is set.
func (d *Driver) MemGetAllocationGranularity(prop AllocationProp, recommended bool) (uint64, error) {
	cp := prop.c()
	opt := C.int(memAllocGranularityMinimum)
	if recommended {
		opt = memAllocGranularityRecommended
	}
	var g C.size_t
	if err := d.check(C.pxn_cuMemGetAllocationGranularity(d.t, &g, &cp, opt), "cuMemGetAllocationGranularity(device %d, recommended %v)", int(prop.Device), recommended); err != nil {
		return 0, err
	}
	return uint64(g), nil
}

// MemCreate is cuMemCreate of size bytes (a multiple of the granularity)
// with prop.
func (d *Driver) MemCreate(size uint64, prop AllocationProp) (MemHandle, error) {
	cp := prop.c()
	var h C.CUmemGenericAllocationHandle
	if err := d.check(C.pxn_cuMemCreate(d.t, &h, C.size_t(size), &cp), "cuMemCreate(%d, device %d, POSIX fd, RDMA %v)", size, int(prop.Device), prop.GPUDirectRDMA); err != nil {
		return 0, err
	}
	return MemHandle(h), nil
}

// MemRelease is cuMemRelease. The memory stays while a mapping of it
// remains.
func (d *Driver) MemRelease(h MemHandle) error {
	return d.check(C.pxn_cuMemRelease(d.t, C.CUmemGenericAllocationHandle(h)), "cuMemRelease(%#x)", uint64(h))
}

// MemAddressReserve is cuMemAddressReserve of size bytes of virtual
// address space, aligned to align (0: the granularity), anywhere.
func (d *Driver) MemAddressReserve(size, align uint64) (DevicePtr, error) {
	var p C.CUdeviceptr
	if err := d.check(C.pxn_cuMemAddressReserve(d.t, &p, C.size_t(size), C.size_t(align)), "cuMemAddressReserve(%d, align %d)", size, align); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// MemAddressFree is cuMemAddressFree of a whole reservation.
func (d *Driver) MemAddressFree(p DevicePtr, size uint64) error {
	return d.check(C.pxn_cuMemAddressFree(d.t, C.CUdeviceptr(p), C.size_t(size)), "cuMemAddressFree(%#x, %d)", uint64(p), size)
}

// MemMap is cuMemMap of size bytes of h, from offset, at p.
func (d *Driver) MemMap(p DevicePtr, size, offset uint64, h MemHandle) error {
	return d.check(C.pxn_cuMemMap(d.t, C.CUdeviceptr(p), C.size_t(size), C.size_t(offset), C.CUmemGenericAllocationHandle(h)), "cuMemMap(%#x, %d, offset %d, %#x)", uint64(p), size, offset, uint64(h))
}

// MemUnmap is cuMemUnmap.
func (d *Driver) MemUnmap(p DevicePtr, size uint64) error {
	return d.check(C.pxn_cuMemUnmap(d.t, C.CUdeviceptr(p), C.size_t(size)), "cuMemUnmap(%#x, %d)", uint64(p), size)
}

// MemSetAccess is cuMemSetAccess: [p, p+size) readable and writable from
// each of devs.
func (d *Driver) MemSetAccess(p DevicePtr, size uint64, devs ...Device) error {
	if len(devs) == 0 || len(devs) > 64 {
		return fmt.Errorf("cuda: cuMemSetAccess(%#x, %d): %d devices, want 1..64", uint64(p), size, len(devs))
	}
	var desc [64]C.CUmemAccessDesc
	for i, dev := range devs {
		desc[i].location._type = memLocationTypeDevice
		desc[i].location.id = C.int(dev)
		desc[i].flags = memAccessProtReadWrite
	}
	return d.check(C.pxn_cuMemSetAccess(d.t, C.CUdeviceptr(p), C.size_t(size), &desc[0], C.size_t(len(devs))), "cuMemSetAccess(%#x, %d, devices %v, read-write)", uint64(p), size, devs)
}

// MemExportFD is cuMemExportToShareableHandle of h as a POSIX file
// descriptor, which the caller owns.
func (d *Driver) MemExportFD(h MemHandle) (int, error) {
	fd := C.int(-1)
	if err := d.check(C.pxn_cuMemExportToShareableHandleFD(d.t, &fd, C.CUmemGenericAllocationHandle(h)), "cuMemExportToShareableHandle(%#x, POSIX fd)", uint64(h)); err != nil {
		return -1, err
	}
	return int(fd), nil
}

// MemImportFD is cuMemImportFromShareableHandle of a POSIX file descriptor.
// The caller keeps fd (the driver does not take it) and releases the handle
// with MemRelease.
func (d *Driver) MemImportFD(fd int) (MemHandle, error) {
	var h C.CUmemGenericAllocationHandle
	if err := d.check(C.pxn_cuMemImportFromShareableHandleFD(d.t, &h, C.int(fd)), "cuMemImportFromShareableHandle(fd %d, POSIX fd)", fd); err != nil {
		return 0, err
	}
	return MemHandle(h), nil
}

// MemAllocationProp is cuMemGetAllocationPropertiesFromHandle: the device
// that holds h's memory and whether it may be registered with an RDMA NIC.
func (d *Driver) MemAllocationProp(h MemHandle) (AllocationProp, error) {
	var cp C.CUmemAllocationProp
	if err := d.check(C.pxn_cuMemGetAllocationPropertiesFromHandle(d.t, &cp, C.CUmemGenericAllocationHandle(h)), "cuMemGetAllocationPropertiesFromHandle(%#x)", uint64(h)); err != nil {
		return AllocationProp{}, err
	}
	if cp.location._type != memLocationTypeDevice {
		return AllocationProp{}, fmt.Errorf("cuda: allocation %#x lives in location type %d, not on a device", uint64(h), int(cp.location._type))
	}
	return AllocationProp{Device: Device(cp.location.id), GPUDirectRDMA: cp.allocFlags.gpuDirectRDMACapable != 0}, nil
}

// AlignUp rounds n up to a multiple of g (g > 0); it fails where the result
// would not fit in 64 bits.
func AlignUp(n, g uint64) (uint64, error) {
	if g == 0 {
		return 0, errors.New("cuda: granularity 0")
	}
	r := n % g
	if r == 0 {
		return n, nil
	}
	if n > ^uint64(0)-(g-r) {
		return 0, fmt.Errorf("cuda: %d rounded up to a multiple of %d overflows", n, g)
	}
	return n + g - r, nil
}
