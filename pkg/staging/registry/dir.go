// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// checkGroupName accepts a contract group id: a name that is one path
// element and nothing else.
func checkGroupName(g string) error {
	if err := contract.ValidateGroupID(g); err != nil {
		return fmt.Errorf("group %s: %w", contract.Quote(g), err)
	}
	return nil
}

const lockPoll = time.Millisecond

// registryDir is an open registry directory and its lock file. Every name
// is resolved relative to the directory descriptor.
type registryDir struct {
	path string
	uid  int
	dir  *os.File
	lock *os.File
	// mu serializes flock holders of this process: flock excludes open file
	// descriptions, not goroutines sharing one.
	mu sync.Mutex
	// busy counts the no-wait attempts that found the lock held and gave
	// up; waited the waiting calls that found it held and waited for it.
	busy, waited atomic.Uint64
}

func (d *registryDir) fd() int { return int(d.dir.Fd()) }

// openRegistryDir creates (0700) or opens <root>/mooncake-pxn-<uid>-<group>
// and its .lock (0600), refusing anything unsafe. The root itself may be a
// symlink or a mount; nothing below it may.
func openRegistryDir(root string, uid int, group string) (*registryDir, error) {
	name := GroupDirPrefix + strconv.Itoa(uid) + "-" + group
	path := filepath.Join(root, name)
	rootfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rootfd)
	created := true
	if err := unix.Mkdirat(rootfd, name, folder.DirPerm); errors.Is(err, unix.EEXIST) {
		created = false
	} else if err != nil {
		return nil, &os.PathError{Op: "mkdir", Path: path, Err: err}
	}
	fd, err := unix.Openat(rootfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, folder.ExplainOpenError(rootfd, path, name, unix.S_IFDIR, err)
	}
	d := &registryDir{path: path, uid: uid, dir: os.NewFile(uintptr(fd), path)}
	if err := d.init(created); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

func (d *registryDir) init(created bool) error {
	if created {
		if err := unix.Fchmod(d.fd(), folder.DirPerm); err != nil {
			return &os.PathError{Op: "chmod", Path: d.path, Err: err}
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(d.fd(), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: d.path, Err: err}
	}
	if err := folder.CheckPrivate(d.path, &st, d.uid, unix.S_IFDIR); err != nil {
		return err
	}
	fd, err := folder.CreatePrivate(d.fd(), d.path, folder.LockFileName)
	if errors.Is(err, unix.EEXIST) {
		fd, _, err = folder.OpenPrivate(d.fd(), d.path, folder.LockFileName, unix.O_RDWR, d.uid)
	}
	if err != nil {
		return err
	}
	d.lock = os.NewFile(uintptr(fd), filepath.Join(d.path, folder.LockFileName))
	return nil
}

func (d *registryDir) close() error {
	var errs []error
	if d.lock != nil {
		errs = append(errs, d.lock.Close())
	}
	errs = append(errs, d.dir.Close())
	return errors.Join(errs...)
}

// withLock runs fn holding the directory's flock. It waits for the lock
// until ctx ends; holders keep it only for a scan, a claim or a rename.
func (d *registryDir) withLock(ctx context.Context, fn func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var timer *time.Timer
	for {
		got, err := d.flockNow()
		if err != nil {
			return err
		}
		if got {
			break
		}
		if timer == nil {
			d.waited.Add(1)
			timer = time.NewTimer(lockPoll)
			defer timer.Stop()
		} else {
			timer.Reset(lockPoll)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pxn registry: lock %s: %w", d.lock.Name(), ctx.Err())
		case <-timer.C:
		}
	}
	defer unix.Flock(int(d.lock.Fd()), unix.LOCK_UN)
	return fn()
}

// tryLock runs fn holding the directory's flock if it can take it at once,
// and returns ErrLockBusy otherwise: one non-blocking flock, nothing that
// waits on another holder. It is the only lock a pump may take.
func (d *registryDir) tryLock(fn func() error) error {
	if !d.mu.TryLock() {
		d.busy.Add(1)
		return ErrLockBusy
	}
	defer d.mu.Unlock()
	got, err := d.flockNow()
	if err != nil {
		return err
	}
	if !got {
		d.busy.Add(1)
		return ErrLockBusy
	}
	defer unix.Flock(int(d.lock.Fd()), unix.LOCK_UN)
	return fn()
}

// LockContention counts what this rank's calls found the registry lock
// held by another holder: busy, the no-wait calls that gave up (and left
// their work for a later call); waited, the waiting calls that waited for
// it. Tests read it to tell that the pump never waits on another process.
func (r *Rank) LockContention() (busy, waited uint64) {
	return r.d.busy.Load(), r.d.waited.Load()
}

// flockNow takes the directory's flock if no other holder has it, without
// waiting; false means another holder has it. d.mu is held.
func (d *registryDir) flockNow() (bool, error) {
	for {
		err := unix.Flock(int(d.lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EWOULDBLOCK):
			return false, nil
		}
		return false, &os.PathError{Op: "flock", Path: d.lock.Name(), Err: err}
	}
}

// lockFor is withLock when wait is set and tryLock otherwise.
func (d *registryDir) lockFor(ctx context.Context, wait bool, fn func() error) error {
	if wait {
		return d.withLock(ctx, fn)
	}
	return d.tryLock(fn)
}

type dirEntry struct {
	name string
	kind folder.EntryKind
	id   staging.Identity
}

// scan lists the directory. Every entry must be private to the registry's
// uid and no symlink: anything else means someone else can write into the
// registry, and the whole registry is refused.
func (d *registryDir) scan() ([]dirEntry, error) {
	names, err := folder.ReadDirNames(d.fd(), d.path)
	if err != nil {
		return nil, err
	}
	entries := make([]dirEntry, 0, len(names))
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(d.fd(), n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, &os.PathError{Op: "stat", Path: filepath.Join(d.path, n), Err: err}
		}
		if err := folder.CheckPrivate(filepath.Join(d.path, n), &st, d.uid, 0); err != nil {
			return nil, err
		}
		kind, id := folder.ParseEntryName(n)
		entries = append(entries, dirEntry{name: n, kind: kind, id: id})
	}
	return entries, nil
}

