// SPDX-License-Identifier: Apache-2.0

package folder

import (
	"bytes"
	"errors"
	"fmt"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/staging"
)

// ErrCorruptEntry marks a registry entry whose bytes make no sense: short,
// out of range, or contradicting its own name. The entry is skipped.
var ErrCorruptEntry = errors.New("corrupt registry entry")

// MismatchError reports a peer built with other engine numbers (or no
// registry file at all): PXN refuses that peer and traffic to it goes direct.
type MismatchError struct {
	Field        string
	Theirs, Ours uint64
}

func (e *MismatchError) Error() string {
	if e.Field == "magic" {
		return fmt.Sprintf("magic %#x differs from ours %#x", e.Theirs, e.Ours)
	}
	return fmt.Sprintf("%s %d differs from ours %d", e.Field, e.Theirs, e.Ours)
}

const HeaderSize = unsafe.Sizeof(staging.Header{})

// NewHeader fills everything a rank publishes and never changes afterwards.
func NewHeader(id staging.Identity, ns staging.PidNS, uid int, rail, hca string, arenaKind uint32) staging.Header {
	h := staging.Header{
		Magic:        staging.RegistryMagic,
		ABIVersion:   staging.ABIVersion,
		HeaderSize:   uint32(HeaderSize),
		State:        staging.StateInit,
		UID:          uint32(uid),
		Pid:          uint64(id.Pid),
		StartTime:    id.StartTime,
		BootEpoch:    id.Epoch,
		LaneCount:    staging.LaneCount,
		SlotsPerLane: staging.SlotsPerLane,
		SlotSize:     staging.SlotSize,
		ArenaSize:    staging.ArenaSize,
		ArenaKind:    arenaKind,
		RailLen:      uint32(len(rail)),
		HCALen:       uint32(len(hca)),
		ArenaShares:  staging.ShareIPCHandle,
		PidNSDev:     ns.Dev,
		PidNSIno:     ns.Ino,
	}
	copy(h.Rail[:], rail)
	copy(h.HCA[:], hca)
	return h
}

// DecodeHeader copies a header out of untrusted bytes and validates it.
func DecodeHeader(b []byte) (staging.Header, error) {
	var h staging.Header
	if len(b) < int(HeaderSize) {
		return h, fmt.Errorf("%w: header is %d bytes, want %d", ErrCorruptEntry, len(b), HeaderSize)
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&h)), HeaderSize), b)
	return h, CheckHeader(&h)
}

// CheckHeader validates a header copy. The engine numbers must equal ours
// (a *MismatchError names the first that differs); every other field must
// be in range.
func CheckHeader(h *staging.Header) error {
	for _, f := range [...]struct {
		name         string
		theirs, ours uint64
	}{
		{"magic", h.Magic, staging.RegistryMagic},
		{"ABI version", uint64(h.ABIVersion), staging.ABIVersion},
		{"header size", uint64(h.HeaderSize), uint64(HeaderSize)},
		{"lane count", uint64(h.LaneCount), staging.LaneCount},
		{"slots per lane", uint64(h.SlotsPerLane), staging.SlotsPerLane},
		{"slot size", h.SlotSize, staging.SlotSize},
		{"arena size", h.ArenaSize, staging.ArenaSize},
	} {
		if f.theirs != f.ours {
			return &MismatchError{Field: f.name, Theirs: f.theirs, Ours: f.ours}
		}
	}
	switch {
	case h.State < staging.StateInit || h.State > staging.StateClosing:
		return fmt.Errorf("%w: state %d", ErrCorruptEntry, h.State)
	case h.Pid == 0 || h.Pid > staging.MaxPid:
		return fmt.Errorf("%w: pid %d", ErrCorruptEntry, h.Pid)
	case h.BootEpoch == 0:
		return fmt.Errorf("%w: epoch 0", ErrCorruptEntry)
	case h.PidNSIno == 0:
		return fmt.Errorf("%w: no PID namespace", ErrCorruptEntry)
	case h.ArenaShares == 0 || h.ArenaShares&^(staging.ShareIPCHandle|staging.ShareFD|staging.ShareLaneFD) != 0:
		return fmt.Errorf("%w: arena shares %#x", ErrCorruptEntry, h.ArenaShares)
	case h.ArenaKind != staging.ArenaHost && h.ArenaKind != staging.ArenaCUDA:
		return fmt.Errorf("%w: arena kind %d", ErrCorruptEntry, h.ArenaKind)
	case h.RailLen == 0 || h.RailLen > uint32(len(h.Rail)):
		return fmt.Errorf("%w: rail length %d, want 1..%d", ErrCorruptEntry, h.RailLen, len(h.Rail))
	case h.HCALen > uint32(len(h.HCA)):
		return fmt.Errorf("%w: HCA length %d, want 0..%d", ErrCorruptEntry, h.HCALen, len(h.HCA))
	case bytes.IndexByte(h.Rail[:h.RailLen], 0) >= 0 || bytes.IndexByte(h.HCA[:h.HCALen], 0) >= 0:
		return fmt.Errorf("%w: NUL byte in rail or HCA name", ErrCorruptEntry)
	}
	return nil
}

// HeaderIdentity is the identity a validated header claims.
func HeaderIdentity(h *staging.Header) staging.Identity {
	return staging.Identity{Pid: int(h.Pid), StartTime: h.StartTime, Epoch: h.BootEpoch}
}

func HeaderRail(h *staging.Header) string { return string(h.Rail[:h.RailLen]) }
func HeaderHCA(h *staging.Header) string  { return string(h.HCA[:h.HCALen]) }

func StateName(s uint32) string {
	switch s {
	case staging.StateInit:
		return "INIT"
	case staging.StateReady:
		return "READY"
	case staging.StateClosing:
		return "CLOSING"
	}
	return fmt.Sprintf("state(%d)", s)
}

// ShareName names a way of mapping an arena (staging.ShareLaneFD,
// staging.ShareFD, staging.ShareIPCHandle).
func ShareName(share uint32) string {
	switch share {
	case staging.ShareLaneFD:
		return "lane-descriptor"
	case staging.ShareFD:
		return "descriptor"
	case staging.ShareIPCHandle:
		return "handle"
	}
	return fmt.Sprintf("share(%d)", share)
}
