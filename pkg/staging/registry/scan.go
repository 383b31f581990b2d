// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

const (
	// listEvery bounds how long Peers trusts an unchanged directory: it
	// lists the directory at least this often, which checks the type,
	// owner, mode and size of every entry again.
	listEvery = time.Second
	// stampSettle is how old the directory's last change must be, when a
	// listing starts, for its stat to be trusted afterwards. File systems
	// stamp changes with a coarse clock: a second change within the same
	// tick leaves the stamp as it was, but no change after the listing can
	// get a stamp this far in its past.
	stampSettle = 100 * time.Millisecond
	// direntBuf is the first size of the getdents buffer.
	direntBuf = 8 << 10
)

// Offsets in a linux_dirent64 record.
const (
	direntReclen = int(unsafe.Offsetof(unix.Dirent{}.Reclen))
	direntName   = int(unsafe.Offsetof(unix.Dirent{}.Name))
)

// dirStamp is what a stat of the directory says about its entries: a
// create, unlink or rename in it changes the times, and on tmpfs a create
// or unlink the size too.
type dirStamp struct {
	ino, nlink   uint64
	size         int64
	mtime, ctime int64
}

func stampOf(st *unix.Stat_t) dirStamp {
	return dirStamp{ino: st.Ino, nlink: uint64(st.Nlink), size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
}

// peerScan is what Peers keeps between calls so that a call in which
// nothing changed reads little and allocates nothing: the entries of the
// directory as last listed, an open descriptor and the last header of each
// control file, and a watch on the process of every registration that has
// an entry or holds one of this rank's lanes. Rank.scanMu guards it.
type peerScan struct {
	open     bool
	listFd   int // the directory, opened again for a read offset of its own
	stamp    dirStamp
	trusted  bool  // stamp is old enough that any later change moves it
	listedAt int64 // MonoNanos of the last listing
	buf      []byte
	entries  []*scanEntry
	byName   map[string]*scanEntry
	procs    []*procWatch
	round    uint64
	polls    []unix.PollFd
	pollOf   []*procWatch
	hdr      staging.Header // one header as read by the current call
	statBuf  [512]byte
	listings int
	// self is this rank's PID namespace.
	self staging.PidNS
	// changes counts entries added and dropped: an unclassified watch is
	// read again only after one.
	changes uint64
	// host outlives release.
	host scanHost
}

// scanHost is what the scan takes from the machine it runs on: how long it
// trusts an unchanged directory, and how it opens a pidfd (nil: the
// machine has none, and every watch reads /proc). Register sets the
// machine's own (machineScanHost); a test sets another to take the paths
// that other machines take.
type scanHost struct {
	listEvery time.Duration
	pidfdOpen func(pid, flags int) (int, error)
}

func machineScanHost() scanHost {
	return scanHost{listEvery: listEvery, pidfdOpen: unix.PidfdOpen}
}

// scanEntry is one entry of the directory. Only control files of other
// ranks are opened; proc is nil for this rank's own entries, the lock and
// names that are not the registry's.
type scanEntry struct {
	name   string
	kind   folder.EntryKind
	id     staging.Identity
	ino    uint64
	size   int64
	listed int
	proc   *procWatch
	// fd is the open control file, or -1.
	fd int
	// final: info.Refused stands until another file takes the name.
	final bool
	// loaded: hdr (n bytes of it) was read through fd and info was
	// derived from it.
	loaded bool
	n      int
	hdr    staging.Header
	info   PeerInfo
}

func (s *peerScan) init(d *registryDir) error {
	if s.open {
		return nil
	}
	fd, err := unix.Openat(d.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: d.path, Err: err}
	}
	*s = peerScan{open: true, listFd: fd, host: s.host, self: s.self, byName: make(map[string]*scanEntry), buf: make([]byte, direntBuf)}
	return nil
}

// release closes every descriptor; the next call starts afresh.
func (s *peerScan) release() {
	if !s.open {
		return
	}
	for _, e := range s.entries {
		e.close()
	}
	for _, w := range s.procs {
		w.close()
	}
	unix.Close(s.listFd)
	*s = peerScan{host: s.host, self: s.self}
}

// refresh brings the entries up to date: it lists the directory when its
// stat moved, when the stat was taken too soon after a change to be
// trusted, and at least every listEvery.
func (s *peerScan) refresh(d *registryDir, self staging.Identity) error {
	if err := s.init(d); err != nil {
		return err
	}
	wall := time.Now().UnixNano()
	var st unix.Stat_t
	if err := unix.Fstat(s.listFd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: d.path, Err: err}
	}
	every := s.host.listEvery
	stamp, now := stampOf(&st), staging.MonoNanos()
	if s.trusted && stamp == s.stamp && now-s.listedAt < int64(every) {
		return nil
	}
	if err := s.list(d, self); err != nil {
		return err
	}
	s.stamp, s.listedAt = stamp, now
	s.trusted = wall-max(stamp.mtime, stamp.ctime) > int64(stampSettle)
	return nil
}

