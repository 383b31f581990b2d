// SPDX-License-Identifier: Apache-2.0

// Package staging holds the engine's fixed numbers, the shared-memory ABI
// between ranks with the two endpoints of a lane (SenderLane, RelayLane),
// the Desc and sequence rules and the piece planner. Of the module it
// imports only package contract, whose limits it checks against its own
// sizes. The engine's configuration is package engineconfig; the registry
// through which ranks of one job find each other is package
// staging/registry.
package staging

import (
	"sync/atomic"
	"unsafe"
)

// The engine's numbers. They are compile-time constants by design: a rank
// whose numbers differ from a peer's refuses that peer (see the registry).
const (
	// ABIVersion changes whenever a shared-memory layout below changes.
	// Version 2 added the header's wake word; version 3 the PID namespace
	// of a rank and of a lane's owner, and the rank's counters block;
	// version 4 a Piece's parts: Desc.Parts and Desc.PartEnds, and the part
	// words of a slot's ready line (ReadyWord.Parts); version 5 the lane's
	// open word (RelayProgress.OpenEpoch), without which a sender takes no
	// ticket, and a rank's liveness lock on its control file; version 6
	// moved each lane's words out of the control file into two memory
	// objects per claim that the relay hands to the lane's holder alone
	// (LaneSenderBlock, LaneRelayBlock), left a relay-written summary of
	// each lane in their place (LaneSummary) and dropped the header's wake
	// word for an eventfd per lane.
	ABIVersion = 6

	// LaneCount is the number of inbound lanes of a relay: one per other
	// local rank, none for itself.
	LaneCount = 7
	// SlotsPerLane is K, the ring depth of a lane. It is not a power of two:
	// the slot of a sequence number is always computed with %, never a mask.
	SlotsPerLane = 18
	// SlotSize is S, the largest Piece.
	SlotSize = 8 << 20
	// LaneBytes is the staging memory of one lane.
	LaneBytes = SlotsPerLane * SlotSize
	// ArenaSize is derived only; nothing configures it.
	ArenaSize = LaneCount * LaneBytes

	// MaxPlans is the most plan entries one Piece carries.
	MaxPlans = 4096
	// MaxSession is the longest target session name in bytes.
	MaxSession = 256
	// MaxParts is the most parts a Piece is copied and forwarded in: the
	// relay may forward part p once the sender's copier signalled it, while
	// the later parts are still being copied (Desc.Parts, ReadyWord.Parts).
	MaxParts = 8

	// CacheLine is the alignment of every shared structure and of every word
	// that one side polls while the other writes.
	CacheLine = 64

	// MaxPid bounds every pid read from shared memory: Linux never hands
	// out a pid above 2^22 (PID_MAX_LIMIT on 64-bit kernels).
	MaxPid = 1 << 22

	// RegistryMagic opens every control file ("PXNREG01" little endian).
	RegistryMagic = 0x31304745524e5850
)

// Rank states stored in Header.State.
const (
	StateInit    = 1
	StateReady   = 2
	StateClosing = 3
)

// Ways to map a rank's arena, or-ed in Header.ArenaShares.
const (
	// ShareIPCHandle: Header.IPCHandle holds the handle ArenaProvider.Open
	// maps (a shm file name, or a legacy CUDA IPC handle, which opens only
	// inside one PID namespace).
	ShareIPCHandle = 1
	// ShareFD: the rank hands a descriptor of its whole arena to the
	// holder of one of its lanes, over its unix socket in the group folder
	// (SCM_RIGHTS). Retired: every holder would map every lane, so no rank
	// offers it and none maps an arena that offers nothing else; a header
	// that carries it is still well-formed.
	ShareFD = 2
	// ShareLaneFD: the rank hands the holder of lane i a descriptor of
	// lane i's staging memory alone, over the same socket; the holder maps
	// LaneBytes and nothing of the other lanes.
	ShareLaneFD = 4
)

// Arena kinds stored in Header.ArenaKind.
const (
	ArenaHost = 1
	ArenaCUDA = 2
)

// Completion statuses written by a relay.
const (
	CompletionOK           = 0
	CompletionInvalidDesc  = -1
	CompletionSecondHop    = -2
	CompletionUnresolved   = -3
	CompletionRelayClosing = -4
	// CompletionTimeout: a second-hop write of the Piece timed out.
	CompletionTimeout = -5
)

// PlanEntry is one piece of a Piece: Len bytes of the slot, in order, go to
// Dst in the target's address space.
type PlanEntry struct {
	Dst uint64
	Len uint64
}

