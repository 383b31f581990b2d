// SPDX-License-Identifier: Apache-2.0

package gpu_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/fakecuda"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
)

// A Piece behind a caller's stream that never completes keeps its lane
// stream from finishing. Close gives up on it after the drain timeout
// instead of hanging the host, names the lane, and releases nothing the
// stream may still write; the lane that finished is drained.
func TestCopierCloseLeavesAWedgedStreamOnStandIn(t *testing.T) {
	for _, bell := range []gpu.DoorbellMode{gpu.DoorbellGPU, gpu.DoorbellCPU} {
		name := map[gpu.DoorbellMode]string{gpu.DoorbellGPU: "gpu doorbell", gpu.DoorbellCPU: "cpu doorbell"}[bell]
		t.Run(name, func(t *testing.T) { closeWedged(t, bell) })
	}
}

func closeWedged(t *testing.T, bell gpu.DoorbellMode) {
	const (
		size    = 4096
		drain   = 100 * time.Millisecond
		stuck   = 1
		healthy = 0
	)
	lib := fakeLib(t)
	g := openFake(t, lib, 13000)
	d := g.Driver()
	c, err := gpu.NewCopier(g, gpu.CopierOptions{Doorbell: bell, Copy: gpu.CopyPerEntry, DrainTimeout: drain})
	if err != nil {
		t.Fatal(err)
	}
	caller, err := d.StreamCreate(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.StreamDestroy(caller) })
	release := fakecuda.Stall(t, lib, uintptr(caller))

	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	// The copier may keep the page registered: it is never unmapped.
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), 2)
	unreg, err := c.RegisterHost(uintptr(unsafe.Pointer(&mem[0])), 16)
	if err != nil {
		t.Fatal(err)
	}
	src, dst := alloc(t, g, 8*size), alloc(t, g, 8*size)
	ready, err := c.RecordReady(uintptr(caller))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Copy(stuck, ready, piece(src, dst, 2, size), &words[0], 1); err != nil {
		t.Fatalf("Copy behind the stalled stream: %v", err)
	}
	if err := c.Copy(healthy, 0, piece(src, dst+4*size, 2, size), &words[1], 1); err != nil {
		t.Fatalf("Copy on the healthy lane: %v", err)
	}

	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err = <-closed:
		t.Cleanup(release)
	case <-time.After(100 * drain):
		t.Fatalf("Close has not returned %v after it was called with a drain timeout of %v: it waits for the stalled stream", 100*drain, drain)
	}
	if !errors.Is(err, gpu.ErrNotDrained) || !strings.Contains(err.Error(), "lane 1 stream 0") {
		t.Fatalf("Close = %v, want %v naming lane 1 stream 0", err, gpu.ErrNotDrained)
	}
	if strings.Contains(err.Error(), "lane 0") {
		t.Errorf("Close = %v names lane 0, which finished", err)
	}
	if again := c.Close(); again != err {
		t.Errorf("second Close = %v, want the first one's %v", again, err)
	}
	if c.Drained(stuck) || !c.Drained(healthy) {
		t.Errorf("Drained(%d), Drained(%d) = %v, %v after Close; want false, true", stuck, healthy, c.Drained(stuck), c.Drained(healthy))
	}
	if words[0] != 0 {
		t.Errorf("the stalled Piece's doorbell reads %d; the work behind the stall never ran", words[0])
	}
	if bell != gpu.DoorbellGPU {
		// Nothing was registered: the CPU rings the doorbells.
		return
	}
	if uerr := unreg(); !errors.Is(uerr, gpu.ErrNotDrained) {
		t.Errorf("unregister after the wedged Close = %v, want %v", uerr, gpu.ErrNotDrained)
	}
	if st := c.Stats(); st.HostRanges != 1 {
		t.Errorf("%d host ranges registered after the wedged Close, want the doorbell's 1 kept", st.HostRanges)
	}
}
