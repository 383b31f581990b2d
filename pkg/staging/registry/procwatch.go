// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

var errNoPidfd = errors.New("pidfds not used")

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
	w.gone = judge{self: s.self, timeout: timeout, d: d}.gone(w.id, c, newest, now)
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
	w.gone = judge{self: w.ns, timeout: timeout, obs: w, d: d}.heartbeatGone(w.id, w.hb, w.ns, now)
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
