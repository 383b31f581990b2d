// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
)

// GroupDirPrefix opens the name of every registry directory:
// <root>/mooncake-pxn-<euid>-<group>.
const GroupDirPrefix = "mooncake-pxn-"

// Names inside a registry directory. <id> is <pid>-<start time>-<epoch as 16
// hex digits>, so the name alone says whose an entry is and whether its
// process still runs.
const (
	// lockFileName is the flock target; it is never deleted.
	lockFileName = ".lock"
	// rankPrefix opens rank-<id>, a published (READY) control file.
	rankPrefix = "rank-"
	// tmpPrefix and tmpSuffix enclose .rank-<id>.tmp, a control file
	// being initialized.
	tmpPrefix = ".rank-"
	tmpSuffix = ".tmp"
	// arenaPrefix opens arena-<id>, a host arena.
	arenaPrefix = "arena-"
	// sockPrefix opens sock-<id>, the unix socket through which the rank
	// hands descriptors of its arena to the holders of its lanes.
	sockPrefix = "sock-"
)

const (
	dirPerm   = 0o700
	filePerm  = 0o600
	openFlags = unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK
	lockPoll  = time.Millisecond
)

type entryKind int

const (
	entryOther entryKind = iota
	entryLock
	entryRank
	entryTmp
	entryArena
	entrySock
)

func (k entryKind) String() string {
	switch k {
	case entryLock:
		return "lock"
	case entryRank:
		return "rank"
	case entryTmp:
		return "initializing rank"
	case entryArena:
		return "arena"
	case entrySock:
		return "arena socket"
	}
	return "unknown"
}

func idSuffix(id staging.Identity) string {
	return strconv.Itoa(id.Pid) + "-" + strconv.FormatUint(id.StartTime, 10) + "-" + fmt.Sprintf("%016x", id.Epoch)
}

func rankFileName(id staging.Identity) string  { return rankPrefix + idSuffix(id) }
func tmpFileName(id staging.Identity) string   { return tmpPrefix + idSuffix(id) + tmpSuffix }
func arenaFileName(id staging.Identity) string { return arenaPrefix + idSuffix(id) }
func sockFileName(id staging.Identity) string  { return sockPrefix + idSuffix(id) }

// parseEntryName classifies a directory entry by its name. Only canonical
// names count: one identity has exactly one name of each kind.
func parseEntryName(name string) (entryKind, staging.Identity) {
	var kind entryKind
	var s string
	switch {
	case name == lockFileName:
		return entryLock, staging.Identity{}
	case strings.HasPrefix(name, tmpPrefix) && strings.HasSuffix(name, tmpSuffix) && len(name) > len(tmpPrefix)+len(tmpSuffix):
		kind, s = entryTmp, name[len(tmpPrefix):len(name)-len(tmpSuffix)]
	case strings.HasPrefix(name, rankPrefix):
		kind, s = entryRank, name[len(rankPrefix):]
	case strings.HasPrefix(name, arenaPrefix):
		kind, s = entryArena, name[len(arenaPrefix):]
	case strings.HasPrefix(name, sockPrefix):
		kind, s = entrySock, name[len(sockPrefix):]
	default:
		return entryOther, staging.Identity{}
	}
	id, ok := parseIDSuffix(s)
	if !ok {
		return entryOther, staging.Identity{}
	}
	return kind, id
}

func parseIDSuffix(s string) (staging.Identity, bool) {
	parts := strings.Split(s, "-")
	if len(parts) != 3 || len(parts[2]) != 16 {
		return staging.Identity{}, false
	}
	pid, err := strconv.Atoi(parts[0])
	if err != nil || pid <= 0 || pid > staging.MaxPid {
		return staging.Identity{}, false
	}
	start, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil {
		return staging.Identity{}, false
	}
	epoch, err := strconv.ParseUint(parts[2], 16, 64)
	if err != nil || epoch == 0 {
		return staging.Identity{}, false
	}
	id := staging.Identity{Pid: pid, StartTime: start, Epoch: epoch}
	if idSuffix(id) != s {
		return staging.Identity{}, false
	}
	return id, true
}

// checkGroupName accepts a contract group id: a name that is one path
// element and nothing else.
func checkGroupName(g string) error {
	if err := contract.ValidateGroupID(g); err != nil {
		return fmt.Errorf("group %s: %w", contract.Quote(g), err)
	}
	return nil
}

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

// checkPrivate accepts only an object of type wantType (S_IFDIR or S_IFREG)
// that uid owns and nobody else may access. wantType 0 accepts any type but
// a symlink.
func checkPrivate(path string, st *unix.Stat_t, uid int, wantType uint32) error {
	if p := privateProblem(st, uid, wantType); p != "" {
		return &UnsafeError{Path: path, Problem: p}
	}
	return nil
}

// privateProblem is checkPrivate without the path: the problem, or "" for
// a private object. It allocates only when there is a problem.
func privateProblem(st *unix.Stat_t, uid int, wantType uint32) string {
	t := st.Mode & unix.S_IFMT
	perm := uint32(filePerm)
	if t == unix.S_IFDIR {
		perm = dirPerm
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

// explainOpenError turns the error of an O_NOFOLLOW open into an
// UnsafeError when name is a symlink or of the wrong type.
func explainOpenError(dirfd int, path, name string, wantType uint32, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENXIO) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if uerr := checkPrivate(path, &st, int(st.Uid), wantType); uerr != nil {
				return uerr
			}
		}
	}
	return &os.PathError{Op: "open", Path: path, Err: err}
}