// Desc describes the Piece staged in one slot. The sender writes every field
// first and release-stores CommitSeq last; the relay reads CommitSeq with
// acquire and trusts nothing else until it matches the seq it expects.
type Desc struct {
	CommitSeq  uint64
	Epoch      uint64
	PieceLen   uint64
	PlanCount  uint32
	SessionLen uint32
	// Parts is how many parts the Piece is copied in (0 or 1: one, whose
	// end only the doorbell signals). PartEnds[p], for p < Parts-1, is the
	// number of plan entries in parts 0..p: part p is the entries
	// [PartEnds[p-1], PartEnds[p]) and the slot bytes they occupy; the last
	// part ends with the plan.
	Parts    uint32
	PartEnds [MaxParts - 1]uint32
	Session  [MaxSession]byte
	Plans    [MaxPlans]PlanEntry
}

// Completion is the relay's answer for one slot: Status first, then Seq
// release-stored.
type Completion struct {
	Seq    uint64
	Status int32
	_      [52]byte
}

// ReadyWord is a slot's doorbell. The sender's copy engine (or the sender's
// pump) stores the Piece's seq into Seq after the copy into the slot; each
// word has its own cache line so that two doorbells in flight never share
// one. For a Piece of several parts (Desc.Parts), the sender's copier may
// also store seq into Parts[p] once part p is in the slot, before the whole
// copy ends; Seq, the doorbell, says every part is. The line has one writer
// at a time, the copy of the seq that holds the slot, so its words share it.
type ReadyWord struct {
	Seq   uint64
	Parts [MaxParts - 1]uint64
}

// LaneOwner names the sender that holds a lane. It is written only under the
// registry lock, at claim and release.
type LaneOwner struct {
	Pid         uint64
	StartTime   uint64
	SenderEpoch uint64
	// LaneEpoch is the ring's epoch: it changes when the lane is claimed
	// anew and when a sequence number would wrap. Desc.Epoch must match it.
	LaneEpoch uint64
	ClaimedAt uint64
	// PidNSDev and PidNSIno name the owner's PID namespace (PidNS).
	PidNSDev uint64
	PidNSIno uint64
	_        [8]byte
}

// SenderProgress is written only by the lane's sender and read by inspect.
type SenderProgress struct {
	NextSeq      uint64
	PublishedSeq uint64
	ReapedSeq    uint64
	_            [40]byte
}

// RelayProgress is written only by the relay.
type RelayProgress struct {
	CompletedSeq uint64
	// OpenEpoch is the lane epoch whose ring the relay has opened: every
	// second-hop write of the lane's earlier epochs is final and the ring's
	// words are reset. A sender writes no slot of an epoch until it reads
	// that epoch here (RelayLane.Open, SenderLane.Ticket).
	OpenEpoch uint64
	_         [48]byte
}

// RelayWake is the relay's sleeping flag as one lane's holder sees it: the
// relay's pump stores 1 before it may sleep and 0 once it runs again, and
// the holder writes its lane's eventfd after a Publish only while it reads
// 1 (EventWaiter, LaneWaker).
type RelayWake struct {
	Sleeping uint32
	_        [60]byte
}

// LaneSenderBlock is the part of one claim of a lane that its holder
// writes: one memory object per claim, made by the relay and handed to
// the holder alone, mapped read-write by both. The relay reads it as
// untrusted.
type LaneSenderBlock struct {
	Sender SenderProgress
	Ready  [SlotsPerLane]ReadyWord
	Descs  [SlotsPerLane]Desc
}

// LaneRelayBlock is the part of one claim of a lane that the relay alone
// writes: one memory object per claim, sealed so that its holder can map
// it read-only and nothing else.
type LaneRelayBlock struct {
	Relay       RelayProgress
	Wake        RelayWake
	Completions [SlotsPerLane]Completion
}

// LaneSummary is a lane as the relay records it in its control file: the
// owner words of the current claim (the relay's record, not a capability)
// and a copy of the claim's progress words, which the relay refreshes with
// its heartbeat for inspect. Only the relay writes it.
type LaneSummary struct {
	Owner  LaneOwner
	Sender SenderProgress
	Relay  RelayProgress
}

