// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// HostArenas provides arenas in host memory, for machines without CUDA.
//
// An arena is LaneCount memfds, one a lane, each sized to LaneBytes and
// then sealed against shrinking and growing (arenaSeals), mapped side by
// side into one reservation of ArenaSize so the owner sees one arena. It
// is shared with peers only by descriptor, one lane at a time, through the
// owner's arena socket: it has no handle and no file in the registry
// directory. A peer maps a descriptor only when it carries those seals and
// is one lane long, so no process, the owner included, can take the
// memory from under a mapping, and no peer maps another's lane.
//
// With ByName, an arena is instead a 0600 file of the registry directory,
// allocated at its full size when created, whose handle is its name. A
// named tmpfs file cannot be sealed: a process of the group's uid can
// truncate it, and a peer that maps it takes SIGBUS at its next touch;
// and every peer maps every lane. A rank maps a peer's arena by name only
// when its own HostArenas has ByName set.
type HostArenas struct {
	ByName bool
}

// arenaSeals are the seals a host arena carries and a peer demands of a
// descriptor it maps: its size never changes, and no seal can be added or
// removed any more.
const arenaSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

var (
	_ staging.ArenaProvider       = HostArenas{}
	_ staging.LaneFDArenaProvider = HostArenas{}
	_ staging.LaneRenewer         = (*memfdArena)(nil)
)

// Kind returns ArenaHost.
func (HostArenas) Kind() uint32 { return staging.ArenaHost }

// Allocate creates and maps an arena: sealed memfds called after name, or
// with ByName the file name in dir.
func (p HostArenas) Allocate(dir *os.File, name string) (staging.Arena, error) {
	if k, _ := folder.ParseEntryName(name); k != folder.EntryArena {
		return nil, fmt.Errorf("host arena: %q is not an arena name", name)
	}
	if !p.ByName {
		a, err := newMemfdArena(name)
		if err != nil {
			return nil, fmt.Errorf("host arena: %w", err)
		}
		return a, nil
	}
	dirfd := int(dir.Fd())
	fd, err := folder.CreatePrivate(dirfd, dir.Name(), name)
	if err != nil {
		return nil, fmt.Errorf("host arena: %w", err)
	}
	a, err := newFileArena(dirfd, dir.Name(), name, fd)
	unix.Close(fd)
	if err != nil {
		unix.Unlinkat(dirfd, name, 0)
		return nil, fmt.Errorf("host arena: %w", err)
	}
	return a, nil
}

func newMemfdArena(name string) (*memfdArena, error) {
	// The reservation holds the arena's addresses until every lane is
	// mapped over it; nothing is ever read through it.
	res, err := unix.Mmap(-1, 0, staging.ArenaSize, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserve %d bytes for arena %s: %w", uint64(staging.ArenaSize), name, err)
	}
	a := &memfdArena{name: name, mem: res}
	for i := range a.fds {
		a.fds[i] = -1
	}
	for i := range a.fds {
		if err := a.mapLane(i); err != nil {
			a.free()
			return nil, err
		}
	}
	return a, nil
}

// mapLane creates lane i's memfd and maps it at its place in the
// reservation.
func (a *memfdArena) mapLane(i int) error {
	name := laneMemfdName(a.name, i)
	fd, err := newSealedMemfd(name, staging.LaneBytes, arenaSeals)
	if err != nil {
		return err
	}
	a.fds[i] = fd
	at := unsafe.Pointer(&a.mem[staging.LaneOffset(i)])
	if _, err := unix.MmapPtr(fd, 0, at, staging.LaneBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
		return fmt.Errorf("mmap memfd %s into its arena: %w", name, err)
	}
	return nil
}

// laneMemfdName is the memfd name of lane i of arena name, which
// /proc/<pid>/maps shows.
func laneMemfdName(name string, lane int) string {
	return name + ".lane" + strconv.Itoa(lane)
}

