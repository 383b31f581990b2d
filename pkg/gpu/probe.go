// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/cuda"
)

// DoorbellMode chooses how a Piece's doorbell is rung.
type DoorbellMode int

const (
	// DoorbellAuto probes cuStreamWriteValue64 at start and uses it when a
	// test write lands, the CPU path otherwise.
	DoorbellAuto DoorbellMode = iota
	// DoorbellGPU requires the GPU path: cuStreamWriteValue64 on the lane
	// stream, after the copies, into the host-mapped ready word.
	DoorbellGPU
	// DoorbellCPU records an event after the copies; Poll stores the seq
	// once the event has completed.
	DoorbellCPU
)

// CopyPolicy chooses how a Piece's entries are submitted.
type CopyPolicy int

const (
	// CopyAuto uses the driver's batch copy (the 13.0 form on 13.x drivers,
	// the 12.8 form on 12.8–12.x) when a start-up copy through it works, and
	// one cuMemcpyAsync per entry otherwise.
	CopyAuto CopyPolicy = iota
	// CopyPerEntry forces one cuMemcpyAsync per entry.
	CopyPerEntry
	// CopyBatch13 forces the 8-argument cuMemcpyBatchAsync of CUDA 13.0.
	CopyBatch13
	// CopyBatch12 forces the 9-argument cuMemcpyBatchAsync of CUDA 12.8.
	CopyBatch12
)

func (c *Copier) chooseCopy(p CopyPolicy) error {
	d := c.g.d
	switch p {
	case CopyPerEntry:
		c.mode = cuda.CopyPerEntry
		return nil
	case CopyBatch13, CopyBatch12:
		c.mode = cuda.CopyBatchV13000
		if p == CopyBatch12 {
			c.mode = cuda.CopyBatchV12080
		}
		if !d.Supports(c.mode) {
			return fmt.Errorf("driver %d lacks %v", d.Version(), c.mode)
		}
		return c.probeCopy()
	}
	c.mode = d.BestCopyMode()
	if c.mode == cuda.CopyPerEntry {
		return nil
	}
	if err := c.probeCopy(); err != nil {
		c.log.Info("pxn gpu copier: batch copy failed its start-up check; copying per entry", "mode", c.mode.String(), "err", err)
		c.mode = cuda.CopyPerEntry
	}
	return nil
}

// probeCopy runs one two-entry Piece through the chosen form and checks the
// bytes. Start-up only: it synchronizes.
func (c *Copier) probeCopy() error {
	d := c.g.d
	const n = 4096
	buf, err := d.MemAlloc(n)
	if err != nil {
		return err
	}
	defer d.MemFree(buf)
	st := &c.lanes[0].streams[0]
	if err := d.MemsetD32Async(buf, 0x5a5a5a5a, n/8, st.s); err != nil {
		return err
	}
	if err := d.MemsetD32Async(buf+n/2, 0, n/8, st.s); err != nil {
		return err
	}
	ents := []cuda.CopyEntry{
		{Src: uint64(buf), Dst: uint64(buf) + n/2, Len: n / 4},
		{Src: uint64(buf) + n/4, Dst: uint64(buf) + n/2 + n/4, Len: n / 4},
	}
	if err := st.op.Enqueue(&cuda.Piece{Stream: st.s, Mode: c.mode, Entries: ents}); err != nil {
		return err
	}
	if err := d.StreamSynchronize(st.s); err != nil {
		return err
	}
	got := make([]byte, n/2)
	if err := d.MemcpyDtoH(got, buf+n/2); err != nil {
		return err
	}
	for i, b := range got {
		if b != 0x5a {
			return fmt.Errorf("%v: byte %d is %#x after the check copy", c.mode, i, b)
		}
	}
	return nil
}

func (c *Copier) chooseDoorbell(m DoorbellMode) error {
	d := c.g.d
	c.memOpsV1, _ = d.DeviceAttribute(cuda.AttrCanUseStreamMemOpsV1, c.g.dev)
	if m == DoorbellCPU {
		c.bellWhy = "forced by option"
		return nil
	}
	err := c.probeDoorbell()
	if err == nil {
		c.gpuBell = true
		c.bellWhy = "a probe write landed"
		return nil
	}
	if m == DoorbellGPU {
		return fmt.Errorf("GPU doorbell required: %w", err)
	}
	c.bellWhy = err.Error()
	return nil
}

// probeDoorbell writes a word into registered host memory with
// cuStreamWriteValue64 and checks that it lands. The attribute
// CAN_USE_STREAM_MEM_OPS_V1 is not asked: it reads 0 on H200 while the v2
// call works.
func (c *Copier) probeDoorbell() error {
	d := c.g.d
	if !d.HasStreamWriteValue64() {
		return fmt.Errorf("cuStreamWriteValue64: %w", cuda.ErrNotAvailable)
	}
	page := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap a probe page: %w", err)
	}
	defer unix.Munmap(mem)
	base := uintptr(unsafe.Pointer(&mem[0]))
	if err := d.MemHostRegister(base, uint64(page), cuda.HostRegisterDeviceMap|cuda.HostRegisterPortable); err != nil {
		return err
	}
	defer d.MemHostUnregister(base)
	dp, err := d.MemHostGetDevicePointer(base)
	if err != nil {
		return err
	}
	const magic = 0x5058_4e5f_6265_6c6c
	st := &c.lanes[0].streams[0]
	if err := d.StreamWriteValue64(st.s, dp+64, magic, cuda.StreamWriteValueDefault); err != nil {
		return err
	}
	if err := d.StreamSynchronize(st.s); err != nil {
		return err
	}
	if got := atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[64]))); got != magic {
		return fmt.Errorf("cuStreamWriteValue64 probe: host word is %#x, want %#x", got, uint64(magic))
	}
	return nil
}