// list reads the directory with getdents into the kept buffer. Names
// already known cost no allocation. Every entry must be private to the
// registry's uid and no symlink, as in registryDir.scan.
func (s *peerScan) list(d *registryDir, self staging.Identity) error {
	s.listings++
	if _, err := unix.Seek(s.listFd, 0, 0); err != nil {
		return &os.PathError{Op: "seek", Path: d.path, Err: err}
	}
	for {
		n, err := unix.Getdents(s.listFd, s.buf)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EINVAL) && len(s.buf) < 1<<20:
			s.buf = make([]byte, 2*len(s.buf))
			continue
		case err != nil:
			return &os.PathError{Op: "getdents", Path: d.path, Err: err}
		case n == 0:
			s.dropUnlisted()
			return nil
		}
		for off := 0; off < n; {
			reclen := int(binary.NativeEndian.Uint16(s.buf[off+direntReclen:]))
			if reclen <= direntName || off+reclen > n {
				return fmt.Errorf("getdents %s: record of %d bytes at %d of %d", d.path, reclen, off, n)
			}
			z := s.buf[off+direntName : off+reclen]
			off += reclen
			end := bytes.IndexByte(z, 0)
			if end < 0 {
				return fmt.Errorf("getdents %s: name without NUL", d.path)
			}
			if name := z[:end]; string(name) != "." && string(name) != ".." {
				if err := s.listed(d, self, z, end); err != nil {
					return err
				}
			}
		}
	}
}

// listed checks one listed name, z[:end], and adds it when it is new or
// another file now has it.
func (s *peerScan) listed(d *registryDir, self staging.Identity, z []byte, end int) error {
	var st unix.Stat_t
	if err := fstatatZ(d.fd(), z, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &os.PathError{Op: "stat", Path: filepath.Join(d.path, string(z[:end])), Err: err}
	}
	if p := folder.PrivateProblem(&st, d.uid, 0); p != "" {
		return &UnsafeError{Path: filepath.Join(d.path, string(z[:end])), Problem: p}
	}
	e := s.byName[string(z[:end])]
	if e != nil && e.ino != st.Ino {
		s.drop(e)
		e = nil
	}
	if e == nil {
		e = &scanEntry{name: string(z[:end]), ino: st.Ino, size: st.Size, fd: -1}
		e.kind, e.id = folder.ParseEntryName(e.name)
		if e.id != self && (e.kind == folder.EntryRank || e.kind == folder.EntryTmp || e.kind == folder.EntryArena || e.kind == folder.EntrySock) {
			e.proc = s.watch(d, e.id, nil)
		}
		s.entries = append(s.entries, e)
		s.byName[e.name] = e
		s.changes++
	} else if e.size != st.Size {
		e.size, e.loaded = st.Size, false
	}
	e.listed = s.listings
	return nil
}

func (s *peerScan) dropUnlisted() {
	for i := 0; i < len(s.entries); {
		if e := s.entries[i]; e.listed != s.listings {
			s.drop(e)
			continue
		}
		i++
	}
}

func (s *peerScan) drop(e *scanEntry) {
	s.changes++
	e.close()
	delete(s.byName, e.name)
	for i, x := range s.entries {
		if x == e {
			last := len(s.entries) - 1
			s.entries[i], s.entries[last] = s.entries[last], nil
			s.entries = s.entries[:last]
			return
		}
	}
}

func (e *scanEntry) close() {
	if e.fd >= 0 {
		unix.Close(e.fd)
		e.fd = -1
	}
	e.loaded = false
}

// unchangedSince implements heartbeatObserver for the judge of a cleanup
// that runs on this call's findings.
func (s *peerScan) unchangedSince(id staging.Identity, hb uint64) (int64, bool) {
	for _, w := range s.procs {
		if w.id == id && w.mode == watchHeartbeat && w.hb == hb {
			return w.hbSince, true
		}
	}
	return 0, false
}

// poll checks every needed watch not yet gone for good: all pidfds in one
// poll, the others one by one.
func (s *peerScan) poll(d *registryDir, timeout time.Duration) {
	s.polls, s.pollOf = s.polls[:0], s.pollOf[:0]
	now := staging.MonoNanos()
	for _, w := range s.procs {
		if w.used != s.round {
			continue
		}
		if w.mode == watchUnknown && (w.ctl != folder.CtlBad || w.changes != s.changes) {
			// Garbage is read again only when the directory changed; a
			// control file not there yet, or not yet written, on every
			// call.
			s.classify(d, w)
		}
		switch {
		case w.mode == watchHeartbeat:
			w.checkHeartbeat(d, now, timeout)
		case w.mode == watchUnknown && w.ctl == folder.CtlBad:
			// Garbage: nothing in it proves anything.
		case w.mode == watchUnknown:
			s.judgeUnknown(d, w, now, timeout)
		case w.gone != "":
		case w.pidfd >= 0:
			s.polls = append(s.polls, unix.PollFd{Fd: int32(w.pidfd), Events: unix.POLLIN})
			s.pollOf = append(s.pollOf, w)
		case w.statfd >= 0:
			w.checkStat(s.statBuf[:])
		default:
			if errors.Is(unix.Kill(w.id.Pid, 0), unix.ESRCH) {
				w.setGone(fmt.Sprintf("pid %d has exited", w.id.Pid))
			}
		}
	}
	if len(s.polls) == 0 {
		return
	}
	for {
		n, err := unix.Poll(s.polls, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return
		}
		break
	}
	for i, p := range s.polls {
		if p.Revents&(unix.POLLIN|unix.POLLHUP) != 0 {
			s.pollOf[i].setGone(fmt.Sprintf("pid %d has exited", s.pollOf[i].id.Pid))
		}
	}
}

// headerBytes is the current call's header buffer.
func (s *peerScan) headerBytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&s.hdr)), folder.HeaderSize)
}

// sameHeader compares two headers but for the heartbeat, the field that
// changes while a rank runs (besides the state, which is compared).
func sameHeader(a, b *staging.Header) bool {
	x, y := *a, *b
	x.Heartbeat, y.Heartbeat = 0, 0
	return x == y
}

// preadUpTo reads b from the start of fd and stops early only at the end
// of the file.
func preadUpTo(fd int, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Pread(fd, b[n:], int64(n))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}