// openPrivate opens name in dirfd without following a symlink and checks
// the open file, not the name, so nothing can be swapped in between.
func openPrivate(dirfd int, dirPath, name string, flags int, uid int) (int, unix.Stat_t, error) {
	path := filepath.Join(dirPath, name)
	fd, err := unix.Openat(dirfd, name, flags|openFlags, filePerm)
	if err != nil {
		return -1, unix.Stat_t{}, explainOpenError(dirfd, path, name, unix.S_IFREG, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if err := checkPrivate(path, &st, uid, unix.S_IFREG); err != nil {
		unix.Close(fd)
		return -1, st, err
	}
	return fd, st, nil
}

// createPrivate creates name exclusively with mode 0600 whatever the umask.
func createPrivate(dirfd int, dirPath, name string) (int, error) {
	path := filepath.Join(dirPath, name)
	fd, err := unix.Openat(dirfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|openFlags, filePerm)
	if err != nil {
		return -1, &os.PathError{Op: "create", Path: path, Err: err}
	}
	if err := unix.Fchmod(fd, filePerm); err != nil {
		unix.Close(fd)
		unix.Unlinkat(dirfd, name, 0)
		return -1, &os.PathError{Op: "chmod", Path: path, Err: err}
	}
	return fd, nil
}

// mapPrivate maps the first size bytes of name MAP_SHARED. The file's size
// is checked on the open descriptor first: touching a mapping past the end
// of a file raises SIGBUS.
func mapPrivate(dirfd int, dirPath, name string, uid int, size int, writable bool) ([]byte, error) {
	flags, prot := unix.O_RDONLY, unix.PROT_READ
	if writable {
		flags, prot = unix.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	}
	fd, st, err := openPrivate(dirfd, dirPath, name, flags, uid)
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

// readHeaderFile copies the header of a control file out and validates it.
// It reads with pread, never through a mapping, so a short file is an error
// rather than a SIGBUS.
func readHeaderFile(dirfd int, dirPath, name string, uid int) (staging.Header, error) {
	fd, st, err := openPrivate(dirfd, dirPath, name, unix.O_RDONLY, uid)
	if err != nil {
		return staging.Header{}, err
	}
	defer unix.Close(fd)
	if err := checkControlSize(name, st.Size); err != nil {
		return staging.Header{}, err
	}
	var buf [unsafe.Sizeof(staging.Header{})]byte
	if err := preadFull(fd, buf[:], 0); err != nil {
		return staging.Header{}, fmt.Errorf("%w: %s: %v", ErrCorruptEntry, name, err)
	}
	return decodeHeader(buf[:])
}

// checkControlSize refuses a control file shorter than a control block.
func checkControlSize(name string, size int64) error {
	if size < int64(staging.ControlSize) {
		return fmt.Errorf("%w: %s is %d bytes, want %d", ErrCorruptEntry, name, size, staging.ControlSize)
	}
	return nil
}

func preadFull(fd int, b []byte, off int64) error {
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
	if err := unix.Mkdirat(rootfd, name, dirPerm); errors.Is(err, unix.EEXIST) {
		created = false
	} else if err != nil {
		return nil, &os.PathError{Op: "mkdir", Path: path, Err: err}
	}
	fd, err := unix.Openat(rootfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, explainOpenError(rootfd, path, name, unix.S_IFDIR, err)
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
		if err := unix.Fchmod(d.fd(), dirPerm); err != nil {
			return &os.PathError{Op: "chmod", Path: d.path, Err: err}
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(d.fd(), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: d.path, Err: err}
	}
	if err := checkPrivate(d.path, &st, d.uid, unix.S_IFDIR); err != nil {
		return err
	}
	fd, err := createPrivate(d.fd(), d.path, lockFileName)
	if errors.Is(err, unix.EEXIST) {
		fd, _, err = openPrivate(d.fd(), d.path, lockFileName, unix.O_RDWR, d.uid)
	}
	if err != nil {
		return err
	}
	d.lock = os.NewFile(uintptr(fd), filepath.Join(d.path, lockFileName))
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
	kind entryKind
	id   staging.Identity
}

// scan lists the directory. Every entry must be private to the registry's
// uid and no symlink: anything else means someone else can write into the
// registry, and the whole registry is refused.
func (d *registryDir) scan() ([]dirEntry, error) {
	names, err := readDirNames(d.fd(), d.path)
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
		if err := checkPrivate(filepath.Join(d.path, n), &st, d.uid, 0); err != nil {
			return nil, err
		}
		kind, id := parseEntryName(n)
		entries = append(entries, dirEntry{name: n, kind: kind, id: id})
	}
	return entries, nil
}

func readDirNames(dirfd int, path string) ([]string, error) {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	return f.Readdirnames(-1)
}

// heartbeatStale reports whether a stamp taken with MonoNanos is older than
// timeout at now. A rank that never beat is stale.
func heartbeatStale(stamp uint64, now int64, timeout time.Duration) bool {
	return stamp == 0 || now-int64(stamp) > int64(timeout)
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
		if e.kind == entryOther || e.kind == entryLock || e.id == self {
			continue
		}
		if _, seen := stale[e.id]; seen {
			continue
		}
		c := readRegControl(d.fd(), d.path, d.uid, e.id)
		var newest int64
		if c.kind == ctlNone || c.kind == ctlBlank {
			newest = newestChange(d.fd(), entries, e.id)
		}
		why := j.gone(e.id, c, newest, now)
		stale[e.id] = why != ""
		if why != "" {
			reasons = append(reasons, idSuffix(e.id)+": "+why)
		}
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !stale[e.id] || e.kind == entryOther || e.kind == entryLock {
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
