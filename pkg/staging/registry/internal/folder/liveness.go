// SPDX-License-Identifier: Apache-2.0

package folder

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
)

// A rank holds a shared flock on its own control file from before it
// writes the header until after it has removed its files, through a
// descriptor it never closes before then. The kernel drops the lock when
// the last descriptor of that open file goes, at the latest when the
// process exits: a control file whose lock can be taken exclusively has no
// live process behind it. Unlike a heartbeat, the lock does not lapse while
// its holder is stopped, frozen or starved, and unlike a pid it means the
// same in every PID namespace, so it is the proof of a rank's end that
// judges across namespaces.

// HoldLiveness takes the rank's shared lock on its control file fd.
func HoldLiveness(fd int) error {
	for {
		err := unix.Flock(fd, unix.LOCK_SH)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// LivenessHeld reports whether a process still holds the lock of the
// control file open at fd: false only when an exclusive lock could be
// taken, which is then dropped at once. Any failure other than the lock
// being held counts as held, since it proves nothing.
func LivenessHeld(fd int) bool {
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	unix.Flock(fd, unix.LOCK_UN)
	return false
}

// Liveness judges the registration id by its control file in the folder
// at dirfd, published or not: found is false when it has none, and held
// then means nothing.
func Liveness(dirfd int, id staging.Identity) (held, found bool) {
	for _, name := range [...]string{RankFileName(id), TmpFileName(id)} {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return true, true
		}
		held = LivenessHeld(fd)
		unix.Close(fd)
		return held, true
	}
	return false, false
}
