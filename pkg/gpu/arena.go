// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// ArenaShare is how a rank's device arena is shared with its peers.
type ArenaShare int

const (
	// ShareAuto: by descriptor where the device and driver can, else by a
	// legacy IPC handle.
	ShareAuto ArenaShare = iota
	// ShareLegacyIPC: a cuMemAlloc arena whose CUDA IPC handle peers open
	// (within one PID namespace, or from a namespace below the owner's).
	ShareLegacyIPC
	// ShareDescriptor: a cuMemCreate allocation a lane, each exported as a
	// POSIX file descriptor to that lane's holder alone, which a peer in
	// any PID namespace can import.
	ShareDescriptor
)

func (s ArenaShare) String() string {
	switch s {
	case ShareAuto:
		return "auto"
	case ShareLegacyIPC:
		return "ipc"
	case ShareDescriptor:
		return "fd"
	}
	return fmt.Sprintf("ArenaShare(%d)", int(s))
}

// ParseArenaShare reads "auto", "ipc" or "fd".
func ParseArenaShare(s string) (ArenaShare, error) {
	for _, v := range []ArenaShare{ShareAuto, ShareLegacyIPC, ShareDescriptor} {
		if s == v.String() {
			return v, nil
		}
	}
	return 0, fmt.Errorf("arena share %q: want auto, ipc or fd", s)
}

// ArenaOptions configure Arenas.
type ArenaOptions struct {
	// Share is the way this rank's own arena is shared (peers' arenas are
	// mapped whichever way they offer).
	Share ArenaShare
	// Logger receives one line when an automatic choice of descriptor
	// sharing falls back to legacy IPC at allocation.
	Logger klog.Logger
}

// Arenas provides staging arenas in device memory, of staging.ArenaSize
// each, and maps peers' arenas (docs/cuda.md, "The GPU arena").
//
// With descriptor sharing the arena is one cuMemCreate allocation a lane
// (each exportable as a POSIX file descriptor, and registrable with an
// RDMA NIC where the device supports that), mapped side by side into one
// reserved range, read-write for the provider's device, so the owner sees
// one arena of staging.ArenaSize; it has no legacy IPC handle, since
// cuIpcGetMemHandle applies only to cuMemAlloc memory, so its header
// offers staging.ShareLaneFD alone, and a lane's holder maps that lane and
// nothing else. With legacy IPC the arena is one cuMemAlloc whose 64-byte
// CUDA IPC handle peers open with cuIpcOpenMemHandle; it offers
// staging.ShareIPCHandle alone, and every holder maps the whole arena.
// Either way peers' arenas are mapped by the way they offer: Open for a
// handle, OpenLaneFD for a lane's descriptor.
type Arenas struct {
	g    *GPU
	want ArenaShare
	log  klog.Logger

	mu     sync.Mutex
	share  ArenaShare
	reason string

	openedFD, openedIPC, failedFD, failedIPC atomic.Uint64
}

var (
	_ staging.ArenaProvider       = (*Arenas)(nil)
	_ staging.LaneFDArenaProvider = (*Arenas)(nil)
	_ staging.LaneRenewer         = (*fdArena)(nil)
	_ staging.PeerLane            = (*fdPeerArena)(nil)
)

// NewArenas returns a provider that allocates on g, sharing by descriptor
// where it can.
func NewArenas(g *GPU) *Arenas {
	return NewArenasWith(g, ArenaOptions{Logger: klog.Background()})
}

// NewArenasWith returns a provider that allocates on g as o says. Whether
// descriptor sharing is possible is read from the device's attributes here;
// Allocate finds out whether it works.
func NewArenasWith(g *GPU, o ArenaOptions) *Arenas {
	a := &Arenas{g: g, want: o.Share, log: o.Logger, share: o.Share}
	switch o.Share {
	case ShareAuto:
		if err := g.d.FDShareSupport(g.dev); err != nil {
			a.share, a.reason = ShareLegacyIPC, err.Error()
		} else {
			a.share, a.reason = ShareDescriptor, "the device exports cuMemCreate memory as POSIX file descriptors"
		}
	case ShareLegacyIPC:
		a.reason = "asked for"
	case ShareDescriptor:
		a.reason = "asked for"
	}
	return a
}