// Header opens a rank's control file. Everything but Heartbeat and State
// is written before the rank is published READY and never changes
// afterwards.
type Header struct {
	Magic        uint64
	ABIVersion   uint32
	HeaderSize   uint32
	State        uint32
	UID          uint32
	Pid          uint64
	StartTime    uint64
	BootEpoch    uint64
	LaneCount    uint32
	SlotsPerLane uint32
	SlotSize     uint64
	ArenaSize    uint64
	ArenaKind    uint32
	RailLen      uint32
	Rail         [48]byte
	HCALen       uint32
	// ArenaShares says how a peer may map the arena (ShareIPCHandle,
	// ShareFD, ShareLaneFD, or several).
	ArenaShares uint32
	HCA         [56]byte
	IPCHandle   [64]byte
	Heartbeat   uint64
	// The last 64 bytes were the wake word of versions 2 to 5.
	_ [120]byte
	// PidNSDev and PidNSIno name the PID namespace Pid and StartTime
	// belong to (PidNS).
	PidNSDev uint64
	PidNSIno uint64
	_        [48]byte
}

// LoadState acquire-loads the rank's state.
func (h *Header) LoadState() uint32 { return atomic.LoadUint32(&h.State) }

// StoreState release-stores the rank's state; only the owning rank calls it.
func (h *Header) StoreState(s uint32) { atomic.StoreUint32(&h.State, s) }

// LoadHeartbeat acquire-loads the rank's heartbeat, a MonoNanos reading.
func (h *Header) LoadHeartbeat() uint64 { return atomic.LoadUint64(&h.Heartbeat) }

// StoreHeartbeat release-stores the heartbeat; only the owning rank calls it.
func (h *Header) StoreHeartbeat(now uint64) { atomic.StoreUint64(&h.Heartbeat, now) }

// Fallback reasons: the index of a Piece's counts in RankStats'
// FallbackBytes and FallbackPieces, the cause for which a Piece meant for a
// relay went direct before its doorbell.
const (
	// FallbackCreditTimeout: the lane had no credit for longer than the
	// credit timeout.
	FallbackCreditTimeout = iota
	// FallbackRelayStale: the relay's heartbeat went stale.
	FallbackRelayStale
	// FallbackRelayGone: the relay closed, exited or restarted (a new
	// epoch) while the Piece was queued for it.
	FallbackRelayGone
	// FallbackLaneBroken: the lane was quarantined after a first-hop copy
	// or doorbell failure.
	FallbackLaneBroken
	// FallbackSourceEvent: the source-ready event could not be recorded.
	FallbackSourceEvent
	// FallbackNoLane: the lane would not take the Piece (closed, or not
	// attached).
	FallbackNoLane
	// FallbackOther is any other cause.
	FallbackOther
	// FallbackReasons is the number of reasons; RankStats has room for 8.
	FallbackReasons
)

// RankStats are a rank's engine counters as its pump last published them,
// at most once a heartbeat, for readers outside the process (the node
// agent's metrics, inspect). Every count is a running total since the
// rank registered. The pump is the only writer; Gen is a sequence lock:
// odd while the pump writes, so a reader copies the block between two
// equal, even loads of Gen and retries otherwise. Device is written once,
// before the rank is published READY.
type RankStats struct {
	Gen       uint64
	UpdatedAt uint64
	// RelayedBytes and RelayedPieces: this rank's Pieces that a relay
	// staged and completed.
	RelayedBytes  uint64
	RelayedPieces uint64
	// ForwardedBytes and ForwardedPieces: Pieces this rank relayed for
	// others.
	ForwardedBytes  uint64
	ForwardedPieces uint64
	// DirectBytes went direct at classification (same rail, no relay).
	DirectBytes       uint64
	FailedPieces      uint64
	SecondHopFailures uint64
	InvalidDescs      uint64
	CreditWaits       uint64
	LaneQuarantines   uint64
	// PumpCPUNanos is the CPU time the pump's thread has used.
	PumpCPUNanos uint64
	// OutboundLanes are the lanes this rank holds on relays; InboundLanes
	// the lanes of its own that senders hold.
	OutboundLanes uint32
	InboundLanes  uint32
	// FallbackBytes and FallbackPieces, by reason (FallbackCreditTimeout
	// and the rest).
	FallbackBytes  [8]uint64
	FallbackPieces [8]uint64
	// Device names the memory the rank's arena lives in: a GPU's UUID or
	// PCI bus id, or "host".
	DeviceLen uint32
	_         uint32
	Device    [48]byte
	_         [88]byte
}

// ControlBlock is the whole control file of one rank. It holds no word of
// a lane's ring: those are in the lane's blocks (LaneSenderBlock,
// LaneRelayBlock).
type ControlBlock struct {
	Header Header
	Stats  RankStats
	Lanes  [LaneCount]LaneSummary
}

