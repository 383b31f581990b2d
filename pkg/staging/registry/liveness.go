// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"errors"
	"fmt"
	"io/fs"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
)

// How the liveness of a registration is judged, as inspect reports it.
const (
	// JudgedByPid: the registration is in the reader's PID namespace; its
	// pid and start time prove whether its process runs.
	JudgedByPid = "pid"
	// JudgedByHeartbeat: the registration is in another PID namespace,
	// where its pid means nothing to the reader; only its heartbeat
	// counts.
	JudgedByHeartbeat = "heartbeat"
)

// heartbeatOffset is where a control file holds its heartbeat.
const heartbeatOffset = int64(unsafe.Offsetof(staging.Header{}.Heartbeat))

// ctlKind is what a registration's control file says about it.
type ctlKind int

const (
	// ctlNone: neither rank-<id> nor .rank-<id>.tmp exists.
	ctlNone ctlKind = iota
	// ctlValid: a header that validates and names the registration.
	ctlValid
	// ctlBlank: a .tmp file whose header was never written (shorter than a
	// control block, or no magic yet): its rank died or froze between
	// creating the file and writing the header.
	ctlBlank
	// ctlBad: anything else (another ABI, garbage, unsafe): nothing in it
	// can be trusted, not even its namespace.
	ctlBad
)

// regControl is the control file of one registration as read once.
type regControl struct {
	kind ctlKind
	name string
	hdr  staging.Header
	// ctime is the file's change time (CLOCK_REALTIME nanoseconds).
	ctime int64
}

// readRegControl finds and reads the control file of id: rank-<id> while
// it is published, .rank-<id>.tmp before and after. A rank's control file
// is the first of its files to be created and the last to go (see
// Register and Close), so a registration without one has no live process
// behind it unless it is being torn down this very moment.
func readRegControl(dirfd int, dirPath string, uid int, id staging.Identity) regControl {
	for _, name := range [...]string{rankFileName(id), tmpFileName(id)} {
		fd, st, err := openPrivate(dirfd, dirPath, name, unix.O_RDONLY, uid)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		c := regControl{kind: ctlBad, name: name, ctime: st.Ctim.Nano()}
		if err != nil {
			return c
		}
		defer unix.Close(fd)
		tmp := name != rankFileName(id)
		if st.Size < int64(staging.ControlSize) {
			if tmp {
				c.kind = ctlBlank
			}
			return c
		}
		var buf [headerSize]byte
		if preadFull(fd, buf[:], 0) != nil {
			return c
		}
		h, err := decodeHeader(buf[:])
		switch {
		case err != nil && tmp && h.Magic == 0:
			c.kind = ctlBlank
		case err != nil, headerIdentity(&h) != id, int(h.UID) != uid:
		default:
			c.kind, c.hdr = ctlValid, h
		}
		return c
	}
	return regControl{kind: ctlNone}
}

// headerNS is the PID namespace a header names.
func headerNS(h *staging.Header) staging.PidNS {
	return staging.PidNS{Dev: h.PidNSDev, Ino: h.PidNSIno}
}

// heartbeatObserver remembers, for registrations of other PID namespaces,
// since when (on the observer's clock) their heartbeat has held its
// current value.
type heartbeatObserver interface {
	// unchangedSince reports since when id's heartbeat has been seen at hb
	// (a MonoNanos reading), or false when it was not watched at that value.
	unchangedSince(id staging.Identity, hb uint64) (int64, bool)
}

// judge decides whether a registration is gone, so that its files may be
// removed and its lanes freed. A registration in the judge's own PID
// namespace is judged by its pid and start time. One in another namespace
// is never judged by its pid: it is gone only once its heartbeat has been
// seen unchanged, by the judge, for longer than the heartbeat timeout, and
// is older than the timeout as well. A judge that has not watched (obs
// nil, as at registration) therefore never finds such a registration gone;
// a rank's pump, which lists its peers every 100 ms, watches all of them.
type judge struct {
	self    staging.PidNS
	timeout time.Duration
	obs     heartbeatObserver
}

// gone says why the registration id, whose control file is c, is gone, or
// "" while it is not or that cannot be proven. newest is the latest change
// time of any of the registration's files, for a registration whose
// control file tells nothing.
func (j judge) gone(id staging.Identity, c regControl, newest int64, now int64) string {
	switch c.kind {
	case ctlValid:
		if ns := headerNS(&c.hdr); ns != j.self {
			return j.heartbeatGone(id, c.hdr.Heartbeat, ns, now)
		}
		return goneReason(id.Pid, id.StartTime)
	case ctlBad:
		return ""
	}
	// No namespace to go by. A live process of this namespace with the
	// registration's pid and start time is proof of life (a process of
	// another namespace could only be mistaken for it, never the other
	// way round); otherwise time alone can tell.
	if proc, err := readProcStat(id.Pid); err == nil && proc.StartTime == id.StartTime && proc.State != 'Z' && proc.State != 'X' {
		return ""
	}
	age := time.Duration(time.Now().UnixNano() - newest)
	if age <= j.timeout {
		return ""
	}
	if c.kind == ctlBlank {
		return fmt.Sprintf("its control file %s was never written, for %v", c.name, age.Round(time.Millisecond))
	}
	return fmt.Sprintf("it has no control file, for %v", age.Round(time.Millisecond))
}

// heartbeatGone judges a registration of another namespace whose heartbeat
// reads hb now.
func (j judge) heartbeatGone(id staging.Identity, hb uint64, ns staging.PidNS, now int64) string {
	if j.obs == nil || !heartbeatStale(hb, now, j.timeout) {
		return ""
	}
	since, ok := j.obs.unchangedSince(id, hb)
	if !ok || now-since <= int64(j.timeout) {
		return ""
	}
	return fmt.Sprintf("heartbeat unchanged for %v (PID namespace %v, judged by heartbeat)", time.Duration(now-since).Round(time.Millisecond), ns)
}

// ownerGone judges the owner of a lane, whose namespace the lane records.
// An owner of another namespace is judged by the heartbeat of its control
// file; without one, by a heartbeat that never changes.
func (j judge) ownerGone(d *registryDir, owner staging.Identity, ns staging.PidNS, now int64) string {
	if ns == j.self {
		return goneReason(owner.Pid, owner.StartTime)
	}
	var hb uint64
	if c := readRegControl(d.fd(), d.path, d.uid, owner); c.kind == ctlValid {
		hb = c.hdr.Heartbeat
	}
	return j.heartbeatGone(owner, hb, ns, now)
}

// newestChange is the latest change time of the entries of id.
func newestChange(dirfd int, entries []dirEntry, id staging.Identity) int64 {
	var newest int64
	for _, e := range entries {
		if e.id != id || e.kind == entryOther || e.kind == entryLock {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(dirfd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			newest = max(newest, st.Ctim.Nano())
		}
	}
	return newest
}
