// SPDX-License-Identifier: Apache-2.0

package folder

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/staging"
	"golang.org/x/sys/unix"
)

const (
	DirPerm   = 0o700
	FilePerm  = 0o600
	OpenFlags = unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK
)

// UnsafeError reports a registry directory or file that PXN refuses to use:
// a symlink, something of another uid, or something others may read or
// write. The process keeps PXN off and sends direct.
type UnsafeError struct {
	Path    string
	Problem string
}

func (e *UnsafeError) Error() string {
	return "pxn registry: " + e.Path + " " + e.Problem + "; PXN off, sending direct"
}

// CheckPrivate accepts only an object of type wantType (S_IFDIR or S_IFREG)
// that uid owns and nobody else may access. wantType 0 accepts any type but
// a symlink.
func CheckPrivate(path string, st *unix.Stat_t, uid int, wantType uint32) error {
	if p := PrivateProblem(st, uid, wantType); p != "" {
		return &UnsafeError{Path: path, Problem: p}
	}
	return nil
}

// PrivateProblem is CheckPrivate without the path: the problem, or "" for
// a private object. It allocates only when there is a problem.
func PrivateProblem(st *unix.Stat_t, uid int, wantType uint32) string {
	t := st.Mode & unix.S_IFMT
	perm := uint32(FilePerm)
	if t == unix.S_IFDIR {
		perm = DirPerm
	}
	switch {
	case t == unix.S_IFLNK:
		return "is a symlink"
	case wantType != 0 && t != wantType:
		return fmt.Sprintf("is not a %s (file type %#o)", typeName(wantType), t)
	case int(st.Uid) != uid:
		return fmt.Sprintf("is owned by uid %d, not %d", st.Uid, uid)
	case st.Mode&0o077 != 0:
		return fmt.Sprintf("has mode %04o, wider than %04o", st.Mode&0o7777, perm)
	}
	return ""
}

func typeName(t uint32) string {
	if t == unix.S_IFDIR {
		return "directory"
	}
	return "regular file"
}

// ExplainOpenError turns the error of an O_NOFOLLOW open into an
// UnsafeError when name is a symlink or of the wrong type.
func ExplainOpenError(dirfd int, path, name string, wantType uint32, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENXIO) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if uerr := CheckPrivate(path, &st, int(st.Uid), wantType); uerr != nil {
				return uerr
			}
		}
	}
	return &os.PathError{Op: "open", Path: path, Err: err}
}

// OpenPrivate opens name in dirfd without following a symlink and checks
// the open file, not the name, so nothing can be swapped in between.
func OpenPrivate(dirfd int, dirPath, name string, flags int, uid int) (int, unix.Stat_t, error) {
	path := filepath.Join(dirPath, name)
	fd, err := unix.Openat(dirfd, name, flags|OpenFlags, FilePerm)
	if err != nil {
		return -1, unix.Stat_t{}, ExplainOpenError(dirfd, path, name, unix.S_IFREG, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if err := CheckPrivate(path, &st, uid, unix.S_IFREG); err != nil {
		unix.Close(fd)
		return -1, st, err
	}
	return fd, st, nil
}

// CreatePrivate creates name exclusively with mode 0600 whatever the umask.
func CreatePrivate(dirfd int, dirPath, name string) (int, error) {
	path := filepath.Join(dirPath, name)
	fd, err := unix.Openat(dirfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|OpenFlags, FilePerm)
	if err != nil {
		return -1, &os.PathError{Op: "create", Path: path, Err: err}
	}
	if err := unix.Fchmod(fd, FilePerm); err != nil {
		unix.Close(fd)
		unix.Unlinkat(dirfd, name, 0)
		return -1, &os.PathError{Op: "chmod", Path: path, Err: err}
	}
	return fd, nil
}

// MapPrivate maps the first size bytes of name MAP_SHARED. The file's size
// is checked on the open descriptor first: touching a mapping past the end
// of a file raises SIGBUS.
func MapPrivate(dirfd int, dirPath, name string, uid int, size int, writable bool) ([]byte, error) {
	flags, prot := unix.O_RDONLY, unix.PROT_READ
	if writable {
		flags, prot = unix.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	}
	fd, st, err := OpenPrivate(dirfd, dirPath, name, flags, uid)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if st.Size < int64(size) {
		return nil, fmt.Errorf("%w: %s is %d bytes, want at least %d", ErrCorruptEntry, filepath.Join(dirPath, name), st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, prot, unix.MAP_SHARED)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: filepath.Join(dirPath, name), Err: err}
	}
	return mem, nil
}

// ReadHeaderFile copies the header of a control file out and validates it.
// It reads with pread, never through a mapping, so a short file is an error
// rather than a SIGBUS.
func ReadHeaderFile(dirfd int, dirPath, name string, uid int) (staging.Header, error) {
	fd, st, err := OpenPrivate(dirfd, dirPath, name, unix.O_RDONLY, uid)
	if err != nil {
		return staging.Header{}, err
	}
	defer unix.Close(fd)
	if err := CheckControlSize(name, st.Size); err != nil {
		return staging.Header{}, err
	}
	var buf [unsafe.Sizeof(staging.Header{})]byte
	if err := PreadFull(fd, buf[:], 0); err != nil {
		return staging.Header{}, fmt.Errorf("%w: %s: %v", ErrCorruptEntry, name, err)
	}
	return DecodeHeader(buf[:])
}

// LegacyControlSize is the size of a control file of ABI version 5, which
// a control file of version 6 keeps (sparse past its block), so that a
// rank of version 5 reads its header and refuses it by its version.
const LegacyControlSize = 8316160

// CheckControlSize refuses a control file shorter than a control block.
func CheckControlSize(name string, size int64) error {
	if size < int64(staging.ControlSize) {
		return fmt.Errorf("%w: %s is %d bytes, want %d", ErrCorruptEntry, name, size, staging.ControlSize)
	}
	return nil
}

func PreadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pread(fd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("short read")
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// ReadDirNames lists every name in the directory open at dirfd; path names
// it in errors.
func ReadDirNames(dirfd int, path string) ([]string, error) {
	return ReadDirNamesUpTo(dirfd, path, -1)
}

// ReadDirNamesUpTo is ReadDirNames reading at most n names (all of them
// when n <= 0), in the directory's order: a reader that must not let a
// folder's size decide its cost reads n+1 and knows the folder holds more
// when it got them.
func ReadDirNamesUpTo(dirfd int, path string, n int) ([]string, error) {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	names, err := f.Readdirnames(n)
	if err == io.EOF {
		err = nil
	}
	return names, err
}

// HeartbeatStale reports whether a stamp taken with MonoNanos is older than
// timeout at now. A rank that never beat is stale.
func HeartbeatStale(stamp uint64, now int64, timeout time.Duration) bool {
	return stamp == 0 || now-int64(stamp) > int64(timeout)
}
