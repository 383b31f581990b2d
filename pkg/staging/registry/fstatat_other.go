// SPDX-License-Identifier: Apache-2.0

//go:build !(amd64 || arm64 || loong64 || mips64 || mips64le || ppc64 || ppc64le || riscv64 || s390x)

package registry

import (
	"bytes"

	"golang.org/x/sys/unix"
)

// fstatatZ is fstatat(dirfd, name, st, AT_SYMLINK_NOFOLLOW) for a name
// that a NUL byte ends inside z. Here it copies the name.
func fstatatZ(dirfd int, z []byte, st *unix.Stat_t) error {
	return unix.Fstatat(dirfd, string(z[:bytes.IndexByte(z, 0)]), st, unix.AT_SYMLINK_NOFOLLOW)
}
