// SPDX-License-Identifier: Apache-2.0

package folder

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// NoSpaceError reports a file of the registry folder that could not get
// its blocks when it was created: the folder's file system (the node's
// shared tmpfs, most often) is full. The rank does not register, and its
// data goes direct.
type NoSpaceError struct {
	Dir  string
	Name string
	Size int64
	Err  error
}

func (e *NoSpaceError) Error() string {
	return fmt.Sprintf("no room for %s (%d bytes) in %s: %v", e.Name, e.Size, e.Dir, e.Err)
}

func (e *NoSpaceError) Unwrap() error { return e.Err }

// zeroChunk bounds one write of Allocate's fallback.
const zeroChunk = 64 << 10

// Allocate gives the file open as fd, name in dirPath, size bytes and
// every block of them now. A file sized with ftruncate on tmpfs stays
// sparse: its pages are taken at first touch, and a full tmpfs then raises
// SIGBUS in whichever process touches one. Allocated here, a full file
// system is an error of the creator instead. A file system without
// fallocate gets the blocks written as zeros.
func Allocate(fd int, dirPath, name string, size int64) error {
	err := unix.Fallocate(fd, 0, 0, size)
	for errors.Is(err, unix.EINTR) {
		err = unix.Fallocate(fd, 0, 0, size)
	}
	if errors.Is(err, unix.EOPNOTSUPP) {
		err = writeZeros(fd, size)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT), errors.Is(err, unix.EFBIG):
		return &NoSpaceError{Dir: dirPath, Name: name, Size: size, Err: err}
	}
	return fmt.Errorf("allocate %d bytes for %s: %w", size, filepath.Join(dirPath, name), err)
}

func writeZeros(fd int, size int64) error {
	zeros := make([]byte, min(size, zeroChunk))
	for off := int64(0); off < size; {
		n, err := unix.Pwrite(fd, zeros[:min(size-off, int64(len(zeros)))], off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		off += int64(n)
	}
	return nil
}