// newMemfd makes a memfd of size bytes, 0600 whatever the umask, that
// can take seals. Its pages come at first touch from the kernel's own
// shmem mount, which has no size limit, so no full tmpfs can fail them (a
// shortage of memory is the pod's OOM, not a SIGBUS); a NIC registration
// of an arena takes them all at once.
func newMemfd(name string, size int64) (int, error) {
	// A node with vm.memfd_noexec=2 refuses a memfd that could be made
	// executable; a kernel before 6.3 knows no MFD_NOEXEC_SEAL.
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_NOEXEC_SEAL)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return -1, fmt.Errorf("memfd_create %s: %w", name, err)
	}
	if err := unix.Fchmod(fd, folder.FilePerm); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("chmod memfd %s: %w", name, err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("size memfd %s to %d bytes: %w", name, size, err)
	}
	return fd, nil
}

// newSealedMemfd is newMemfd sealed with seals before any other process
// can hold it.
func newSealedMemfd(name string, size int64, seals int) (int, error) {
	fd, err := newMemfd(name, size)
	if err != nil {
		return -1, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("seal memfd %s %s: %w", name, sealNames(seals), err)
	}
	return fd, nil
}

// checkSealedFD accepts a descriptor from another process only as a
// regular file of this uid that nobody else may access, carrying at least
// seals (so a memfd: nothing else takes seals), exactly size bytes long,
// the size read again under the seals (the one read before them may have
// changed since). what names the descriptor's use in the errors, unit what
// size is ("one lane").
func checkSealedFD(what string, fd int, seals int, size int64, unit string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: fstat descriptor %d: %w", what, fd, err)
	}
	if p := folder.PrivateProblem(&st, os.Geteuid(), unix.S_IFREG); p != "" {
		return fmt.Errorf("%s: descriptor %d %s", what, fd, p)
	}
	got, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("%s: descriptor %d refused: no seals (not a memfd): %w", what, fd, err)
	}
	if got&seals != seals {
		return fmt.Errorf("%s: descriptor %d refused: sealed %s, want %s: without them it may change under its mapping", what, fd, sealNames(got), sealNames(seals))
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: fstat descriptor %d: %w", what, fd, err)
	}
	if st.Size != size {
		return fmt.Errorf("%s: descriptor %d refused: a file of %d bytes, want %s of %d", what, fd, st.Size, unit, size)
	}
	return nil
}

func newFileArena(dirfd int, dirPath, name string, fd int) (*fileArena, error) {
	path := filepath.Join(dirPath, name)
	if err := folder.Allocate(fd, dirPath, name, staging.ArenaSize); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, staging.ArenaSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	// The arena unlinks its file when it closes, whoever closed the
	// registry directory by then: it keeps a descriptor of its own.
	own, err := unix.FcntlInt(uintptr(dirfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Munmap(mem)
		return nil, &os.PathError{Op: "dup", Path: dirPath, Err: err}
	}
	return &fileArena{dirfd: own, path: path, name: name, mem: mem}, nil
}

// Open maps the peer arena whose file name is in handle, with ByName; a
// HostArenas without it refuses every named arena.
func (p HostArenas) Open(dir *os.File, handle [staging.ArenaHandleSize]byte) (staging.PeerArena, error) {
	name, err := hostHandleName(handle)
	if err != nil {
		return nil, err
	}
	if !p.ByName {
		return nil, fmt.Errorf("host arena %s: refused: a named arena cannot be sealed and may shrink under its mapping; this rank maps host arenas by sealed descriptor only", name)
	}
	mem, err := folder.MapPrivate(int(dir.Fd()), dir.Name(), name, os.Geteuid(), staging.ArenaSize, true)
	if err != nil {
		return nil, fmt.Errorf("host arena: %w", err)
	}
	return &hostPeerArena{mem: mem, lane: -1}, nil
}

// OpenLaneFD maps lane of a peer's arena from the descriptor fd. The
// descriptor came from another process: it must be a regular file of this
// uid that nobody else may access, sealed with arenaSeals, exactly
// LaneBytes long.
func (HostArenas) OpenLaneFD(fd int, lane int) (staging.PeerLane, error) {
	if lane < 0 || lane >= staging.LaneCount {
		return nil, fmt.Errorf("host arena: lane %d out of range 0..%d", lane, staging.LaneCount-1)
	}
	if err := checkSealedFD(fmt.Sprintf("host arena lane %d", lane), fd, arenaSeals, staging.LaneBytes, "one lane"); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, staging.LaneBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("host arena lane %d: mmap descriptor %d: %w", lane, fd, err)
	}
	return &hostPeerArena{mem: mem, lane: lane}, nil
}

