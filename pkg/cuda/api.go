// SPDX-License-Identifier: Apache-2.0

package cuda

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Flags and enumerations of the driver API that this module uses.
const (
	// StreamNonBlocking is CU_STREAM_NON_BLOCKING: no implicit ordering
	// with the legacy default stream.
	StreamNonBlocking = 0x1
	// EventDisableTiming is CU_EVENT_DISABLE_TIMING.
	EventDisableTiming = 0x2
	// HostRegisterPortable is CU_MEMHOSTREGISTER_PORTABLE.
	HostRegisterPortable = 0x1
	// HostRegisterDeviceMap is CU_MEMHOSTREGISTER_DEVICEMAP.
	HostRegisterDeviceMap = 0x2
	// IPCLazyEnablePeerAccess is CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
	IPCLazyEnablePeerAccess = 0x1
	// StreamWriteValueDefault orders the write after every earlier write
	// of the stream (a system-scope fence); StreamWriteValueNoMemoryBarrier
	// does not.
	StreamWriteValueDefault         = 0x0
	StreamWriteValueNoMemoryBarrier = 0x1
)

// DeviceAttribute is a CUdevice_attribute.
type DeviceAttribute int

// Device attributes this module reads.
const (
	AttrMultiprocessorCount              DeviceAttribute = 16
	AttrPCIBusID                         DeviceAttribute = 33
	AttrUnifiedAddressing                DeviceAttribute = 41
	AttrComputeCapabilityMajor           DeviceAttribute = 75
	AttrComputeCapabilityMinor           DeviceAttribute = 76
	AttrCanUseHostPointerForRegistered   DeviceAttribute = 91
	AttrCanUseStreamMemOpsV1             DeviceAttribute = 92
	AttrCanUse64BitStreamMemOpsV1        DeviceAttribute = 93
	AttrHostRegisterSupported            DeviceAttribute = 99
	AttrVirtualMemoryManagementSupported DeviceAttribute = 102
)

// MemoryType is a CUmemorytype.
type MemoryType int

// Memory types of CU_POINTER_ATTRIBUTE_MEMORY_TYPE.
const (
	MemoryHost    MemoryType = 1
	MemoryDevice  MemoryType = 2
	MemoryArray   MemoryType = 3
	MemoryUnified MemoryType = 4
)

const pointerAttributeMemoryType = 2

// pointerAttributeDeviceOrdinal is CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL.
const pointerAttributeDeviceOrdinal = 9

// DeviceCount is cuDeviceGetCount.
func (d *Driver) DeviceCount() (int, error) {
	var n C.int
	if err := d.check(C.pxn_cuDeviceGetCount(d.t, &n), "cuDeviceGetCount"); err != nil {
		return 0, err
	}
	return int(n), nil
}

// DeviceGet is cuDeviceGet.
func (d *Driver) DeviceGet(ordinal int) (Device, error) {
	var dev C.CUdevice
	if err := d.check(C.pxn_cuDeviceGet(d.t, &dev, C.int(ordinal)), "cuDeviceGet(%d)", ordinal); err != nil {
		return 0, err
	}
	return Device(dev), nil
}

