// SPDX-License-Identifier: Apache-2.0

package group

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// DirMode lets members of any uid create their own 0700 registry inside a
// group folder, but not remove each other's. Only processes the folder is
// mounted into reach it: the folder that holds it is ClosedDirMode.
const DirMode = os.ModeSticky | 0o777

// ClosedDirMode is the mode of the folders that hold group folders, slot
// links and owner records: nobody but their owner lists or enters them,
// and nobody but root reaches a group folder by its path.
const ClosedDirMode = 0o700

// EnsureDir creates the group folder dir when missing and gives it DirMode.
// A symbolic link at dir is refused, never followed.
func EnsureDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create group directory %s: %w", dir, err)
	}
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open group directory %s: %w", dir, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat group directory %s: %w", dir, err)
	}
	if fi.Mode()&(os.ModeType|os.ModePerm|os.ModeSticky) == os.ModeDir|DirMode {
		return nil
	}
	if err := f.Chmod(DirMode); err != nil {
		return fmt.Errorf("chmod group directory %s: %w", dir, err)
	}
	return nil
}

// MakePrivateDirs creates each folder of dirs, in order, when missing and
// checks it with CheckPrivateDir.
func MakePrivateDirs(dirs ...string) error {
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, ClosedDirMode); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		if err := CheckPrivateDir(dir); err != nil {
			return err
		}
	}
	return nil
}

// MakeClosedDirs creates each folder of dirs, in order, when missing,
// checks it with CheckPrivateDir and gives it ClosedDirMode, which also
// closes a folder an earlier version left open to listing.
func MakeClosedDirs(dirs ...string) error {
	for _, dir := range dirs {
		if err := MakePrivateDirs(dir); err != nil {
			return err
		}
		f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", dir, err)
		}
		err = f.Chmod(ClosedDirMode)
		f.Close()
		if err != nil {
			return fmt.Errorf("chmod %s to %#o: %w", dir, ClosedDirMode, err)
		}
	}
	return nil
}

// CheckPrivateDir checks that dir is a folder, not a link, owned by this
// process's user and writable by nobody else: group folders are created and
// removed below such folders by path.
func CheckPrivateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (mode %v)", dir, fi.Mode())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not %d", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by others (mode %v)", dir, fi.Mode())
	}
	return nil
}
