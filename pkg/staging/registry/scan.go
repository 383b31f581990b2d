// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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

var errNoPidfd = errors.New("pidfds not used")

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

// procWatch follows one registration, as its control file says to judge
// it. One in this rank's PID namespace is judged by its process: a pidfd,
// polled for all watches at once, turns readable once the process has
// exited, reaped or a zombie; without pidfds an open /proc/<pid>/stat
// shows state Z, and answers ESRCH once the process is reaped. Either is
// opened once and tied to the registered process by its start time, so a
// reused pid cannot fool it afterwards. One in another namespace is judged
// by its heartbeat alone, read through its control file on every call:
// gone is set while the heartbeat has held one value for longer than the
// timeout, and cleared when it moves again. One whose namespace cannot be
// read (no control file yet, or garbage) is judged again on every call.
type procWatch struct {
	id   staging.Identity
	mode watchMode
	ns   staging.PidNS
	// pidfd and statfd: watchPid.
	pidfd  int
	statfd int
	// ctlfd, hb and hbSince: watchHeartbeat. hbSince is the MonoNanos at
	// which this rank first read the heartbeat at hb.
	ctlfd   int
	hb      uint64
	hbSince int64
	gone    string
	used    uint64
	// ctl is what the control file said when last read, and changes the
	// scan's count of changes then (watchUnknown).
	ctl     folder.CtlKind
	changes uint64
}

type watchMode int

const (
	watchUnknown watchMode = iota
	watchPid
	watchHeartbeat
)

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

// watch returns the watch of id, opening one on first sight. ns, when
// known (a lane's owner words carry it), spares reading the control file
// for it.
func (s *peerScan) watch(d *registryDir, id staging.Identity, ns *staging.PidNS) *procWatch {
	for _, w := range s.procs {
		if w.id == id {
			return w
		}
	}
	w := &procWatch{id: id, pidfd: -1, statfd: -1, ctlfd: -1}
	switch {
	case ns != nil:
		w.setMode(*ns, s.self, s.host.pidfdOpen)
	default:
		s.classify(d, w)
	}
	s.procs = append(s.procs, w)
	return w
}

// classify reads the control file of an unclassified watch and sets its
// mode from the namespace it names.
func (s *peerScan) classify(d *registryDir, w *procWatch) {
	c := folder.ReadControl(d.fd(), d.path, d.uid, w.id)
	w.ctl, w.changes = c.Kind, s.changes
	if c.Kind == folder.CtlValid {
		w.setMode(folder.HeaderNS(&c.Hdr), s.self, s.host.pidfdOpen)
	}
}

