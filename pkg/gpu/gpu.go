// SPDX-License-Identifier: Apache-2.0

// Package gpu is PXN's first hop on CUDA GPUs: a staging arena in device
// memory shared with peers by POSIX descriptor or legacy CUDA IPC handle
// (Arenas), and a relay.Copier that moves Pieces into a peer's arena with
// the copy engines or, for fragmented Pieces, the SM gather kernel of
// pkg/gpu/kernel, and rings the slot's doorbell from the GPU (Copier). It
// speaks to the driver through pkg/cuda, which loads libcuda at run
// time; docs/cuda.md explains the choices.
package gpu

import (
	"fmt"

	"github.com/pxn-project/pxn/pkg/cuda"
)

// GPU is one device of this process and its retained primary context: the
// context the CUDA runtime (and so the application) uses on that device.
type GPU struct {
	d       *cuda.Driver
	ordinal int
	dev     cuda.Device
	ctx     cuda.Context
}

// Open retains device ordinal's primary context.
func Open(d *cuda.Driver, ordinal int) (*GPU, error) {
	dev, err := d.DeviceGet(ordinal)
	if err != nil {
		return nil, fmt.Errorf("gpu %d: %w", ordinal, err)
	}
	ctx, err := d.PrimaryCtxRetain(dev)
	if err != nil {
		return nil, fmt.Errorf("gpu %d: %w", ordinal, err)
	}
	return &GPU{d: d, ordinal: ordinal, dev: dev, ctx: ctx}, nil
}

// Driver is the loaded driver.
func (g *GPU) Driver() *cuda.Driver { return g.d }

// Ordinal is the device's ordinal in this process.
func (g *GPU) Ordinal() int { return g.ordinal }

// Device is the device handle.
func (g *GPU) Device() cuda.Device { return g.dev }

// Context is the retained primary context.
func (g *GPU) Context() cuda.Context { return g.ctx }

// Do runs fn on a locked OS thread with the context current, restoring the
// thread's previous context afterwards.
func (g *GPU) Do(fn func() error) error { return g.d.WithContext(g.ctx, fn) }

// Close releases the primary context. Everything made in it (arenas,
// copiers) must be closed first.
func (g *GPU) Close() error {
	if err := g.d.PrimaryCtxRelease(g.dev); err != nil {
		return fmt.Errorf("gpu %d: %w", g.ordinal, err)
	}
	return nil
}
