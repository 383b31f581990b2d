// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
)

// A claim's words live in two memfds and an eventfd that the relay makes
// for each claim and hands to the holder with its answer (docs/abi.md):
// the sender block, which both map read-write, and the relay block, which
// the relay maps read-write before it seals it with F_SEAL_FUTURE_WRITE,
// so that its holder maps it read-only and can neither write it (mmap,
// write, mprotect) nor change its size.

// relayBlockSeals are the seals of a relay block; senderBlockSeals those
// of a sender block, the seals of an arena lane.
const (
	senderBlockSeals = arenaSeals
	relayBlockSeals  = arenaSeals | unix.F_SEAL_FUTURE_WRITE
)

// laneBlocks are one claim's blocks as the relay maps them, and the
// descriptors it hands out once; the relay closes its copies of the
// descriptors once they are sent.
type laneBlocks struct {
	words    *staging.LaneWords
	senderFD int
	relayFD  int
}

// newLaneBlocks makes the blocks and the eventfd of a claim of lane under
// epoch, mapped read-write here and sealed. The relay block starts with
// its sleeping flag set: the pump clears it once it follows the claim.
func newLaneBlocks(name string, lane int, epoch uint64) (*laneBlocks, error) {
	b := &laneBlocks{senderFD: -1, relayFD: -1}
	var smem, rmem []byte
	wake := -1
	fail := func(err error) (*laneBlocks, error) {
		for _, m := range [][]byte{smem, rmem} {
			if m != nil {
				unix.Munmap(m)
			}
		}
		for _, fd := range []int{b.senderFD, b.relayFD, wake} {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		return nil, fmt.Errorf("lane %d: %w", lane, err)
	}
	var err error
	sname := fmt.Sprintf("%s.lane%d.sender", name, lane)
	if b.senderFD, err = newSealedMemfd(sname, int64(staging.SenderBlockSize), senderBlockSeals); err != nil {
		return fail(err)
	}
	if smem, err = unix.Mmap(b.senderFD, 0, int(staging.SenderBlockSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fail(fmt.Errorf("mmap %s: %w", sname, err))
	}
	rname := fmt.Sprintf("%s.lane%d.relay", name, lane)
	if b.relayFD, err = newMemfd(rname, int64(staging.RelayBlockSize)); err != nil {
		return fail(err)
	}
	if rmem, err = unix.Mmap(b.relayFD, 0, int(staging.RelayBlockSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fail(fmt.Errorf("mmap %s: %w", rname, err))
	}
	// The relay's own writable mapping comes before the seal, which only
	// refuses writable mappings made after it.
	if _, err := unix.FcntlInt(uintptr(b.relayFD), unix.F_ADD_SEALS, relayBlockSeals); err != nil {
		return fail(fmt.Errorf("seal memfd %s %s: %w", rname, sealNames(relayBlockSeals), err))
	}
	if wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return fail(fmt.Errorf("eventfd: %w", err))
	}
	relay := (*staging.LaneRelayBlock)(unsafe.Pointer(&rmem[0]))
	relay.Wake.Sleeping = 1
	b.words = &staging.LaneWords{
		Epoch:  epoch,
		Sender: (*staging.LaneSenderBlock)(unsafe.Pointer(&smem[0])),
		Relay:  relay,
		WakeFD: wake,
		Free: func() {
			unix.Munmap(smem)
			unix.Munmap(rmem)
			unix.Close(wake)
		},
	}
	return b, nil
}

// closeFDs closes the relay's copies of the memfds, once they are sent or
// the claim failed; the mappings keep the memory.
func (b *laneBlocks) closeFDs() {
	for _, fd := range []*int{&b.senderFD, &b.relayFD} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// heldBlocks are a claim's blocks as its holder maps them.
type heldBlocks struct {
	smem, rmem []byte
	wakeFD     int
}

func (h *heldBlocks) sender() *staging.LaneSenderBlock {
	return (*staging.LaneSenderBlock)(unsafe.Pointer(&h.smem[0]))
}

func (h *heldBlocks) relay() *staging.LaneRelayBlock {
	return (*staging.LaneRelayBlock)(unsafe.Pointer(&h.rmem[0]))
}

func (h *heldBlocks) close() error {
	var errs []error
	for _, m := range []*[]byte{&h.smem, &h.rmem} {
		if *m != nil {
			if err := unix.Munmap(*m); err != nil {
				errs = append(errs, fmt.Errorf("unmap lane block: %w", err))
			}
			*m = nil
		}
	}
	if h.wakeFD >= 0 {
		unix.Close(h.wakeFD)
		h.wakeFD = -1
	}
	return errors.Join(errs...)
}

// mapHeldBlocks maps a claim's blocks from the descriptors of the relay's
// answer: the sender block read-write, the relay block read-only. It
// takes wakeFD; the memfds stay the caller's to close.
func mapHeldBlocks(senderFD, relayFD, wakeFD int) (*heldBlocks, error) {
	h := &heldBlocks{wakeFD: wakeFD}
	fail := func(err error) (*heldBlocks, error) {
		return nil, errors.Join(err, h.close())
	}
	if err := checkSealedFD("sender block", senderFD, senderBlockSeals, int64(staging.SenderBlockSize), "one sender block"); err != nil {
		return fail(err)
	}
	if err := checkSealedFD("relay block", relayFD, relayBlockSeals, int64(staging.RelayBlockSize), "one relay block"); err != nil {
		return fail(err)
	}
	var err error
	if h.smem, err = unix.Mmap(senderFD, 0, int(staging.SenderBlockSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fail(fmt.Errorf("mmap sender block: %w", err))
	}
	if h.rmem, err = unix.Mmap(relayFD, 0, int(staging.RelayBlockSize), unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return fail(fmt.Errorf("mmap relay block: %w", err))
	}
	return h, nil
}
