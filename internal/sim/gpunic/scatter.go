// SPDX-License-Identifier: Apache-2.0

package gpunic

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/gpu/kernel"
)

// scatterBlocks is the scatter kernel's grid: half of the first hop's
// per-lane cap, as one of its two streams launches. A Piece of 4096 2 KiB
// writes keeps 0.98 of R = 50 GB/s with it; 16 blocks did not move 2 KiB
// writes faster (docs/benchmarks.md).
const scatterBlocks = gpu.GatherMaxBlocks / 2

// planSlot is one batch's gather plan: pinned host staging, its device
// copy, and the events the copy op uses to order and guard the upload,
// uploaded once a batch. A batch slot is reused only after its completion
// event, which follows its kernel, so the plan is never rewritten under a
// pending upload.
type planSlot struct {
	host uintptr
	dev  cuda.DevicePtr
	up   cuda.Event
	busy cuda.Event
}

// scatter is the NIC's SM path: the pkg/gpu gather kernel, whose plan
// entries {src, dst, len} may point anywhere in the unified address space,
// so it scatters a batch of writes as well as it gathers a Piece.
type scatter struct {
	mode   gpu.GatherMode
	mod    cuda.Module
	fn     cuda.Function
	grid   uint32
	upload cuda.Stream
	host   []byte
	dev    cuda.DevicePtr
	why    string
}

func planStride() uint64 { return (cuda.PlanBytes(batchOps) + 255) &^ 255 }

// setup loads the kernel and the batches' plans, in g's context. A
// failure is an error only for gpu.GatherSM; gpu.GatherAuto then uses
// the copy engines.
func (s *scatter) setup(g *gpu.GPU, opts Options, plans []planSlot) error {
	mode := opts.Copy
	s.mode = mode
	if mode == gpu.GatherCE {
		s.why = "copy engines forced"
		return nil
	}
	err := s.load(g, opts, plans)
	if err == nil {
		s.why = "kernel loaded"
		return nil
	}
	err = errors.Join(err, s.free(g.Driver(), plans))
	if mode == gpu.GatherSM {
		return fmt.Errorf("gpunic: scatter kernel required: %w", err)
	}
	s.why = "scatter kernel unavailable: " + err.Error()
	return nil
}

func (s *scatter) load(g *gpu.GPU, opts Options, plans []planSlot) error {
	d := g.Driver()
	ptx := opts.GatherPTX
	if ptx == nil {
		ptx = kernel.GatherPTX()
	}
	var err error
	if s.mod, err = d.ModuleLoadData(ptx); err != nil {
		return err
	}
	if s.fn, err = d.ModuleGetFunction(s.mod, kernel.GatherEntry); err != nil {
		return err
	}
	sms, err := d.DeviceAttribute(cuda.AttrMultiprocessorCount, g.Device())
	if err != nil {
		return err
	}
	s.grid = uint32(min(scatterBlocks, max(sms, 1)))
	if s.upload, err = d.StreamCreate(cuda.StreamNonBlocking); err != nil {
		return err
	}
	stride := planStride()
	total := stride * uint64(len(plans))
	if s.dev, err = d.MemAlloc(total); err != nil {
		return err
	}
	if s.host, err = unix.Mmap(-1, 0, int(total), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		s.host = nil
		return fmt.Errorf("map %d bytes of plan staging: %w", total, err)
	}
	host := uintptr(unsafe.Pointer(&s.host[0]))
	if err := d.MemHostRegister(host, total, cuda.HostRegisterPortable); err != nil {
		unix.Munmap(s.host)
		s.host = nil
		return err
	}
	for i := range plans {
		p := &plans[i]
		p.host = host + uintptr(uint64(i)*stride)
		p.dev = s.dev + cuda.DevicePtr(uint64(i)*stride)
		if p.up, err = d.EventCreate(cuda.EventDisableTiming); err != nil {
			return err
		}
		if p.busy, err = d.EventCreate(cuda.EventDisableTiming); err != nil {
			return err
		}
	}
	return nil
}

// use reports whether a batch goes to the kernel: the first hop's rule,
// two or more ops shorter on average than gpu.GatherThreshold.
func (s *scatter) use(entries []cuda.BatchEntry) bool {
	if s.fn == 0 {
		return false
	}
	if s.mode == gpu.GatherSM {
		return true
	}
	var total uint64
	for i := range entries {
		total += entries[i].Len
	}
	return len(entries) >= 2 && total < gpu.GatherThreshold*uint64(len(entries))
}

func (s *scatter) launch(p *planSlot) cuda.Gather {
	return cuda.Gather{Kernel: s.fn, Grid: s.grid, Block: gpu.GatherThreads, PlanHost: p.host, PlanDev: p.dev,
		PlanCap: batchOps, Upload: s.upload, PlanUp: p.up, PlanBusy: p.busy}
}

// free releases what setup made; the context is current.
func (s *scatter) free(d *cuda.Driver, plans []planSlot) error {
	var errs []error
	if s.upload != 0 {
		errs = append(errs, d.StreamSynchronize(s.upload), d.StreamDestroy(s.upload))
		s.upload = 0
	}
	for i := range plans {
		p := &plans[i]
		for _, ev := range []cuda.Event{p.up, p.busy} {
			if ev != 0 {
				errs = append(errs, d.EventDestroy(ev))
			}
		}
		*p = planSlot{}
	}
	if s.host != nil {
		errs = append(errs, d.MemHostUnregister(uintptr(unsafe.Pointer(&s.host[0]))), unix.Munmap(s.host))
		s.host = nil
	}
	if s.dev != 0 {
		errs = append(errs, d.MemFree(s.dev))
		s.dev = 0
	}
	if s.mod != 0 {
		errs = append(errs, d.ModuleUnload(s.mod))
		s.mod, s.fn = 0, 0
	}
	return errors.Join(errs...)
}