// DeviceAttribute is cuDeviceGetAttribute.
func (d *Driver) DeviceAttribute(attr DeviceAttribute, dev Device) (int, error) {
	var v C.int
	if err := d.check(C.pxn_cuDeviceGetAttribute(d.t, &v, C.int(attr), C.CUdevice(dev)), "cuDeviceGetAttribute(%d, device %d)", int(attr), int(dev)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// DeviceName is cuDeviceGetName.
func (d *Driver) DeviceName(dev Device) (string, error) {
	var buf [256]C.char
	if err := d.check(C.pxn_cuDeviceGetName(d.t, &buf[0], C.int(len(buf)), C.CUdevice(dev)), "cuDeviceGetName(device %d)", int(dev)); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// DevicePCIBusID is cuDeviceGetPCIBusId ("0000:18:00.0").
func (d *Driver) DevicePCIBusID(dev Device) (string, error) {
	var buf [64]C.char
	if err := d.check(C.pxn_cuDeviceGetPCIBusId(d.t, &buf[0], C.int(len(buf)), C.CUdevice(dev)), "cuDeviceGetPCIBusId(device %d)", int(dev)); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// DeviceCanAccessPeer is cuDeviceCanAccessPeer.
func (d *Driver) DeviceCanAccessPeer(dev, peer Device) (bool, error) {
	var can C.int
	if err := d.check(C.pxn_cuDeviceCanAccessPeer(d.t, &can, C.CUdevice(dev), C.CUdevice(peer)), "cuDeviceCanAccessPeer(%d, %d)", int(dev), int(peer)); err != nil {
		return false, err
	}
	return can != 0, nil
}

// PrimaryCtxRetain is cuDevicePrimaryCtxRetain.
func (d *Driver) PrimaryCtxRetain(dev Device) (Context, error) {
	var c C.pxn_handle
	if err := d.check(C.pxn_cuDevicePrimaryCtxRetain(d.t, &c, C.CUdevice(dev)), "cuDevicePrimaryCtxRetain(device %d)", int(dev)); err != nil {
		return 0, err
	}
	return Context(c), nil
}

// PrimaryCtxRelease is cuDevicePrimaryCtxRelease.
func (d *Driver) PrimaryCtxRelease(dev Device) error {
	return d.check(C.pxn_cuDevicePrimaryCtxRelease(d.t, C.CUdevice(dev)), "cuDevicePrimaryCtxRelease(device %d)", int(dev))
}

// CtxSetCurrent is cuCtxSetCurrent: it binds ctx to the calling OS thread,
// so the caller must hold that thread (runtime.LockOSThread) for the
// binding to mean anything.
func (d *Driver) CtxSetCurrent(ctx Context) error {
	return d.check(C.pxn_cuCtxSetCurrent(d.t, C.pxn_handle(ctx)), "cuCtxSetCurrent(%#x)", uintptr(ctx))
}

// CtxGetCurrent is cuCtxGetCurrent.
func (d *Driver) CtxGetCurrent() (Context, error) {
	var c C.pxn_handle
	if err := d.check(C.pxn_cuCtxGetCurrent(d.t, &c), "cuCtxGetCurrent"); err != nil {
		return 0, err
	}
	return Context(c), nil
}

// CtxGetDevice is cuCtxGetDevice: the device of the calling thread's
// current context.
func (d *Driver) CtxGetDevice() (Device, error) {
	var dev C.CUdevice
	if err := d.check(C.pxn_cuCtxGetDevice(d.t, &dev), "cuCtxGetDevice"); err != nil {
		return 0, err
	}
	return Device(dev), nil
}

// CtxEnablePeerAccess is cuCtxEnablePeerAccess from the current context to
// peer. Access already enabled is not an error.
func (d *Driver) CtxEnablePeerAccess(peer Context) error {
	r := C.pxn_cuCtxEnablePeerAccess(d.t, C.pxn_handle(peer), 0)
	if Result(r) == ErrorPeerAccessAlreadyOn {
		return nil
	}
	return d.check(r, "cuCtxEnablePeerAccess(%#x)", uintptr(peer))
}

// MemAlloc is cuMemAlloc (current context).
func (d *Driver) MemAlloc(n uint64) (DevicePtr, error) {
	var p C.CUdeviceptr
	if err := d.check(C.pxn_cuMemAlloc(d.t, &p, C.size_t(n)), "cuMemAlloc(%d)", n); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// MemFree is cuMemFree.
func (d *Driver) MemFree(p DevicePtr) error {
	return d.check(C.pxn_cuMemFree(d.t, C.CUdeviceptr(p)), "cuMemFree(%#x)", uint64(p))
}

// MemHostRegister is cuMemHostRegister of [p, p+n) with flags
// (HostRegisterDeviceMap|HostRegisterPortable for a doorbell mapping). The
// memory must stay mapped until MemHostUnregister.
func (d *Driver) MemHostRegister(p uintptr, n uint64, flags uint) error {
	return d.check(C.pxn_cuMemHostRegister(d.t, C.uintptr_t(p), C.size_t(n), C.uint(flags)), "cuMemHostRegister(%#x, %d, %#x)", p, n, flags)
}

// MemHostUnregister is cuMemHostUnregister.
func (d *Driver) MemHostUnregister(p uintptr) error {
	return d.check(C.pxn_cuMemHostUnregister(d.t, C.uintptr_t(p)), "cuMemHostUnregister(%#x)", p)
}

// MemHostGetDevicePointer is cuMemHostGetDevicePointer of registered host
// memory.
func (d *Driver) MemHostGetDevicePointer(p uintptr) (DevicePtr, error) {
	var dp C.CUdeviceptr
	if err := d.check(C.pxn_cuMemHostGetDevicePointer(d.t, &dp, C.uintptr_t(p), 0), "cuMemHostGetDevicePointer(%#x)", p); err != nil {
		return 0, err
	}
	return DevicePtr(dp), nil
}

// MemGetInfo is cuMemGetInfo: the current context's device's free and
// total memory in bytes.
func (d *Driver) MemGetInfo() (free, total uint64, err error) {
	var f, t C.size_t
	if err := d.check(C.pxn_cuMemGetInfo(d.t, &f, &t), "cuMemGetInfo"); err != nil {
		return 0, 0, err
	}
	return uint64(f), uint64(t), nil
}

// MemcpyHtoDAsync is cuMemcpyHtoDAsync from host memory given as an
// address, which must stay valid (and, to be asynchronous, pinned) until
// the copy has run.
func (d *Driver) MemcpyHtoDAsync(dst DevicePtr, src uintptr, n uint64, s Stream) error {
	return d.check(C.pxn_cuMemcpyHtoDAsync(d.t, C.CUdeviceptr(dst), C.uintptr_t(src), C.size_t(n), C.pxn_handle(s)), "cuMemcpyHtoDAsync(%#x, %#x, %d)", uint64(dst), src, n)
}

// MemcpyHtoD is the synchronous cuMemcpyHtoD (set-up only: never on a data
// path).
func (d *Driver) MemcpyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return d.check(C.pxn_cuMemcpyHtoD(d.t, C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))), "cuMemcpyHtoD(%#x, %d)", uint64(dst), len(src))
}

// MemcpyDtoH is the synchronous cuMemcpyDtoH (set-up and start-up probes
// only: never on a data path).
func (d *Driver) MemcpyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return d.check(C.pxn_cuMemcpyDtoH(d.t, unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst))), "cuMemcpyDtoH(%#x, %d)", uint64(src), len(dst))
}