// sealNames spells a set of file seals, "none" for none.
func sealNames(seals int) string {
	var names []string
	for _, s := range [...]struct {
		bit  int
		name string
	}{
		{unix.F_SEAL_SEAL, "seal"}, {unix.F_SEAL_SHRINK, "shrink"}, {unix.F_SEAL_GROW, "grow"},
		{unix.F_SEAL_WRITE, "write"}, {unix.F_SEAL_FUTURE_WRITE, "future-write"}, {unix.F_SEAL_EXEC, "exec"},
	} {
		if seals&s.bit != 0 {
			names = append(names, s.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "|")
}

// hostHandleName accepts only a NUL-padded canonical arena name: a handle
// from shared memory never names anything outside the registry directory.
func hostHandleName(h [staging.ArenaHandleSize]byte) (string, error) {
	n := bytes.IndexByte(h[:], 0)
	if n < 0 {
		n = len(h)
	}
	name := string(h[:n])
	if bytes.IndexFunc(h[n:], func(r rune) bool { return r != 0 }) >= 0 {
		return "", fmt.Errorf("%w: host arena handle has bytes after its name", ErrCorruptEntry)
	}
	if k, _ := folder.ParseEntryName(name); k != folder.EntryArena {
		return "", fmt.Errorf("%w: host arena handle %q is not an arena name", ErrCorruptEntry, name)
	}
	return name, nil
}

// memfdArena is one sealed memfd a lane, mapped contiguously in mem; the
// descriptors stay open for ExportLaneFD. A lane's memfd is replaced by
// Install of a NewLaneMemory; mu guards fds and closed.
type memfdArena struct {
	fds  [staging.LaneCount]int
	name string
	mem  []byte

	mu     sync.Mutex
	closed bool
}

func (a *memfdArena) Kind() uint32  { return staging.ArenaHost }
func (a *memfdArena) Base() uintptr { return uintptr(unsafe.Pointer(&a.mem[0])) }
func (a *memfdArena) Size() uint64  { return uint64(len(a.mem)) }

// Export fails with staging.ErrNoHandle: the arena goes by descriptor only.
func (a *memfdArena) Export() ([staging.ArenaHandleSize]byte, error) {
	return [staging.ArenaHandleSize]byte{}, fmt.Errorf("host arena %s: a memfd is shared by descriptor: %w", a.name, staging.ErrNoHandle)
}

// ExportLaneFD returns a new descriptor of lane's memfd.
func (a *memfdArena) ExportLaneFD(lane int) (int, error) {
	if lane < 0 || lane >= staging.LaneCount {
		return -1, fmt.Errorf("host arena %s: lane %d out of range 0..%d", a.name, lane, staging.LaneCount-1)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return -1, fmt.Errorf("host arena %s: closed", a.name)
	}
	fd, err := unix.FcntlInt(uintptr(a.fds[lane]), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("host arena %s lane %d: dup: %w", a.name, lane, err)
	}
	return fd, nil
}

// NewLaneMemory makes a new sealed memfd for lane, named as the lane's
// first one.
func (a *memfdArena) NewLaneMemory(lane int) (staging.LaneMemory, error) {
	if lane < 0 || lane >= staging.LaneCount {
		return nil, fmt.Errorf("host arena %s: lane %d out of range 0..%d", a.name, lane, staging.LaneCount-1)
	}
	fd, err := newSealedMemfd(laneMemfdName(a.name, lane), staging.LaneBytes, arenaSeals)
	if err != nil {
		return nil, fmt.Errorf("host arena %s: %w", a.name, err)
	}
	return &memfdLane{a: a, lane: lane, fd: fd}, nil
}

// memfdLane is a new memfd for one lane of a memfdArena; fd is its own
// until Install gives it to the arena, -1 afterwards.
type memfdLane struct {
	a    *memfdArena
	lane int
	mu   sync.Mutex
	fd   int
}

func (m *memfdLane) ExportFD() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fd < 0 {
		return -1, fmt.Errorf("host arena %s lane %d: the new memory is the arena's or gone", m.a.name, m.lane)
	}
	fd, err := unix.FcntlInt(uintptr(m.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("host arena %s lane %d: dup: %w", m.a.name, m.lane, err)
	}
	return fd, nil
}

// Install maps the memfd over the lane's range of the reservation
// (MAP_FIXED replaces the mapping of the lane's memfd before it, whose
// pages an earlier holder's mapping keeps alone) and closes the earlier
// memfd.
func (m *memfdLane) Install() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.a
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case m.fd < 0:
		return fmt.Errorf("host arena %s lane %d: the new memory was installed or discarded", a.name, m.lane)
	case a.closed:
		return fmt.Errorf("host arena %s: closed", a.name)
	}
	at := unsafe.Pointer(&a.mem[staging.LaneOffset(m.lane)])
	_, err := unix.MmapPtr(m.fd, 0, at, staging.LaneBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED)
	old := a.fds[m.lane]
	a.fds[m.lane], m.fd = m.fd, -1
	if old >= 0 {
		unix.Close(old)
	}
	if err != nil {
		return fmt.Errorf("host arena %s lane %d: mmap its new memfd: %w", a.name, m.lane, err)
	}
	return nil
}

