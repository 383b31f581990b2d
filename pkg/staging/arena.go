// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"errors"
	"os"
)

// ErrNoHandle is wrapped by Arena.Export when the arena has no handle to
// export (a cuMem allocation, which legacy CUDA IPC cannot share) but can
// still be shared by descriptor (FDArena): the rank then offers ShareFD
// alone.
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

// MemoryRegistrar registers an arena with the local NIC (an RDMA memory
// region). A Register that fails may have left part of the memory registered
// with no way to prove otherwise, so the registry then quarantines the
// arena: it is never freed, and stays allocated until the process exits.
type MemoryRegistrar interface {
	Register(base uintptr, size uint64) error
	Deregister(base uintptr, size uint64) error
}

// FDArena is an Arena that can hand out a file descriptor of its memory (a
// shm file, a cuMem allocation exported as a POSIX descriptor), so that a
// peer in another PID namespace can map it: the registry passes the
// descriptor over the rank's arena socket (SCM_RIGHTS) to the holder of one
// of its lanes, and sets ShareFD in its header.
type FDArena interface {
	// ExportFD returns a new descriptor of the arena's memory, close-on-exec.
	// The caller owns it and closes it once sent.
	ExportFD() (int, error)
}

// FDArenaProvider is an ArenaProvider that can map a peer's arena from a
// descriptor the peer sent (FDArena.ExportFD).
type FDArenaProvider interface {
	// OpenFD maps size bytes of the arena fd refers to. The descriptor and
	// size come from another process: untrusted input. OpenFD does not take
	// ownership of fd; the caller closes it after OpenFD returns.
	OpenFD(fd int, size uint64) (PeerArena, error)
}
