// SPDX-License-Identifier: Apache-2.0

// Package contract is what PXN's control plane (the node agent, the device
// plugin, the PxnRailMap CRD, the Helm chart) and its engine (libpxn) agree
// on: the MC_PXN_* environment with its defaults and ranges, the rules for
// rail names, HCA names and group ids, the rail map's JSON encoding, and
// the node plugins' group-folder layout that the node agent reads.
// Both sides import it and neither restates any of it. It imports nothing of
// the module, so the control plane links no engine code through it.
package contract

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// EnvPrefix opens the name of every variable of the contract.
const EnvPrefix = "MC_PXN_"

// The engine's environment variables. The device plugin hands EnvEnable,
// EnvRailMap, EnvGroupID and EnvRegistryRoot to every container holding
// pxn.io/relay; the others are tuning knobs an operator may set.
const (
	// EnvEnable is EnableOn or EnableOff; unset or empty is off.
	EnvEnable = EnvPrefix + "ENABLE"
	// EnvGroupID names the job; see ValidateGroupID. Required when enabled.
	EnvGroupID = EnvPrefix + "GROUP_ID"
	// EnvInflightDepth bounds a relay's Pieces in their second hop.
	EnvInflightDepth = EnvPrefix + "INFLIGHT_DEPTH"
	// EnvRailMap is the rail map; see ParseRailMap and EncodeRailMap.
	EnvRailMap = EnvPrefix + "RAIL_MAP"
	// EnvCreditTimeout is how long, in milliseconds, a Piece waits for
	// credit on its lane before it is sent direct.
	EnvCreditTimeout = EnvPrefix + "CREDIT_TIMEOUT_MS"
	// EnvFirstPiece is the most bytes, in KiB, of a request's first Piece
	// through a relay; each later Piece may hold twice the one before, up
	// to the slot. MaxFirstPieceKiB (the slot) turns the ramp off.
	EnvFirstPiece = EnvPrefix + "FIRST_PIECE_KIB"
	// EnvSlotParts is the most parts a Piece on an idle lane is copied and
	// forwarded in: the relay forwards a part once it is in the slot,
	// while the sender still copies the next. 1 turns parts off.
	EnvSlotParts = EnvPrefix + "SLOT_PARTS"
	// EnvHeartbeatTimeout is how long, in milliseconds, a peer may miss its
	// heartbeat before it counts as gone.
	EnvHeartbeatTimeout = EnvPrefix + "HEARTBEAT_TIMEOUT_MS"
	// EnvRegistryRoot is the absolute folder holding the group folders.
	EnvRegistryRoot = EnvPrefix + "REGISTRY_ROOT"
	// EnvCopyMode is CopyModeCE, CopyModeSM or CopyModeAuto: how a CUDA sender moves a Piece into
	// a relay's slot. Unset or empty is CopyModeAuto.
	EnvCopyMode = EnvPrefix + "COPY_MODE"
)

// Values of EnvEnable.
const (
	EnableOn  = "1"
	EnableOff = "0"
)

// Values of EnvCopyMode.
const (
	CopyModeAuto = "auto"
	CopyModeCE   = "ce"
	CopyModeSM   = "sm"
)

// Defaults and accepted ranges. Millisecond variables take plain decimal
// digits; the bounds below are inclusive.
const (
	DefaultInflightDepth = 4
	MinInflightDepth     = 1
	MaxInflightDepth     = 64

	DefaultCreditTimeout = 1000 * time.Millisecond
	MinCreditTimeout     = 1 * time.Millisecond
	MaxCreditTimeout     = 600000 * time.Millisecond

	// MaxFirstPieceKiB is the staging slot: no ramp.
	MaxFirstPieceKiB = 8192
	// DefaultFirstPieceKiB is the slot: the ramp is off unless asked for.
	// On one H200 under MPS a 256 KiB ramp made a kv-small request slower
	// (completion +108 µs over direct at p50 against +79 µs without it):
	// each extra Piece costs more hand-over than its overlap saves there
	// (docs/benchmarks.md).
	DefaultFirstPieceKiB = MaxFirstPieceKiB
	MinFirstPieceKiB     = 4

	// DefaultSlotParts is MaxSlotParts, the most the ready line holds.
	DefaultSlotParts = MaxSlotParts
	MinSlotParts     = 1
	MaxSlotParts     = 8

	DefaultHeartbeatTimeout = 3000 * time.Millisecond
	// MinHeartbeatTimeout is two periods of the engine's 100 ms heartbeat:
	// a peer is declared stale only after it missed at least one beat.
	MinHeartbeatTimeout = 200 * time.Millisecond
	MaxHeartbeatTimeout = 600000 * time.Millisecond

	DefaultRegistryRoot = "/dev/shm"
	// MaxRegistryRoot is the longest EnvRegistryRoot in bytes.
	MaxRegistryRoot = 1024

	// MaxRailMapBytes is the longest EnvRailMap in bytes.
	MaxRailMapBytes = 64 << 10
	// MaxRailMapEntries is the most HCAs one rail map names.
	MaxRailMapEntries = 1024
)

// ValidateRegistryRoot checks an EnvRegistryRoot value: an absolute path of
// at most MaxRegistryRoot bytes without NUL. The error says what is wrong but
// not the path; the caller adds it.
func ValidateRegistryRoot(s string) error {
	switch {
	case len(s) > MaxRegistryRoot:
		return fmt.Errorf("longer than %d bytes", MaxRegistryRoot)
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("contains a NUL byte")
	case !filepath.IsAbs(s):
		return errors.New("not an absolute path")
	}
	return nil
}

// IsVariable reports whether name is one of the engine's variables.
func IsVariable(name string) bool {
	switch name {
	case EnvEnable, EnvGroupID, EnvInflightDepth, EnvRailMap, EnvCreditTimeout,
		EnvFirstPiece, EnvSlotParts, EnvHeartbeatTimeout, EnvRegistryRoot, EnvCopyMode:
		return true
	}
	return false
}
