// SPDX-License-Identifier: Apache-2.0

//go:build amd64 || arm64 || loong64 || mips64 || mips64le || ppc64 || ppc64le || riscv64 || s390x

package registry

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// fstatatZ is fstatat(dirfd, name, st, AT_SYMLINK_NOFOLLOW) for a name
// that a NUL byte ends inside z, as in a getdents record. Nothing is
// copied, so nothing is allocated.
func fstatatZ(dirfd int, z []byte, st *unix.Stat_t) error {
	_, _, errno := unix.Syscall6(unix.SYS_NEWFSTATAT, uintptr(dirfd), uintptr(unsafe.Pointer(&z[0])), uintptr(unsafe.Pointer(st)), unix.AT_SYMLINK_NOFOLLOW, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