func (m *memfdLane) Discard() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fd < 0 {
		return nil
	}
	err := unix.Close(m.fd)
	m.fd = -1
	return err
}

// Close unmaps the arena and closes the memfds. Peers that still map a
// lane keep its pages: the memory lives until its last mapping goes.
func (a *memfdArena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	if err := a.free(); err != nil {
		return fmt.Errorf("host arena %s: %w", a.name, err)
	}
	return nil
}

// free unmaps the reservation, lanes and all, and closes the memfds made
// so far.
func (a *memfdArena) free() error {
	err := unix.Munmap(a.mem)
	for i, fd := range a.fds {
		if fd >= 0 {
			unix.Close(fd)
			a.fds[i] = -1
		}
	}
	if err != nil {
		return fmt.Errorf("munmap: %w", err)
	}
	return nil
}

// fileArena is an arena file of the registry directory (HostArenas.ByName).
type fileArena struct {
	dirfd int
	path  string
	name  string
	mem   []byte

	mu     sync.Mutex
	closed bool
}

func (a *fileArena) Kind() uint32  { return staging.ArenaHost }
func (a *fileArena) Base() uintptr { return uintptr(unsafe.Pointer(&a.mem[0])) }
func (a *fileArena) Size() uint64  { return uint64(len(a.mem)) }

func (a *fileArena) Export() ([staging.ArenaHandleSize]byte, error) {
	var h [staging.ArenaHandleSize]byte
	if len(a.name) > len(h) {
		return h, fmt.Errorf("host arena: name %q is longer than a handle", a.name)
	}
	copy(h[:], a.name)
	return h, nil
}

// Close unmaps the arena and unlinks its file. Peers that still map it keep
// their pages: a tmpfs file lives until its last mapping goes.
func (a *fileArena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	var errs []error
	if err := unix.Munmap(a.mem); err != nil {
		errs = append(errs, &os.PathError{Op: "munmap", Path: a.path, Err: err})
	}
	if err := unix.Unlinkat(a.dirfd, a.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, &os.PathError{Op: "unlink", Path: a.path, Err: err})
	}
	unix.Close(a.dirfd)
	return errors.Join(errs...)
}

// hostPeerArena is a peer's arena by name (lane -1), or one lane of it.
type hostPeerArena struct {
	mu   sync.Mutex
	mem  []byte
	lane int
}

func (p *hostPeerArena) Base() uintptr { return uintptr(unsafe.Pointer(&p.mem[0])) }
func (p *hostPeerArena) Lane() int     { return p.lane }

func (p *hostPeerArena) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mem == nil {
		return nil
	}
	err := unix.Munmap(p.mem)
	p.mem = nil
	return err
}