// MemsetD32Async is cuMemsetD32Async of n 32-bit words.
func (d *Driver) MemsetD32Async(dst DevicePtr, v uint32, n uint64, s Stream) error {
	return d.check(C.pxn_cuMemsetD32Async(d.t, C.CUdeviceptr(dst), C.uint(v), C.size_t(n), C.pxn_handle(s)), "cuMemsetD32Async(%#x, %#x, %d)", uint64(dst), v, n)
}

// MemcpyAsync is cuMemcpyAsync (unified addressing: any pair of pointers).
func (d *Driver) MemcpyAsync(dst, src DevicePtr, n uint64, s Stream) error {
	return d.check(C.pxn_cuMemcpyAsync(d.t, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), C.pxn_handle(s)), "cuMemcpyAsync(%#x, %#x, %d)", uint64(dst), uint64(src), n)
}

// MemcpyDtoDAsync is cuMemcpyDtoDAsync.
func (d *Driver) MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error {
	return d.check(C.pxn_cuMemcpyDtoDAsync(d.t, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), C.pxn_handle(s)), "cuMemcpyDtoDAsync(%#x, %#x, %d)", uint64(dst), uint64(src), n)
}

// MemcpyPeerAsync is cuMemcpyPeerAsync.
func (d *Driver) MemcpyPeerAsync(dst DevicePtr, dstCtx Context, src DevicePtr, srcCtx Context, n uint64, s Stream) error {
	return d.check(C.pxn_cuMemcpyPeerAsync(d.t, C.CUdeviceptr(dst), C.pxn_handle(dstCtx), C.CUdeviceptr(src), C.pxn_handle(srcCtx), C.size_t(n), C.pxn_handle(s)), "cuMemcpyPeerAsync(%#x, %#x, %d)", uint64(dst), uint64(src), n)
}

// StreamCreate is cuStreamCreate (current context).
func (d *Driver) StreamCreate(flags uint) (Stream, error) {
	var s C.pxn_handle
	if err := d.check(C.pxn_cuStreamCreate(d.t, &s, C.uint(flags)), "cuStreamCreate(%#x)", flags); err != nil {
		return 0, err
	}
	return Stream(s), nil
}

// StreamDestroy is cuStreamDestroy.
func (d *Driver) StreamDestroy(s Stream) error {
	return d.check(C.pxn_cuStreamDestroy(d.t, C.pxn_handle(s)), "cuStreamDestroy(%#x)", uintptr(s))
}

// StreamWaitEvent is cuStreamWaitEvent.
func (d *Driver) StreamWaitEvent(s Stream, e Event) error {
	return d.check(C.pxn_cuStreamWaitEvent(d.t, C.pxn_handle(s), C.pxn_handle(e), 0), "cuStreamWaitEvent(%#x, %#x)", uintptr(s), uintptr(e))
}