// Device is the PCI bus id of the provider's GPU in sysfs form
// (0000:18:00.0), or cuda:<ordinal> when the driver cannot tell it: the
// registry records it in the rank's counters block (registry.DeviceNamer).
func (a *Arenas) Device() string {
	if bus, err := a.g.d.DevicePCIBusID(a.g.dev); err == nil && bus != "" {
		return strings.ToLower(bus)
	}
	return fmt.Sprintf("cuda:%d", a.g.ordinal)
}

// Kind returns staging.ArenaCUDA.
func (a *Arenas) Kind() uint32 { return staging.ArenaCUDA }

// Share is how this provider's arenas are shared (after an Allocate: how
// the last one was) and why.
func (a *Arenas) Share() (ArenaShare, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.share, a.reason
}

// ShareCounts are the peers' arenas a provider mapped, by the way they were
// shared, and the maps that failed.
type ShareCounts struct {
	FD, IPC             uint64
	FailedFD, FailedIPC uint64
}

// Counts returns the peers' arenas mapped so far.
func (a *Arenas) Counts() ShareCounts {
	return ShareCounts{FD: a.openedFD.Load(), IPC: a.openedIPC.Load(), FailedFD: a.failedFD.Load(), FailedIPC: a.failedIPC.Load()}
}

// Allocate allocates and exports an arena on the provider's GPU. Under
// ShareAuto an arena that cannot be made or exported by descriptor (an old
// driver, MPS or a container that refuses it) is made for legacy IPC
// instead, and the reason logged once.
func (a *Arenas) Allocate(_ *os.File, _ string) (staging.Arena, error) {
	a.mu.Lock()
	share := a.share
	a.mu.Unlock()
	if share == ShareDescriptor {
		ar, err := a.allocateFD()
		if err == nil {
			return ar, nil
		}
		if a.want == ShareDescriptor {
			return nil, err
		}
		a.mu.Lock()
		a.share, a.reason = ShareLegacyIPC, err.Error()
		a.mu.Unlock()
		a.log.Info("pxn gpu arena: descriptor sharing failed; the arena is shared by legacy CUDA IPC, which does not cross PID namespaces", "device", a.g.ordinal, "err", err.Error())
	}
	return a.allocateIPC()
}

