// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu/kernel"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// GatherMode chooses who moves a Piece: the copy engines or the SM gather
// kernel.
type GatherMode int

const (
	// GatherAuto uses the SM kernel for a Piece of two or more entries whose
	// mean entry is shorter than the threshold (GatherThreshold unless the
	// options say otherwise), the copy engines otherwise.
	GatherAuto GatherMode = iota
	// GatherCE always uses the copy engines.
	GatherCE
	// GatherSM always uses the SM kernel, single-entry Pieces included.
	GatherSM
)

func (m GatherMode) String() string {
	switch m {
	case GatherAuto:
		return contract.CopyModeAuto
	case GatherCE:
		return contract.CopyModeCE
	case GatherSM:
		return contract.CopyModeSM
	}
	return fmt.Sprintf("gather mode %d", int(m))
}

// ParseGatherMode reads a copy mode (engineconfig.Config.CopyMode, parsed from
// contract.EnvCopyMode), which overrides the copier's choice between copy
// engines and SMs; "" is auto.
func ParseGatherMode(s string) (GatherMode, error) {
	switch strings.TrimSpace(s) {
	case "", contract.CopyModeAuto:
		return GatherAuto, nil
	case contract.CopyModeCE:
		return GatherCE, nil
	case contract.CopyModeSM:
		return GatherSM, nil
	}
	return GatherAuto, fmt.Errorf("%s=%q: want %s, %s or %s", contract.EnvCopyMode, s, contract.CopyModeCE, contract.CopyModeSM, contract.CopyModeAuto)
}

// GatherThreshold is the mean entry length below which GatherAuto moves a
// Piece with the SM kernel. Measured on H200 (docs/benchmarks.md, P2): the
// kernel on 16 SMs beats the 13.0 batch copy through 256 KiB entries and
// loses to it from 512 KiB on.
const GatherThreshold = 512 << 10

// Launch shape of the gather kernel: GatherMaxBlocks blocks in flight per
// lane at most (one per SM: the kernel never takes more than 16 SMs of a
// lane's GPU from the application), of GatherThreads threads. With
// DefaultGatherStreams 2 a lane's two streams each launch
// GatherMaxBlocks/2 blocks, so one Piece's launch overlaps the tail and
// doorbell of the one before it.
const (
	GatherMaxBlocks      = 16
	GatherThreads        = 1024
	DefaultGatherStreams = 2
)

// useGather reports whether a Piece of entries goes to the SM kernel.
func useGather(mode GatherMode, threshold uint64, entries []relay.CopyEntry) bool {
	switch mode {
	case GatherSM:
		return true
	case GatherCE:
		return false
	}
	var live, total uint64
	for i := range entries {
		if entries[i].Len != 0 {
			live++
			total += entries[i].Len
		}
	}
	return live >= 2 && total < threshold*live
}

// planSlot is the gather plan of one ring slot of one lane: pinned host
// staging, its device copy and the event that says both are free again.
// Slots are indexed by the Piece's ring slot, so the engine's credit (seq
// reuses a slot only after seq-K was reaped, which is after its doorbell,
// which follows its kernel) already keeps a staging from being rewritten
// before its upload ran; the event makes a misuse an error instead of
// corrupt data.
type planSlot struct {
	host uintptr
	dev  cuda.DevicePtr
	up   cuda.Event
	busy cuda.Event
	// arrived is the slot's part counters (cuda.Gather.Arrived), zeroed
	// once at setup and set back to zero by the kernel that used them.
	arrived cuda.DevicePtr
}

// gatherState is the loaded kernel and its plan memory.
type gatherState struct {
	mode      GatherMode
	threshold uint64
	mod       cuda.Module
	fn        cuda.Function
	// inline is the kernel that takes a small plan as its parameter, 0
	// when not in use (CopierOptions.NoInlinePlan).
	inline  cuda.Function
	grid    uint32
	block   uint32
	streams int
	why     string

	hostMem []byte
	devMem  cuda.DevicePtr
	slots   [staging.LaneCount][staging.SlotsPerLane]planSlot
	// uploads are the lanes' plan-upload streams.
	uploads [staging.LaneCount]cuda.Stream
}

// arrivedOffset is where a plan slot's part counters start in it.
func arrivedOffset() uint64 { return (cuda.PlanBytes(staging.MaxPlans) + 63) &^ 63 }

// planStride is the bytes reserved per plan slot, 256-byte aligned: the
// plan, then the part counters.
func planStride() uint64 { return (arrivedOffset() + 4*cuda.MaxParts + 255) &^ 255 }

// setupGather loads the kernel and allocates plan memory, in the copier's
// context. A kernel that does not load is an error for GatherSM and turns
// GatherAuto into the copy engines only.
func (c *Copier) setupGather(opts CopierOptions) error {
	gs := &c.gather
	gs.mode = opts.Gather
	gs.threshold = opts.GatherThreshold
	if gs.threshold == 0 {
		gs.threshold = GatherThreshold
	}
	if gs.mode == GatherCE {
		gs.why = "copy engines forced"
		return nil
	}
	if gs.mode == GatherAuto && opts.Copy != CopyAuto {
		gs.mode = GatherCE
		gs.why = "a copy-engine form is forced"
		return nil
	}
	err := c.loadGather(opts)
	if err == nil {
		return nil
	}
	c.freeGather()
	if gs.mode == GatherSM {
		return fmt.Errorf("SM gather required: %w", err)
	}
	gs.mode = GatherCE
	gs.why = "gather kernel unavailable: " + err.Error()
	return nil
}

