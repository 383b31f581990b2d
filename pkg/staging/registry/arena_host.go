// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// HostArenas provides arenas in host memory, for machines without CUDA: an
// arena is a 0600 file in the registry directory, sized with ftruncate (on
// tmpfs it stays sparse until written) and mapped MAP_SHARED by its owner
// and by its peers at the same offsets. Its handle is its file name; a
// descriptor of the file serves as well (staging.FDArena), and is how a
// peer maps it through the owner's arena socket.
type HostArenas struct{}

var (
	_ staging.ArenaProvider   = HostArenas{}
	_ staging.FDArenaProvider = HostArenas{}
	_ staging.FDArena         = (*hostArena)(nil)
)

// Kind returns ArenaHost.
func (HostArenas) Kind() uint32 { return staging.ArenaHost }

// Allocate creates and maps the arena file name in dir.
func (HostArenas) Allocate(dir *os.File, name string) (staging.Arena, error) {
	if k, _ := folder.ParseEntryName(name); k != folder.EntryArena {
		return nil, fmt.Errorf("host arena: %q is not an arena name", name)
	}
	dirfd := int(dir.Fd())
	fd, err := folder.CreatePrivate(dirfd, dir.Name(), name)
	if err != nil {
		return nil, fmt.Errorf("host arena: %w", err)
	}
	a, err := newHostArena(dirfd, dir.Name(), name, fd)
	if err != nil {
		unix.Close(fd)
		unix.Unlinkat(dirfd, name, 0)
		return nil, fmt.Errorf("host arena: %w", err)
	}
	return a, nil
}

func newHostArena(dirfd int, dirPath, name string, fd int) (*hostArena, error) {
	path := filepath.Join(dirPath, name)
	if err := unix.Ftruncate(fd, staging.ArenaSize); err != nil {
		return nil, &os.PathError{Op: "ftruncate", Path: path, Err: err}
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
	return &hostArena{dirfd: own, fd: fd, path: path, name: name, mem: mem}, nil
}

// Open maps the peer arena whose file name is in handle.
func (HostArenas) Open(dir *os.File, handle [staging.ArenaHandleSize]byte) (staging.PeerArena, error) {
	name, err := hostHandleName(handle)
	if err != nil {
		return nil, err
	}
	mem, err := folder.MapPrivate(int(dir.Fd()), dir.Name(), name, os.Geteuid(), staging.ArenaSize, true)
	if err != nil {
		return nil, fmt.Errorf("host arena: %w", err)
	}
	return &hostPeerArena{mem: mem}, nil
}

// OpenFD maps the peer arena whose file fd refers to. The descriptor came
// from another process: it must be a regular file of this uid that nobody
// else may access, of size bytes, the size of an arena.
func (HostArenas) OpenFD(fd int, size uint64) (staging.PeerArena, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("host arena: fstat descriptor %d: %w", fd, err)
	}
	if p := folder.PrivateProblem(&st, os.Geteuid(), unix.S_IFREG); p != "" {
		return nil, fmt.Errorf("host arena: descriptor %d %s", fd, p)
	}
	if size != staging.ArenaSize || st.Size < int64(size) {
		return nil, fmt.Errorf("host arena: descriptor %d: arena of %d bytes in a file of %d, want %d", fd, size, st.Size, uint64(staging.ArenaSize))
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("host arena: mmap descriptor %d: %w", fd, err)
	}
	return &hostPeerArena{mem: mem}, nil
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

type hostArena struct {
	dirfd int
	// fd is the arena file, kept open for ExportFD.
	fd   int
	path string
	name string
	mem  []byte

	mu     sync.Mutex
	closed bool
}

func (a *hostArena) Kind() uint32  { return staging.ArenaHost }
func (a *hostArena) Base() uintptr { return uintptr(unsafe.Pointer(&a.mem[0])) }
func (a *hostArena) Size() uint64  { return uint64(len(a.mem)) }

func (a *hostArena) Export() ([staging.ArenaHandleSize]byte, error) {
	var h [staging.ArenaHandleSize]byte
	if len(a.name) > len(h) {
		return h, fmt.Errorf("host arena: name %q is longer than a handle", a.name)
	}
	copy(h[:], a.name)
	return h, nil
}

// ExportFD returns a new descriptor of the arena file.
func (a *hostArena) ExportFD() (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return -1, fmt.Errorf("host arena %s: closed", a.path)
	}
	fd, err := unix.FcntlInt(uintptr(a.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "dup", Path: a.path, Err: err}
	}
	return fd, nil
}

// Close unmaps the arena and unlinks its file. Peers that still map it keep
// their pages: a tmpfs file lives until its last mapping goes.
func (a *hostArena) Close() error {
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
	unix.Close(a.fd)
	return errors.Join(errs...)
}

type hostPeerArena struct {
	mu  sync.Mutex
	mem []byte
}

func (p *hostPeerArena) Base() uintptr { return uintptr(unsafe.Pointer(&p.mem[0])) }

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
