// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"errors"
	"os"
)

// ErrNoHandle is wrapped by Arena.Export when the arena has no handle to
// export (a memfd, or cuMem allocations, which legacy CUDA IPC cannot
// share) but can still be shared by descriptor (LaneFDArena): the rank
// then offers ShareLaneFD alone.
var ErrNoHandle = errors.New("arena has no exportable handle")

// ArenaHandleSize is the size of an exported arena handle: the size of a
// cudaIpcMemHandle_t, and the size of Header.IPCHandle.
const ArenaHandleSize = 64

// Arena is a rank's own staging memory of ArenaSize bytes, laid out by
// LaneOffset and SlotOffset.
type Arena interface {
	// Kind is ArenaHost or ArenaCUDA.
	Kind() uint32
	// Base is the arena's address in this process.
	Base() uintptr
	Size() uint64
	// Export returns the handle through which another process of the group
	// maps this arena (ArenaProvider.Open).
	Export() ([ArenaHandleSize]byte, error)
	// Close frees the arena. The registry calls it only when no peer can
	// still reach the memory and no NIC registration remains.
	Close() error
}

// PeerArena is another rank's arena mapped into this process.
type PeerArena interface {
	Base() uintptr
	Close() error
}

// ArenaProvider allocates arenas and maps those of peers. dir is the
// group's registry directory; a provider whose memory lives elsewhere (CUDA)
// ignores it and the name.
type ArenaProvider interface {
	Kind() uint32
	// Allocate creates an arena; name is unique to this registration.
	Allocate(dir *os.File, name string) (Arena, error)
	// Open maps a peer's arena from the handle it exported. The handle comes
	// from shared memory: it is untrusted input.
	Open(dir *os.File, handle [ArenaHandleSize]byte) (PeerArena, error)
}

// MemoryRegistrar registers an arena with the local NIC (RDMA memory
// regions), one lane at a time: the registry calls Register(base, size)
// with each lane's range (LaneOffset, LaneBytes) when the arena is made,
// and Deregister with the same range before the lane's memory goes: when
// the arena is freed, or when the lane is given new memory
// (LaneRenewer), which the registry registers again at the same range.
// A lane is deregistered for its renewal only once no second-hop write
// that read it can still be held by the NIC. A Register or Deregister
// that fails may have left part of the memory registered with no way to
// prove otherwise, so the registry then quarantines the arena: it is
// never freed, and stays allocated until the process exits.
type MemoryRegistrar interface {
	Register(base uintptr, size uint64) error
	Deregister(base uintptr, size uint64) error
}

// LaneFDArena is an Arena made of one memory object per lane, laid out
// contiguously in its owner's address space (so Base, LaneOffset and
// SlotOffset hold as for any arena), each of which it can hand out as a
// file descriptor on its own. The registry passes the holder of lane i
// the descriptor of lane i alone, over the rank's arena socket, and sets
// ShareLaneFD in its header: no member maps another's staging memory.
type LaneFDArena interface {
	// ExportLaneFD returns a new close-on-exec descriptor of lane's
	// memory, LaneBytes long. The caller owns it and closes it once sent.
	ExportLaneFD(lane int) (int, error)
}

// LaneRenewer is a LaneFDArena that can give a lane a new memory object,
// so that a lane's later holder stages into memory that no earlier
// holder's descriptor or mapping reaches. The registry makes the new
// memory when it grants a lane that was granted before, hands the new
// holder its descriptor, and installs it in the arena once no second-hop
// write still reads the lane.
type LaneRenewer interface {
	LaneFDArena
	// NewLaneMemory makes a memory object of LaneBytes for lane, outside
	// the arena's view until Install.
	NewLaneMemory(lane int) (LaneMemory, error)
}

// LaneMemory is a new memory object for one lane of a LaneRenewer.
type LaneMemory interface {
	// ExportFD returns a new close-on-exec descriptor of the memory; the
	// caller owns it.
	ExportFD() (int, error)
	// Install maps the memory at its lane's place in the arena, where
	// Base+LaneOffset(lane) now reaches it, and lets the lane's memory
	// before it go (what an earlier holder still maps lives on for that
	// holder alone). The caller guarantees that nothing reads or writes
	// the lane's range meanwhile and that no NIC registration covers it.
	// After a failure the lane's range may hold no memory at all: the
	// lane must not be used again. Install runs at most once; the arena
	// owns the memory from its start.
	Install() error
	// Discard frees memory never installed; after Install it does nothing.
	Discard() error
}

// PeerLane is one lane of another rank's arena mapped into this process:
// LaneBytes of staging memory from Base, slot s at Base + s*SlotSize.
// Nothing of the arena's other lanes is mapped.
type PeerLane interface {
	PeerArena
	// Lane is the index of the lane in the peer's arena.
	Lane() int
}

// LaneFDArenaProvider is an ArenaProvider that can map one lane of a
// peer's arena from the descriptor the peer sent
// (LaneFDArena.ExportLaneFD).
type LaneFDArenaProvider interface {
	// OpenLaneFD maps the LaneBytes of lane fd refers to. The descriptor
	// comes from another process: untrusted input. OpenLaneFD does not
	// take ownership of fd; the caller closes it after OpenLaneFD returns.
	OpenLaneFD(fd int, lane int) (PeerLane, error)
}