func (c *Copier) loadGather(opts CopierOptions) error {
	d := c.g.d
	gs := &c.gather
	ptx := opts.GatherPTX
	if ptx == nil {
		ptx = kernel.GatherPTX()
	}
	var err error
	if gs.mod, err = d.ModuleLoadData(ptx); err != nil {
		return err
	}
	if gs.fn, err = d.ModuleGetFunction(gs.mod, kernel.GatherEntry); err != nil {
		return err
	}
	if !opts.NoInlinePlan {
		if gs.inline, err = d.ModuleGetFunction(gs.mod, kernel.GatherInlineEntry); err != nil {
			return err
		}
	}
	sms, err := d.DeviceAttribute(cuda.AttrMultiprocessorCount, c.g.dev)
	if err != nil {
		return err
	}
	gs.streams = opts.GatherStreams
	if gs.streams == 0 {
		gs.streams = DefaultGatherStreams
	}
	if gs.streams != 1 && gs.streams != StreamsPerLane {
		return fmt.Errorf("%d gather streams: want 1 or %d", gs.streams, StreamsPerLane)
	}
	most := GatherMaxBlocks / gs.streams
	blocks := opts.GatherBlocks
	if blocks <= 0 || blocks > most {
		blocks = most
	}
	gs.grid = uint32(min(blocks, max(sms, 1)))
	gs.block = GatherThreads
	if opts.GatherThreads > 0 {
		if opts.GatherThreads%32 != 0 || opts.GatherThreads > 1024 {
			return fmt.Errorf("gather block of %d threads: want a multiple of 32 up to 1024", opts.GatherThreads)
		}
		gs.block = uint32(opts.GatherThreads)
	}
	stride := planStride()
	n := uint64(staging.LaneCount * staging.SlotsPerLane)
	if gs.devMem, err = d.MemAlloc(n * stride); err != nil {
		return err
	}
	if gs.hostMem, err = unix.Mmap(-1, 0, int(n*stride), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		gs.hostMem = nil
		return fmt.Errorf("map %d bytes of plan staging: %w", n*stride, err)
	}
	// Every slot's part counters start at zero.
	if err := d.MemsetD32Async(gs.devMem, 0, n*stride/4, 0); err != nil {
		return err
	}
	host := uintptr(unsafe.Pointer(&gs.hostMem[0]))
	if err := d.MemHostRegister(host, n*stride, cuda.HostRegisterPortable); err != nil {
		unix.Munmap(gs.hostMem)
		gs.hostMem = nil
		return err
	}
	k := uint64(0)
	for l := range gs.slots {
		for s := range gs.slots[l] {
			ps := &gs.slots[l][s]
			ps.host = host + uintptr(k*stride)
			ps.dev = gs.devMem + cuda.DevicePtr(k*stride)
			ps.arrived = ps.dev + cuda.DevicePtr(arrivedOffset())
			if ps.busy, err = d.EventCreate(cuda.EventDisableTiming); err != nil {
				return err
			}
			if ps.up, err = d.EventCreate(cuda.EventDisableTiming); err != nil {
				return err
			}
			k++
		}
		if gs.uploads[l], err = d.StreamCreate(cuda.StreamNonBlocking); err != nil {
			return err
		}
	}
	// The memset ran on the legacy stream: done before any launch.
	if err := d.StreamSynchronize(0); err != nil {
		return err
	}
	gs.why = "kernel loaded"
	return nil
}

// freeGather releases what setupGather made; the context is current.
func (c *Copier) freeGather() error {
	d := c.g.d
	gs := &c.gather
	var errs []error
	for l := range gs.slots {
		for s := range gs.slots[l] {
			for _, ev := range []cuda.Event{gs.slots[l][s].busy, gs.slots[l][s].up} {
				if ev != 0 {
					errs = append(errs, d.EventDestroy(ev))
				}
			}
			gs.slots[l][s] = planSlot{}
		}
		if gs.uploads[l] != 0 {
			errs = append(errs, d.StreamSynchronize(gs.uploads[l]), d.StreamDestroy(gs.uploads[l]))
			gs.uploads[l] = 0
		}
	}
	if gs.hostMem != nil {
		errs = append(errs, d.MemHostUnregister(uintptr(unsafe.Pointer(&gs.hostMem[0]))))
		errs = append(errs, unix.Munmap(gs.hostMem))
		gs.hostMem = nil
	}
	if gs.devMem != 0 {
		errs = append(errs, d.MemFree(gs.devMem))
		gs.devMem = 0
	}
	if gs.mod != 0 {
		errs = append(errs, d.ModuleUnload(gs.mod))
		gs.mod, gs.fn, gs.inline = 0, 0, 0
	}
	return errors.Join(errs...)
}

// GatherInfo describes the copier's gather setup.
type GatherInfo struct {
	Mode      GatherMode
	Threshold uint64
	Grid      int
	Block     int
	Streams   int
	Reason    string
}

// Gather describes the copier's choice between copy engines and SMs.
func (c *Copier) Gather() GatherInfo {
	return GatherInfo{Mode: c.gather.mode, Threshold: c.gather.threshold, Grid: int(c.gather.grid), Block: int(c.gather.block),
		Streams: c.gather.streams, Reason: c.gather.why}
}