func (a *Arenas) allocateIPC() (staging.Arena, error) {
	d := a.g.d
	var base cuda.DevicePtr
	var h cuda.IPCMemHandle
	err := a.g.Do(func() error {
		var err error
		if base, err = d.MemAlloc(staging.ArenaSize); err != nil {
			return err
		}
		if h, err = d.IPCGetMemHandle(base); err != nil {
			return errors.Join(err, d.MemFree(base))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gpu arena on device %d: %w", a.g.ordinal, err)
	}
	return &ipcArena{g: a.g, base: base, handle: h}, nil
}

// allocateFD makes one allocation of staging.LaneBytes a lane, maps them
// side by side into one reservation of staging.ArenaSize, and exports one
// once (to learn that it can). cuMemMap maps an allocation from its start
// only, so a lane must be whole allocations: LaneBytes must be a multiple
// of the allocation granularity.
func (a *Arenas) allocateFD() (staging.Arena, error) {
	d, dev := a.g.d, a.g.dev
	if err := d.FDShareSupport(dev); err != nil {
		return nil, fmt.Errorf("gpu arena on device %d: %w", a.g.ordinal, err)
	}
	rdma, err := d.DeviceAttribute(cuda.AttrGPUDirectRDMAWithVMMSupported, dev)
	prop := cuda.AllocationProp{Device: dev, GPUDirectRDMA: err == nil && rdma != 0}
	ar := &fdArena{g: a.g, prop: prop}
	err = a.g.Do(func() error {
		gran, err := d.MemGetAllocationGranularity(prop, false)
		if err != nil {
			return err
		}
		if gran == 0 || staging.LaneBytes%gran != 0 {
			return fmt.Errorf("a lane of %d bytes is not a whole number of allocations of granularity %d", uint64(staging.LaneBytes), gran)
		}
		if ar.base, err = d.MemAddressReserve(staging.ArenaSize, gran); err != nil {
			return err
		}
		for i := range ar.handles {
			if err := ar.mapLane(i); err != nil {
				return errors.Join(err, ar.free())
			}
		}
		fd, err := d.MemExportFD(ar.handles[0])
		if err == nil {
			err = unix.Close(fd)
		}
		if err != nil {
			return errors.Join(err, ar.free())
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gpu arena on device %d, shared by descriptor: %w", a.g.ordinal, err)
	}
	return ar, nil
}

// Open maps a peer's arena from its legacy IPC handle into the provider's
// context. The peer must not be this process.
func (a *Arenas) Open(_ *os.File, handle [staging.ArenaHandleSize]byte) (staging.PeerArena, error) {
	if handle == ([staging.ArenaHandleSize]byte{}) {
		a.failedIPC.Add(1)
		return nil, fmt.Errorf("%w: empty CUDA IPC handle", registry.ErrCorruptEntry)
	}
	var base cuda.DevicePtr
	err := a.g.Do(func() error {
		var err error
		base, err = a.g.d.IPCOpenMemHandle(cuda.IPCMemHandle(handle), cuda.IPCLazyEnablePeerAccess)
		return err
	})
	if err != nil {
		a.failedIPC.Add(1)
		return nil, &ImportError{Share: ShareLegacyIPC, Step: "cuIpcOpenMemHandle", Device: a.g.ordinal, Err: err}
	}
	a.openedIPC.Add(1)
	return &ipcPeerArena{g: a.g, base: base}, nil
}

// OpenLaneFD imports lane of the arena a peer exported as a POSIX
// descriptor, reserves address space for that lane alone, maps it and
// makes it readable and writable from the provider's device. fd stays the
// caller's. A failure is an *ImportError, which says why and whether the
// relay can be used at all.
func (a *Arenas) OpenLaneFD(fd int, lane int) (staging.PeerLane, error) {
	p, err := a.openLaneFD(fd, lane)
	if err != nil {
		a.failedFD.Add(1)
		return nil, err
	}
	a.openedFD.Add(1)
	return p, nil
}

func (a *Arenas) openLaneFD(fd int, lane int) (*fdPeerArena, error) {
	if lane < 0 || lane >= staging.LaneCount {
		return nil, fmt.Errorf("%w: gpu peer arena: lane %d out of range 0..%d", registry.ErrCorruptEntry, lane, staging.LaneCount-1)
	}
	if fd < 0 {
		return nil, fmt.Errorf("gpu peer arena lane %d: descriptor %d", lane, fd)
	}
	d := a.g.d
	p := &fdPeerArena{g: a.g, lane: lane, mapped: staging.LaneBytes}
	fail := func(step string, err error) error {
		return &ImportError{Share: ShareDescriptor, Step: step, Device: a.g.ordinal, Lane: lane, Err: err}
	}
	err := a.g.Do(func() error {
		var err error
		if p.handle, err = d.MemImportFD(fd); err != nil {
			return fail("cuMemImportFromShareableHandle", err)
		}
		prop, err := d.MemAllocationProp(p.handle)
		if err != nil {
			return errors.Join(fail("cuMemGetAllocationPropertiesFromHandle", err), d.MemRelease(p.handle))
		}
		gran, err := d.MemGetAllocationGranularity(prop, false)
		if err != nil {
			return errors.Join(fail("cuMemGetAllocationGranularity", err), d.MemRelease(p.handle))
		}
		if gran == 0 || staging.LaneBytes%gran != 0 {
			return errors.Join(fail("cuMemGetAllocationGranularity", fmt.Errorf("a lane of %d bytes is not a whole number of allocations of granularity %d", uint64(staging.LaneBytes), gran)), d.MemRelease(p.handle))
		}
		if p.base, err = d.MemAddressReserve(p.mapped, gran); err != nil {
			return errors.Join(fail("cuMemAddressReserve", err), d.MemRelease(p.handle))
		}
		// cuMemMap refuses a size past the allocation's end: a
		// descriptor of less than a lane is never mapped.
		if err := d.MemMap(p.base, p.mapped, 0, p.handle); err != nil {
			return errors.Join(fail("cuMemMap", err), d.MemAddressFree(p.base, p.mapped), d.MemRelease(p.handle))
		}
		if err := d.MemSetAccess(p.base, p.mapped, a.g.dev); err != nil {
			return errors.Join(fail("cuMemSetAccess", err), p.free())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// ErrPeerArenaUnusable is wrapped by every *ImportError: the peer's arena
// cannot be mapped in this process, so that peer cannot relay for it.
var ErrPeerArenaUnusable = errors.New("gpu: the peer's arena cannot be mapped here")

// ImportError is a peer's device arena that could not be mapped.
type ImportError struct {
	// Share is the way the peer offered its arena.
	Share ArenaShare
	// Step is the driver call that failed.
	Step string
	// Device is this process's GPU ordinal.
	Device int
	// Lane is the lane asked for, shared by descriptor.
	Lane int
	Err  error
}

func (e *ImportError) Error() string {
	what := "gpu peer arena"
	if e.Share == ShareDescriptor {
		what = fmt.Sprintf("gpu peer arena lane %d", e.Lane)
	}
	s := fmt.Sprintf("%s (shared by %s) on device %d: %s: %v", what, e.Share, e.Device, e.Step, e.Err)
	if h := e.Hint(); h != "" {
		s += "; " + h
	}
	return s
}

func (e *ImportError) Unwrap() []error { return []error{ErrPeerArenaUnusable, e.Err} }

// Hint says what a failure most likely means, or "".
func (e *ImportError) Hint() string {
	var ce *cuda.Error
	code := cuda.Result(-2)
	if errors.As(e.Err, &ce) {
		code = ce.Code
	}
	switch {
	case code == cuda.NotAvailable:
		return "the driver lacks this entry point"
	case e.Share == ShareLegacyIPC && code == cuda.ErrorInvalidContext:
		return "legacy CUDA IPC handles do not open between sibling PID namespaces (separate pods); descriptor sharing does"
	case e.Share == ShareDescriptor && e.Step == "cuMemImportFromShareableHandle":
		return "the arena lives on a GPU this process cannot open: a container given only its own GPU lacks the peer GPU's device node"
	case e.Share == ShareDescriptor && e.Step == "cuMemSetAccess":
		return "this GPU cannot access the GPU that holds the arena (no peer access between them)"
	}
	return ""
}

// closeOnce is what the four arena types share to release their memory on
// the first Close and do nothing on later ones.
type closeOnce struct {
	mu     sync.Mutex
	closed bool
}

// close runs free on g's thread, with its context current, unless an
// earlier call did; the error names the arena by what and base.
func (c *closeOnce) close(g *GPU, what string, base cuda.DevicePtr, free func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if err := g.Do(free); err != nil {
		return fmt.Errorf("%s %#x: %w", what, uint64(base), err)
	}
	return nil
}

type ipcArena struct {
	g      *GPU
	base   cuda.DevicePtr
	handle cuda.IPCMemHandle
	closeOnce
}

func (a *ipcArena) Kind() uint32  { return staging.ArenaCUDA }
func (a *ipcArena) Base() uintptr { return uintptr(a.base) }
func (a *ipcArena) Size() uint64  { return staging.ArenaSize }

func (a *ipcArena) Export() ([staging.ArenaHandleSize]byte, error) {
	return a.handle, nil
}

// Close frees the arena. The registry calls it only after every peer lease
// is gone, so no peer still maps it.
func (a *ipcArena) Close() error {
	return a.close(a.g, "gpu arena", a.base, func() error { return a.g.d.MemFree(a.base) })
}

// fdArena is one cuMemCreate allocation a lane, mapped side by side from
// base. A lane's allocation is replaced by Install of a NewLaneMemory.
type fdArena struct {
	g    *GPU
	base cuda.DevicePtr
	prop cuda.AllocationProp
	// handles[i] is lane i's allocation when created[i]; mapped[i] says
	// it is mapped at the lane's place, readable and writable. Under
	// closeOnce's lock once the arena is made.
	handles [staging.LaneCount]cuda.MemHandle
	created [staging.LaneCount]bool
	mapped  [staging.LaneCount]bool
	// closeOnce's lock also keeps ExportLaneFD from exporting, and
	// Install from mapping into, a closed arena.
	closeOnce
}

func (a *fdArena) Kind() uint32  { return staging.ArenaCUDA }
func (a *fdArena) Base() uintptr { return uintptr(a.base) }
func (a *fdArena) Size() uint64  { return staging.ArenaSize }

// mapLane creates lane i's allocation and maps it at its place; the
// context must be current.
func (a *fdArena) mapLane(i int) error {
	h, err := a.g.d.MemCreate(staging.LaneBytes, a.prop)
	if err != nil {
		return fmt.Errorf("lane %d: %w", i, err)
	}
	a.handles[i], a.created[i] = h, true
	return a.mapAt(i)
}

// mapAt maps lane i's allocation at its place and makes it readable and
// writable from the device; the context must be current.
func (a *fdArena) mapAt(i int) error {
	d := a.g.d
	at := a.base + cuda.DevicePtr(staging.LaneOffset(i))
	if err := d.MemMap(at, staging.LaneBytes, 0, a.handles[i]); err != nil {
		return fmt.Errorf("lane %d: %w", i, err)
	}
	a.mapped[i] = true
	if err := d.MemSetAccess(at, staging.LaneBytes, a.g.dev); err != nil {
		return fmt.Errorf("lane %d: %w", i, err)
	}
	return nil
}

// NewLaneMemory creates a new allocation for lane, of the arena's
// properties, not mapped anywhere until Install.
func (a *fdArena) NewLaneMemory(lane int) (staging.LaneMemory, error) {
	if lane < 0 || lane >= staging.LaneCount {
		return nil, fmt.Errorf("gpu arena %#x: lane %d out of range 0..%d", uint64(a.base), lane, staging.LaneCount-1)
	}
	var h cuda.MemHandle
	err := a.g.Do(func() error {
		var err error
		h, err = a.g.d.MemCreate(staging.LaneBytes, a.prop)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("gpu arena %#x lane %d: new allocation: %w", uint64(a.base), lane, err)
	}
	return &fdLane{a: a, lane: lane, handle: h, own: true}, nil
}

// fdLane is a new allocation for one lane of an fdArena; own says the
// handle is still its own, not yet the arena's nor released.
type fdLane struct {
	a      *fdArena
	lane   int
	mu     sync.Mutex
	handle cuda.MemHandle
	own    bool
}

func (m *fdLane) ExportFD() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.own {
		return -1, fmt.Errorf("gpu arena %#x lane %d: the new allocation is the arena's or released", uint64(m.a.base), m.lane)
	}
	fd := -1
	err := m.a.g.Do(func() error {
		var err error
		fd, err = m.a.g.d.MemExportFD(m.handle)
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("gpu arena %#x lane %d: %w", uint64(m.a.base), m.lane, err)
	}
	unix.CloseOnExec(fd)
	return fd, nil
}

// Install unmaps the lane's allocation before it, releases that one (an
// earlier holder's import keeps its memory alive for that holder alone),
// and maps the new one at the lane's place, readable and writable.
func (m *fdLane) Install() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.a
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case !m.own:
		return fmt.Errorf("gpu arena %#x lane %d: the new allocation was installed or released", uint64(a.base), m.lane)
	case a.closed:
		return fmt.Errorf("gpu arena %#x: closed", uint64(a.base))
	}
	i := m.lane
	err := a.g.Do(func() error {
		d := a.g.d
		if a.mapped[i] {
			if err := d.MemUnmap(a.base+cuda.DevicePtr(staging.LaneOffset(i)), staging.LaneBytes); err != nil {
				return errors.Join(fmt.Errorf("lane %d: %w", i, err), d.MemRelease(m.handle))
			}
			a.mapped[i] = false
		}
		if a.created[i] {
			a.created[i] = false
			if err := d.MemRelease(a.handles[i]); err != nil {
				return errors.Join(fmt.Errorf("lane %d: %w", i, err), d.MemRelease(m.handle))
			}
		}
		a.handles[i], a.created[i] = m.handle, true
		return a.mapAt(i)
	})
	m.own = false
	if err != nil {
		return fmt.Errorf("gpu arena %#x: new memory: %w", uint64(a.base), err)
	}
	return nil
}

func (m *fdLane) Discard() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.own {
		return nil
	}
	m.own = false
	return m.a.g.Do(func() error { return m.a.g.d.MemRelease(m.handle) })
}

// Export fails with staging.ErrNoHandle: peers get a lane's descriptor
// (ExportLaneFD).
func (a *fdArena) Export() ([staging.ArenaHandleSize]byte, error) {
	return [staging.ArenaHandleSize]byte{}, fmt.Errorf("gpu arena %#x: cuMemCreate memory has no legacy CUDA IPC handle: %w", uint64(a.base), staging.ErrNoHandle)
}

// ExportLaneFD returns a new close-on-exec descriptor of lane's
// allocation; the caller closes it.
func (a *fdArena) ExportLaneFD(lane int) (int, error) {
	if lane < 0 || lane >= staging.LaneCount {
		return -1, fmt.Errorf("gpu arena %#x: lane %d out of range 0..%d", uint64(a.base), lane, staging.LaneCount-1)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return -1, fmt.Errorf("gpu arena %#x: closed", uint64(a.base))
	}
	fd := -1
	err := a.g.Do(func() error {
		var err error
		fd, err = a.g.d.MemExportFD(a.handles[lane])
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("gpu arena %#x lane %d: %w", uint64(a.base), lane, err)
	}
	// The driver's descriptor need not be close-on-exec; a child the
	// application starts must not inherit the lane.
	unix.CloseOnExec(fd)
	return fd, nil
}

// Close unmaps and releases the arena. The registry calls it only after
// every peer lease is gone; a peer that still maps a lane keeps that
// lane's memory alive until it unmaps.
func (a *fdArena) Close() error { return a.close(a.g, "gpu arena", a.base, a.free) }

// free unmaps and releases the lanes made so far and the reservation; it
// needs the context current.
func (a *fdArena) free() error {
	d := a.g.d
	var errs []error
	for i := range staging.LaneCount {
		if a.mapped[i] {
			errs = append(errs, d.MemUnmap(a.base+cuda.DevicePtr(staging.LaneOffset(i)), staging.LaneBytes))
			a.mapped[i] = false
		}
	}
	for i := range staging.LaneCount {
		if a.created[i] {
			errs = append(errs, d.MemRelease(a.handles[i]))
			a.created[i] = false
		}
	}
	errs = append(errs, d.MemAddressFree(a.base, staging.ArenaSize))
	return errors.Join(errs...)
}

type ipcPeerArena struct {
	g    *GPU
	base cuda.DevicePtr
	closeOnce
}

func (p *ipcPeerArena) Base() uintptr { return uintptr(p.base) }

// Close unmaps the peer's arena (cuIpcCloseMemHandle). Work this process
// enqueued into it must have completed.
func (p *ipcPeerArena) Close() error {
	return p.close(p.g, "gpu peer arena", p.base, func() error { return p.g.d.IPCCloseMemHandle(p.base) })
}

// fdPeerArena is one lane of a peer's arena, imported by descriptor.
type fdPeerArena struct {
	g      *GPU
	base   cuda.DevicePtr
	handle cuda.MemHandle
	mapped uint64
	lane   int
	closeOnce
}

func (p *fdPeerArena) Base() uintptr { return uintptr(p.base) }
func (p *fdPeerArena) Lane() int     { return p.lane }

// Close unmaps the peer's lane, frees the address range and releases the
// imported handle. Work this process enqueued into it must have completed.
func (p *fdPeerArena) Close() error { return p.close(p.g, "gpu peer arena", p.base, p.free) }

func (p *fdPeerArena) free() error {
	d := p.g.d
	return errors.Join(d.MemUnmap(p.base, p.mapped), d.MemAddressFree(p.base, p.mapped), d.MemRelease(p.handle))
}