func (w *procWatch) setMode(ns, self staging.PidNS, pidfdOpen func(pid, flags int) (int, error)) {
	w.ns = ns
	if ns == self {
		w.mode = watchPid
		w.openProc(pidfdOpen)
		return
	}
	w.mode = watchHeartbeat
	w.hbSince = staging.MonoNanos()
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

// checkProcs marks the watches this call needs (those of listed entries
// and of the owners of this rank's lanes), finds out which registrations
// are gone, and closes the watches nobody needs any more. It reports
// whether a lane of ctl is held by an owner that is gone.
func (s *peerScan) checkProcs(d *registryDir, ctl *staging.ControlBlock, timeout time.Duration) (deadOwner bool) {
	s.round++
	for _, e := range s.entries {
		if e.proc != nil {
			e.proc.used = s.round
		}
	}
	var owners [staging.LaneCount]*procWatch
	for i := range ctl.Lanes {
		if owner, held := ctl.Lanes[i].Owner.Load(); held {
			ns := ctl.Lanes[i].Owner.LoadNS()
			owners[i] = s.watch(d, owner, &ns)
			owners[i].used = s.round
		}
	}
	s.poll(d, timeout)
	for i := 0; i < len(s.procs); {
		if w := s.procs[i]; w.used != s.round {
			w.close()
			last := len(s.procs) - 1
			s.procs[i], s.procs[last] = s.procs[last], nil
			s.procs = s.procs[:last]
			continue
		}
		i++
	}
	for _, w := range owners {
		if w != nil && w.gone != "" {
			return true
		}
	}
	return false
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

// judgeUnknown judges a registration whose control file names no
// namespace (see judge.gone); the cleanup judges it again under the lock.
func (s *peerScan) judgeUnknown(d *registryDir, w *procWatch, now int64, timeout time.Duration) {
	c := folder.ReadControl(d.fd(), d.path, d.uid, w.id)
	var newest int64
	var st unix.Stat_t
	for _, name := range [...]string{folder.RankFileName(w.id), folder.TmpFileName(w.id), folder.ArenaFileName(w.id), folder.SockFileName(w.id)} {
		if unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			newest = max(newest, st.Ctim.Nano())
		}
	}
	w.gone = judge{self: s.self, timeout: timeout}.gone(w.id, c, newest, now)
}

// checkHeartbeat reads the heartbeat of a registration of another
// namespace and judges it: gone while it has held one value, as this rank
// saw it, for longer than the timeout, and is older than the timeout.
// Without a control file the heartbeat reads 0 and never changes.
func (w *procWatch) checkHeartbeat(d *registryDir, now int64, timeout time.Duration) {
	if w.ctlfd < 0 {
		for _, name := range [...]string{folder.RankFileName(w.id), folder.TmpFileName(w.id)} {
			if fd, _, err := folder.OpenPrivate(d.fd(), d.path, name, unix.O_RDONLY, d.uid); err == nil {
				w.ctlfd = fd
				break
			}
		}
	}
	var hb uint64
	if w.ctlfd >= 0 {
		var b [8]byte
		if n, err := unix.Pread(w.ctlfd, b[:], folder.HeartbeatOffset); err == nil && n == len(b) {
			hb = binary.NativeEndian.Uint64(b[:])
		} else {
			hb = w.hb
		}
	}
	if hb != w.hb {
		w.hb, w.hbSince = hb, now
	}
	w.gone = judge{self: w.ns, timeout: timeout, obs: w}.heartbeatGone(w.id, w.hb, w.ns, now)
}

// unchangedSince makes one watch its own observer.
func (w *procWatch) unchangedSince(id staging.Identity, hb uint64) (int64, bool) {
	return w.hbSince, id == w.id && hb == w.hb
}

// openProc starts watching the process of a registration of this
// namespace. A process already gone is gone for good; one whose state
// cannot be proven stays watched with kill(pid, 0) alone, as folder.GoneReason
// would judge it.
func (w *procWatch) openProc(pidfdOpen func(pid, flags int) (int, error)) {
	id := w.id
	if id.Pid <= 0 || id.Pid > staging.MaxPid {
		w.gone = fmt.Sprintf("pid %d is not a valid pid", id.Pid)
		return
	}
	err := errNoPidfd
	if pidfdOpen != nil {
		w.pidfd, err = pidfdOpen(id.Pid, 0)
	}
	if err != nil {
		w.pidfd = -1
		if !errors.Is(err, unix.ESRCH) {
			w.statfd, err = unix.Open("/proc/"+strconv.Itoa(id.Pid)+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				w.statfd = -1
			}
		}
	}
	if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) {
		w.setGone(fmt.Sprintf("pid %d has exited", id.Pid))
		return
	}
	// The descriptors follow whichever process had the pid when they were
	// opened. It was the registered one if the process that has the pid now
	// started when the registration says: that one had the pid already.
	if why := folder.GoneReason(id.Pid, id.StartTime); why != "" {
		w.setGone(why)
	}
}

// checkStat reads the kept /proc/<pid>/stat into buf.
func (w *procWatch) checkStat(buf []byte) {
	for {
		n, err := unix.Pread(w.statfd, buf, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ESRCH):
			w.setGone(fmt.Sprintf("pid %d has exited", w.id.Pid))
		case err == nil:
			// comm may hold ')': the state follows the last one.
			if end := bytes.LastIndexByte(buf[:n], ')'); end >= 0 && end+2 < n {
				if c := buf[end+2]; c == 'Z' || c == 'X' {
					w.setGone(fmt.Sprintf("pid %d has exited (zombie)", w.id.Pid))
				}
			}
		}
		return
	}
}

func (w *procWatch) setGone(why string) {
	w.gone = why
	w.close()
}

func (w *procWatch) close() {
	for _, fd := range [...]*int{&w.pidfd, &w.statfd, &w.ctlfd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// headerBytes is the current call's header buffer.
func (s *peerScan) headerBytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&s.hdr)), folder.HeaderSize)
}

// sameHeader compares two headers but for the heartbeat and the wake word,
// the fields that change while a rank runs (besides the state, which is
// compared).
func sameHeader(a, b *staging.Header) bool {
	x, y := *a, *b
	x.Heartbeat, y.Heartbeat = 0, 0
	x.Wake, y.Wake = staging.WakeWord{}, staging.WakeWord{}
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