// cleanStale unlinks every file of every registration but self's that j
// proves gone: in self's PID namespace, one whose process exited or whose
// pid was reused; in another, one whose heartbeat j has seen unchanged for
// longer than the timeout. A late heartbeat alone removes nothing. The
// caller holds the lock, so no rank publishes or revokes meanwhile. It
// returns the removed names and, for each registration removed, why.
func (d *registryDir) cleanStale(self staging.Identity, j judge) ([]string, []string, error) {
	entries, err := d.scan()
	if err != nil {
		return nil, nil, err
	}
	stale := make(map[staging.Identity]bool)
	var reasons []string
	now := staging.MonoNanos()
	for _, e := range entries {
		if e.kind == folder.EntryOther || e.kind == folder.EntryLock || e.id == self {
			continue
		}
		if _, seen := stale[e.id]; seen {
			continue
		}
		c := folder.ReadControl(d.fd(), d.path, d.uid, e.id)
		var newest int64
		if c.Kind == folder.CtlNone || c.Kind == folder.CtlBlank {
			newest = newestChange(d.fd(), entries, e.id)
		}
		why := j.gone(e.id, c, newest, now)
		stale[e.id] = why != ""
		if why != "" {
			reasons = append(reasons, folder.IDSuffix(e.id)+": "+why)
		}
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !stale[e.id] || e.kind == folder.EntryOther || e.kind == folder.EntryLock {
			continue
		}
		if err := unix.Unlinkat(d.fd(), e.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, &os.PathError{Op: "unlink", Path: filepath.Join(d.path, e.name), Err: err})
			continue
		}
		removed = append(removed, e.name)
	}
	return removed, reasons, errors.Join(errs...)
}

// GroupDirPrefix opens the name of every registry directory:
// <root>/mooncake-pxn-<euid>-<group>.
const GroupDirPrefix = folder.GroupDirPrefix

// ErrCorruptEntry marks a registry entry whose bytes make no sense: short,
// out of range, or contradicting its own name. The entry is skipped.
var ErrCorruptEntry = folder.ErrCorruptEntry

// UnsafeError reports a registry directory or file that PXN refuses to use.
type UnsafeError = folder.UnsafeError

// MismatchError reports a peer built with other engine numbers (or no
// registry file at all): PXN refuses that peer and traffic to it goes direct.
type MismatchError = folder.MismatchError

// NoSpaceError reports a registry file that could not get its blocks when
// it was created: the folder's file system is full, and the rank does not
// register.
type NoSpaceError = folder.NoSpaceError
