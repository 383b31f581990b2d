// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
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

// deviceChoice is the GPU a CUDA first hop goes on: ordinal when set,
// else the device of the calling thread's current context, else 0.
type deviceChoice struct {
	ordinal int
	set     bool
}

// firstHop is the engine's first-hop copier and what comes with it: the
// arena provider of the same memory, and the GPU it holds.
type firstHop struct {
	// kind is copierHost or copierCUDA, or copierDefault when PXN is off
	// and no copier runs.
	kind   uint32
	copier relay.Copier
	mem    deviceMemory
	// arenas is nil for host arenas; arenaKind is memHost or memDevice.
	arenas    staging.ArenaProvider
	arenaKind int
	gpu       *gpu.GPU
	// driver is the one the GPU was opened with; it is closed after it.
	driver *cuda.Driver
}

// close releases the GPU and the driver once the engine has closed the
// copier and the arenas.
func (f *firstHop) close() error {
	if f.gpu == nil {
		return nil
	}
	g, d := f.gpu, f.driver
	f.gpu, f.driver = nil, nil
	err := g.Close()
	d.Close()
	return err
}

func hostFirstHop(kind uint32) *firstHop {
	c := cpucopy.NewHostCopier(cpucopy.HostCopierOptions{})
	return &firstHop{kind: kind, copier: c, mem: c, arenaKind: memHost}
}

// newFirstHop builds the first hop of kind. pxnOn says whether PXN may run
// in this process: without it nothing of CUDA is created (no context, no
// stream, no device memory), though an explicit CUDA request still needs a
// driver. DEFAULT falls back to the host copier, with one log line, where
// CUDA cannot run; an explicit CUDA request fails with PXN_ENOTSUP instead.
func newFirstHop(kind uint32, pxnOn bool, dev deviceChoice, copyMode string, log klog.Logger) (*firstHop, error) {
	switch kind {
	case copierHost:
		if !pxnOn {
			return hostFirstHop(copierDefault), nil
		}
		return hostFirstHop(copierHost), nil
	case copierDefault, copierCUDA:
	default:
		return nil, fail(codeInvalid, "unknown copier kind %d; want PXN_COPIER_DEFAULT, PXN_COPIER_HOST or PXN_COPIER_CUDA", kind)
	}
	explicit := kind == copierCUDA
	d, ordinal, err := cudaDevice(dev)
	if err != nil {
		if explicit {
			return nil, fail(codeNotSup, "copier PXN_COPIER_CUDA is not available: %w; open with PXN_COPIER_DEFAULT or PXN_COPIER_HOST", err)
		}
		if pxnOn {
			log.Info("pxn first hop: host copier", "reason", err.Error())
			return hostFirstHop(copierHost), nil
		}
		return hostFirstHop(copierDefault), nil
	}
	if !pxnOn {
		d.Close()
		return hostFirstHop(copierDefault), nil
	}
	f, err := cudaFirstHop(d, ordinal, copyMode, log)
	if err != nil {
		d.Close()
		if explicit {
			return nil, fail(codeIO, "copier PXN_COPIER_CUDA on device %d: %w", ordinal, err)
		}
		log.Info("pxn first hop: host copier", "reason", fmt.Sprintf("CUDA copier on device %d failed: %v", ordinal, err))
		return hostFirstHop(copierHost), nil
	}
	return f, nil
}

// cudaDevice loads the driver and picks the GPU. The caller closes the
// driver it returns.
func cudaDevice(dev deviceChoice) (*cuda.Driver, int, error) {
	d, err := cuda.Load()
	if err != nil {
		return nil, 0, err
	}
	n, err := d.DeviceCount()
	if err == nil && n == 0 {
		err = errors.New("the CUDA driver reports no device")
	}
	if err == nil && dev.set && (dev.ordinal < 0 || dev.ordinal >= n) {
		err = fmt.Errorf("cuda_device %d: the driver reports devices 0..%d", dev.ordinal, n-1)
	}
	if err != nil {
		d.Close()
		return nil, 0, err
	}
	if dev.set {
		return d, dev.ordinal, nil
	}
	if ctx, err := d.CtxGetCurrent(); err == nil && ctx != 0 {
		if cur, err := d.CtxGetDevice(); err == nil {
			return d, int(cur), nil
		}
	}
	return d, 0, nil
}

func cudaFirstHop(d *cuda.Driver, ordinal int, copyMode string, log klog.Logger) (*firstHop, error) {
	gather, err := gpu.ParseGatherMode(copyMode)
	if err != nil {
		return nil, err
	}
	g, err := gpu.Open(d, ordinal)
	if err != nil {
		return nil, err
	}
	c, err := gpu.NewCopier(g, gpu.CopierOptions{Gather: gather, Logger: log})
	if err != nil {
		return nil, errors.Join(err, g.Close())
	}
	arenas := gpu.NewArenasWith(g, gpu.ArenaOptions{Logger: log})
	share, why := arenas.Share()
	log.Info("pxn first hop: CUDA copier and device arena", "device", ordinal, "driver", d.Version(), "arenaShare", share.String(), "why", why)
	return &firstHop{kind: copierCUDA, copier: c, mem: &cudaMemory{g: g}, arenas: arenas, arenaKind: memDevice, gpu: g, driver: d}, nil
}

// cudaMemory checks device ranges for pxn_register_memory: the CUDA copier
// classifies every request through the driver, so registering only checks.
type cudaMemory struct {
	g *gpu.GPU
}

func (m *cudaMemory) RegisterDevice(addr uintptr, n uint64) error {
	d := m.g.Driver()
	if d.Classify(m.g.Context(), cuda.DevicePtr(addr), n) != cuda.MemoryDevice {
		return fmt.Errorf("%#x+%d is not inside one device allocation (cuMemAlloc, cudaMalloc or a cuMemCreate mapping)", addr, n)
	}
	var ord int
	err := m.g.Do(func() error {
		var err error
		ord, err = d.PointerDeviceOrdinal(cuda.DevicePtr(addr))
		return err
	})
	if err != nil {
		return fmt.Errorf("%#x+%d: %w", addr, n, err)
	}
	if ord != m.g.Ordinal() {
		return fmt.Errorf("%#x+%d is memory of GPU %d; this engine's copier and arena are on GPU %d", addr, n, ord, m.g.Ordinal())
	}
	return nil
}