// ControlSize is the size of a control file.
const ControlSize = unsafe.Sizeof(ControlBlock{})

// SenderBlockSize and RelayBlockSize are the sizes of a lane's blocks.
const (
	SenderBlockSize = unsafe.Sizeof(LaneSenderBlock{})
	RelayBlockSize  = unsafe.Sizeof(LaneRelayBlock{})
)

// SlotOf returns the slot of sequence number seq (seq ≥ 1). K is not a power
// of two, so this is a modulo, never a mask.
func SlotOf(seq uint64) int { return int((seq - 1) % SlotsPerLane) }

// LaneOffset is the byte offset of lane's staging memory in an arena.
func LaneOffset(lane int) uint64 { return uint64(lane) * LaneBytes }

// SlotOffset is the byte offset of a slot's staging memory in an arena.
func SlotOffset(lane, slot int) uint64 { return LaneOffset(lane) + uint64(slot)*SlotSize }

// Compile-time layout checks: a failing line here is a negative array length.
// The C header include/pxn_abi.h mirrors every size and offset, and a test
// compiles it against these values.
var (
	_ [unsafe.Sizeof(PlanEntry{}) - 16]struct{}
	_ [16 - unsafe.Sizeof(PlanEntry{})]struct{}
	_ [unsafe.Sizeof(Completion{}) - CacheLine]struct{}
	_ [CacheLine - unsafe.Sizeof(Completion{})]struct{}
	_ [unsafe.Sizeof(ReadyWord{}) - CacheLine]struct{}
	_ [CacheLine - unsafe.Sizeof(ReadyWord{})]struct{}
	_ [unsafe.Sizeof(LaneOwner{}) - CacheLine]struct{}
	_ [CacheLine - unsafe.Sizeof(LaneOwner{})]struct{}
	_ [unsafe.Sizeof(SenderProgress{}) - CacheLine]struct{}
	_ [CacheLine - unsafe.Sizeof(SenderProgress{})]struct{}
	_ [unsafe.Sizeof(RelayProgress{}) - CacheLine]struct{}
	_ [CacheLine - unsafe.Sizeof(RelayProgress{})]struct{}
	_ [unsafe.Offsetof(Desc{}.Session) - 64]struct{}
	_ [64 - unsafe.Offsetof(Desc{}.Session)]struct{}
	_ [-(unsafe.Sizeof(Desc{}) % CacheLine)]struct{}
	_ [unsafe.Sizeof(Desc{}) - (64 + MaxSession + 16*MaxPlans)]struct{}
	_ [unsafe.Sizeof(WakeWord{}) - CacheLine]struct{}
	_ [CacheLine - unsafe.Sizeof(WakeWord{})]struct{}
	_ [unsafe.Sizeof(Header{}) - 448]struct{}
	_ [448 - unsafe.Sizeof(Header{})]struct{}
	_ [unsafe.Offsetof(Header{}.PidNSDev) - 384]struct{}
	_ [384 - unsafe.Offsetof(Header{}.PidNSDev)]struct{}
	_ [unsafe.Offsetof(Header{}.Heartbeat) - 256]struct{}
	_ [256 - unsafe.Offsetof(Header{}.Heartbeat)]struct{}
	_ [-(unsafe.Offsetof(Header{}.IPCHandle) % CacheLine)]struct{}
	_ [unsafe.Sizeof(RelayWake{}) - CacheLine]struct{}
	_ [CacheLine - unsafe.Sizeof(RelayWake{})]struct{}
	_ [-(unsafe.Sizeof(LaneSummary{}) % CacheLine)]struct{}
	_ [-(unsafe.Sizeof(LaneSenderBlock{}) % CacheLine)]struct{}
	_ [-(unsafe.Sizeof(LaneRelayBlock{}) % CacheLine)]struct{}
	_ [-(unsafe.Offsetof(ControlBlock{}.Lanes) % CacheLine)]struct{}
	_ [-(unsafe.Offsetof(LaneSenderBlock{}.Ready) % CacheLine)]struct{}
	_ [-(unsafe.Offsetof(LaneSenderBlock{}.Descs) % CacheLine)]struct{}
	_ [-(unsafe.Offsetof(LaneRelayBlock{}.Completions) % CacheLine)]struct{}
	_ [unsafe.Sizeof(RankStats{}) - 384]struct{}
	_ [384 - unsafe.Sizeof(RankStats{})]struct{}
	_ [8 - FallbackReasons]struct{}
	_ [ArenaSize - 1008<<20]struct{}
	_ [1008<<20 - ArenaSize]struct{}
)