// StreamSynchronize is cuStreamSynchronize (set-up, start-up probes and
// teardown only: never on a data path).
func (d *Driver) StreamSynchronize(s Stream) error {
	return d.check(C.pxn_cuStreamSynchronize(d.t, C.pxn_handle(s)), "cuStreamSynchronize(%#x)", uintptr(s))
}

// StreamWriteValue64 is cuStreamWriteValue64 (the _v2 ABI).
func (d *Driver) StreamWriteValue64(s Stream, addr DevicePtr, v uint64, flags uint) error {
	return d.check(C.pxn_cuStreamWriteValue64(d.t, C.pxn_handle(s), C.CUdeviceptr(addr), C.uint64_t(v), C.uint(flags)), "cuStreamWriteValue64(%#x, %#x, %d)", uintptr(s), uint64(addr), v)
}

// EventCreate is cuEventCreate (current context).
func (d *Driver) EventCreate(flags uint) (Event, error) {
	var e C.pxn_handle
	if err := d.check(C.pxn_cuEventCreate(d.t, &e, C.uint(flags)), "cuEventCreate(%#x)", flags); err != nil {
		return 0, err
	}
	return Event(e), nil
}

// EventRecord is cuEventRecord.
func (d *Driver) EventRecord(e Event, s Stream) error {
	return d.check(C.pxn_cuEventRecord(d.t, C.pxn_handle(e), C.pxn_handle(s)), "cuEventRecord(%#x, %#x)", uintptr(e), uintptr(s))
}

// EventQuery is cuEventQuery: true once the event completed, false while
// it is pending (CUDA_ERROR_NOT_READY).
func (d *Driver) EventQuery(e Event) (bool, error) {
	return d.queried(Result(C.pxn_cuEventQuery(d.t, C.pxn_handle(e))), e)
}

// queried is cuEventQuery's answer r for e: true once it completed, false
// while pending, an error otherwise.
func (d *Driver) queried(r Result, e Event) (bool, error) {
	switch r {
	case Success:
		return true, nil
	case ErrorNotReady:
		return false, nil
	}
	return false, d.errorf(r, "cuEventQuery(%#x)", uintptr(e))
}

// EventDestroy is cuEventDestroy.
func (d *Driver) EventDestroy(e Event) error {
	return d.check(C.pxn_cuEventDestroy(d.t, C.pxn_handle(e)), "cuEventDestroy(%#x)", uintptr(e))
}

// IPCGetMemHandle is cuIpcGetMemHandle of an allocation's base.
func (d *Driver) IPCGetMemHandle(p DevicePtr) (IPCMemHandle, error) {
	var h C.CUipcMemHandle
	var out IPCMemHandle
	if err := d.check(C.pxn_cuIpcGetMemHandle(d.t, &h, C.CUdeviceptr(p)), "cuIpcGetMemHandle(%#x)", uint64(p)); err != nil {
		return out, err
	}
	copy(out[:], C.GoBytes(unsafe.Pointer(&h), C.int(len(out))))
	return out, nil
}

