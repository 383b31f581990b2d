// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/pxn-project/pxn/internal/cuda"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// Arenas provides staging arenas in device memory: one cuMemAlloc of
// staging.ArenaSize per rank, exported as the 64-byte CUDA IPC handle of its
// base and opened by peers with cuIpcOpenMemHandle (lazy peer access, so a
// peer on another GPU needs no explicit cuCtxEnablePeerAccess). The registry
// directory and entry names are not used: the memory lives on the GPU.
//
// Legacy CUDA IPC needs the peers in one PID namespace with the owner's GPU
// visible to them.
type Arenas struct {
	g *GPU
}

var _ staging.ArenaProvider = (*Arenas)(nil)

// NewArenas returns a provider that allocates on g.
func NewArenas(g *GPU) *Arenas { return &Arenas{g: g} }

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

// Allocate allocates and exports an arena on the provider's GPU.
func (a *Arenas) Allocate(_ *os.File, _ string) (staging.Arena, error) {
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
	return &arena{g: a.g, base: base, handle: h}, nil
}

// Open maps a peer's arena from its IPC handle into the provider's context.
// The peer must not be this process.
func (a *Arenas) Open(_ *os.File, handle [staging.ArenaHandleSize]byte) (staging.PeerArena, error) {
	if handle == ([staging.ArenaHandleSize]byte{}) {
		return nil, fmt.Errorf("%w: empty CUDA IPC handle", registry.ErrCorruptEntry)
	}
	var base cuda.DevicePtr
	err := a.g.Do(func() error {
		var err error
		base, err = a.g.d.IPCOpenMemHandle(cuda.IPCMemHandle(handle), cuda.IPCLazyEnablePeerAccess)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("gpu peer arena on device %d: %w", a.g.ordinal, err)
	}
	return &peerArena{g: a.g, base: base}, nil
}

type arena struct {
	g      *GPU
	base   cuda.DevicePtr
	handle cuda.IPCMemHandle

	mu     sync.Mutex
	closed bool
}

func (a *arena) Kind() uint32  { return staging.ArenaCUDA }
func (a *arena) Base() uintptr { return uintptr(a.base) }
func (a *arena) Size() uint64  { return staging.ArenaSize }

func (a *arena) Export() ([staging.ArenaHandleSize]byte, error) {
	return a.handle, nil
}

// Close frees the arena. The registry calls it only after every peer lease
// is gone, so no peer still maps it.
func (a *arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	if err := a.g.Do(func() error { return a.g.d.MemFree(a.base) }); err != nil {
		return fmt.Errorf("gpu arena %#x: %w", uint64(a.base), err)
	}
	return nil
}

type peerArena struct {
	g    *GPU
	base cuda.DevicePtr

	mu     sync.Mutex
	closed bool
}

func (p *peerArena) Base() uintptr { return uintptr(p.base) }

// Close unmaps the peer's arena (cuIpcCloseMemHandle). Work this process
// enqueued into it must have completed.
func (p *peerArena) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if err := p.g.Do(func() error { return p.g.d.IPCCloseMemHandle(p.base) }); err != nil {
		return fmt.Errorf("gpu peer arena %#x: %w", uint64(p.base), err)
	}
	return nil
}
