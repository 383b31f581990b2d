// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

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
// seen unchanged, by the judge, for longer than the heartbeat timeout, is
// older than the timeout as well, and its liveness lock is free
// (folder.Liveness): a late heartbeat alone is a slow rank, never a dead
// one. A judge that has not watched (obs nil, as at registration), or has
// no folder to look in (d nil), therefore never finds such a registration
// gone; a rank's pump, which lists its peers every 100 ms, watches all of
// them.
type judge struct {
	self    staging.PidNS
	timeout time.Duration
	obs     heartbeatObserver
	d       *registryDir
}

// gone says why the registration id, whose control file is c, is gone, or
// "" while it is not or that cannot be proven. newest is the latest change
// time of any of the registration's files, for a registration whose
// control file tells nothing.
func (j judge) gone(id staging.Identity, c folder.Control, newest int64, now int64) string {
	switch c.Kind {
	case folder.CtlValid:
		if ns := folder.HeaderNS(&c.Hdr); ns != j.self {
			return j.heartbeatGone(id, c.Hdr.Heartbeat, ns, now)
		}
		return folder.GoneReason(id.Pid, id.StartTime)
	case folder.CtlBad:
		return ""
	}
	// No namespace to go by. A live process of this namespace with the
	// registration's pid and start time is proof of life (a process of
	// another namespace could only be mistaken for it, never the other
	// way round); otherwise time alone can tell.
	if proc, err := folder.ReadProcStat(id.Pid); err == nil && proc.StartTime == id.StartTime && proc.State != 'Z' && proc.State != 'X' {
		return ""
	}
	age := time.Duration(time.Now().UnixNano() - newest)
	if age <= j.timeout {
		return ""
	}
	if c.Kind == folder.CtlBlank {
		return fmt.Sprintf("its control file %s was never written, for %v", c.Name, age.Round(time.Millisecond))
	}
	return fmt.Sprintf("it has no control file, for %v", age.Round(time.Millisecond))
}

// heartbeatGone judges a registration of another namespace whose heartbeat
// reads hb now.
func (j judge) heartbeatGone(id staging.Identity, hb uint64, ns staging.PidNS, now int64) string {
	if j.obs == nil || !folder.HeartbeatStale(hb, now, j.timeout) {
		return ""
	}
	since, ok := j.obs.unchangedSince(id, hb)
	if !ok || now-since <= int64(j.timeout) || j.d == nil {
		return ""
	}
	held, found := folder.Liveness(j.d.fd(), id)
	switch {
	case !found:
		return fmt.Sprintf("it has no control file and its heartbeat was unchanged for %v (PID namespace %v)", time.Duration(now-since).Round(time.Millisecond), ns)
	case held:
		return ""
	}
	return fmt.Sprintf("its liveness lock is free and its heartbeat was unchanged for %v (PID namespace %v)", time.Duration(now-since).Round(time.Millisecond), ns)
}

// ownerGone judges the owner of a lane, whose namespace the lane records.
// An owner of another namespace is judged by the heartbeat of its control
// file; without one, by a heartbeat that never changes.
func (j judge) ownerGone(d *registryDir, owner staging.Identity, ns staging.PidNS, now int64) string {
	if ns == j.self {
		return folder.GoneReason(owner.Pid, owner.StartTime)
	}
	var hb uint64
	if c := folder.ReadControl(d.fd(), d.path, d.uid, owner); c.Kind == folder.CtlValid {
		hb = c.Hdr.Heartbeat
	}
	return j.heartbeatGone(owner, hb, ns, now)
}

// newestChange is the latest change time of the entries of id.
func newestChange(dirfd int, entries []dirEntry, id staging.Identity) int64 {
	var newest int64
	for _, e := range entries {
		if e.id != id || e.kind == folder.EntryOther || e.kind == folder.EntryLock {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(dirfd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			newest = max(newest, st.Ctim.Nano())
		}
	}
	return newest
}