// IPCOpenMemHandle is cuIpcOpenMemHandle (current context). A handle made
// by this same process cannot be opened.
func (d *Driver) IPCOpenMemHandle(h IPCMemHandle, flags uint) (DevicePtr, error) {
	var ch C.CUipcMemHandle
	C.memcpy(unsafe.Pointer(&ch), unsafe.Pointer(&h[0]), C.size_t(len(h)))
	var p C.CUdeviceptr
	if err := d.check(C.pxn_cuIpcOpenMemHandle(d.t, &p, &ch, C.uint(flags)), "cuIpcOpenMemHandle(%x…, %#x)", h[:8], flags); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// IPCCloseMemHandle is cuIpcCloseMemHandle.
func (d *Driver) IPCCloseMemHandle(p DevicePtr) error {
	return d.check(C.pxn_cuIpcCloseMemHandle(d.t, C.CUdeviceptr(p)), "cuIpcCloseMemHandle(%#x)", uint64(p))
}

// PointerMemoryType is cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE).
// Host memory the driver does not know fails with CUDA_ERROR_INVALID_VALUE.
func (d *Driver) PointerMemoryType(p DevicePtr) (MemoryType, error) {
	var v C.uint
	if err := d.check(C.pxn_cuPointerGetAttribute(d.t, unsafe.Pointer(&v), pointerAttributeMemoryType, C.CUdeviceptr(p)), "cuPointerGetAttribute(MEMORY_TYPE, %#x)", uint64(p)); err != nil {
		return 0, err
	}
	return MemoryType(v), nil
}

// PointerDeviceOrdinal is
// cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL): the device
// that holds the allocation of p.
func (d *Driver) PointerDeviceOrdinal(p DevicePtr) (int, error) {
	var v C.int
	if err := d.check(C.pxn_cuPointerGetAttribute(d.t, unsafe.Pointer(&v), pointerAttributeDeviceOrdinal, C.CUdeviceptr(p)), "cuPointerGetAttribute(DEVICE_ORDINAL, %#x)", uint64(p)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Classify reports whether [p, p+n) lies in one device allocation, with ctx
// current for the call (0: whatever is current). Host memory, registered or
// not, and ranges that leave their allocation are not device memory.
func (d *Driver) Classify(ctx Context, p DevicePtr, n uint64) MemoryType {
	if C.pxn_classify(d.t, C.pxn_handle(ctx), C.CUdeviceptr(p), C.uint64_t(n)) == 2 {
		return MemoryDevice
	}
	return MemoryHost
}

// ClassifyRange is Classify and, for MemoryDevice, the allocation
// [start, start+size) holding p..p+n.
func (d *Driver) ClassifyRange(ctx Context, p DevicePtr, n uint64) (MemoryType, DevicePtr, uint64) {
	if c := C.pxn_classify_range(d.t, C.pxn_handle(ctx), C.CUdeviceptr(p), C.uint64_t(n)); c.kind == 2 {
		return MemoryDevice, DevicePtr(c.start), uint64(c.size)
	}
	return MemoryHost, 0, 0
}

// ModuleLoadData is cuModuleLoadData of a PTX text or a cubin/fatbin image
// (current context).
func (d *Driver) ModuleLoadData(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, fmt.Errorf("cuda: cuModuleLoadData: empty image")
	}
	// PTX must be NUL-terminated; C memory also keeps the driver from
	// holding a Go pointer.
	buf := C.malloc(C.size_t(len(image) + 1))
	defer C.free(buf)
	C.memcpy(buf, unsafe.Pointer(&image[0]), C.size_t(len(image)))
	*(*byte)(unsafe.Add(buf, len(image))) = 0
	var m C.pxn_handle
	if err := d.check(C.pxn_cuModuleLoadData(d.t, &m, buf), "cuModuleLoadData(%d bytes)", len(image)); err != nil {
		return 0, err
	}
	return Module(m), nil
}

// ModuleGetFunction is cuModuleGetFunction.
func (d *Driver) ModuleGetFunction(m Module, name string) (Function, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.pxn_handle
	if err := d.check(C.pxn_cuModuleGetFunction(d.t, &f, C.pxn_handle(m), cname), "cuModuleGetFunction(%q)", name); err != nil {
		return 0, err
	}
	return Function(f), nil
}

// ModuleUnload is cuModuleUnload.
func (d *Driver) ModuleUnload(m Module) error {
	return d.check(C.pxn_cuModuleUnload(d.t, C.pxn_handle(m)), "cuModuleUnload(%#x)", uintptr(m))
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// MaxKernelArgs is the most arguments LaunchKernel passes.
const MaxKernelArgs = 32

// LaunchKernel is cuLaunchKernel. Each argument occupies one 64-bit slot
// and is passed by address; a narrower parameter reads the slot's low bytes
// (the machine is little-endian), so a u32 parameter takes uint64(v).
func (d *Driver) LaunchKernel(f Function, grid, block Dim3, sharedMem uint32, s Stream, args ...uint64) error {
	if len(args) > MaxKernelArgs {
		return fmt.Errorf("cuda: cuLaunchKernel: %d arguments, at most %d", len(args), MaxKernelArgs)
	}
	var argv *C.uint64_t
	if len(args) > 0 {
		argv = (*C.uint64_t)(unsafe.Pointer(&args[0]))
	}
	return d.check(C.pxn_cuLaunchKernel(d.t, C.pxn_handle(f), C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z),
		C.uint(block.X), C.uint(block.Y), C.uint(block.Z), C.uint(sharedMem), C.pxn_handle(s), argv, C.int(len(args))),
		"cuLaunchKernel(grid %v, block %v, %d args)", grid, block, len(args))
}
