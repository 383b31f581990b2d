// SPDX-License-Identifier: Apache-2.0

// Package inspect reports what registry folders hold (groups, ranks, their
// lanes and counters) for the node agent and pxn-agent inspect. It only
// reads: no lock, no write, no registration. The engine never links it.
package inspect

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// GroupReport is what Root finds in one registry directory.
type GroupReport struct {
	// Group is the directory's name, mooncake-pxn-<uid>-<group>.
	Group string `json:"group"`
	Path  string `json:"path"`
	UID   int    `json:"uid"`
	Mode  string `json:"mode"`
	// Problems are findings about the directory itself that make ranks
	// refuse it.
	Problems []string      `json:"problems,omitempty"`
	Ranks    []RankReport  `json:"ranks"`
	Entries  []EntryReport `json:"entries,omitempty"`
	// Truncated says the directory holds more than MaxGroupEntries
	// entries: only that many were read, in the directory's order.
	Truncated bool `json:"truncated,omitempty"`
}

// MaxGroupEntries bounds the entries read of one registry directory. A
// group's ranks need a few each (a control file, an arena, its socket)
// and at most LaneCount+1 ranks use a group; anything past the bound is a
// member's litter, which must not slow every report of the node.
const MaxGroupEntries = 256

// RankReport is one control file, published or still initializing.
type RankReport struct {
	File      string `json:"file"`
	Published bool   `json:"published"`
	State     string `json:"state"`
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	Epoch     string `json:"epoch"`
	Rail      string `json:"rail"`
	HCA       string `json:"hca"`
	Arena     string `json:"arena"`
	// HeartbeatAge is how old the heartbeat was when read; -1 when the
	// rank never beat.
	HeartbeatAge time.Duration `json:"heartbeat_age_ns"`
	// PidNS is the rank's PID namespace, as staging.PidNS prints it.
	PidNS string `json:"pid_ns"`
	// Liveness is how the rank is judged: JudgedByPid when it shares the
	// inspecting process's PID namespace, JudgedByHeartbeat otherwise.
	Liveness string `json:"liveness"`
	// Shares are the ways its arena may be mapped: "handle",
	// "descriptor", or both.
	Shares string `json:"shares"`
	// Health is "live", "initializing", "revoked" (closing, waiting for
	// its senders), or why the rank is stale.
	Health string       `json:"health"`
	Lanes  []LaneReport `json:"lanes"`
	// Stats are the rank's counters; StatsError says why they could not
	// be read instead.
	Stats      *StatsReport `json:"stats,omitempty"`
	StatsError string       `json:"stats_error,omitempty"`
}

// LaneReport is one inbound lane of a rank.
type LaneReport struct {
	Lane       int    `json:"lane"`
	OwnerPid   int    `json:"owner_pid"`
	OwnerEpoch string `json:"owner_epoch,omitempty"`
	LaneEpoch  string `json:"lane_epoch,omitempty"`
	Next       uint64 `json:"next_seq"`
	Published  uint64 `json:"published_seq"`
	Completed  uint64 `json:"completed_seq"`
	Reaped     uint64 `json:"reaped_seq"`
	// Open: the relay has opened the lane's epoch (its OpenEpoch word),
	// so the owner may write its slots; a lane claimed but not open waits
	// for an earlier epoch's second-hop writes to end.
	Open bool `json:"open"`
	// OwnerHealth is "live" or why the owner is gone; empty for a free lane.
	OwnerHealth string `json:"owner_health,omitempty"`
	// OwnerPidNS and OwnerLiveness are the owner's PID namespace and how
	// it is judged (see RankReport).
	OwnerPidNS    string `json:"owner_pid_ns,omitempty"`
	OwnerLiveness string `json:"owner_liveness,omitempty"`
}

// EntryReport is any other entry: an arena, garbage, something unsafe.
type EntryReport struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	Note string `json:"note,omitempty"`
}

// arenaEntry is an arena or arena socket of a group, matched to its rank
// once every control file is read.
type arenaEntry struct {
	name string
	kind folder.EntryKind
	id   staging.Identity
}

// Root reports every registry directory (mooncake-pxn-*) under
// root. It only reads: it takes no lock and changes nothing (the counters
// block is read through a read-only mapping), so what it shows of live
// ranks is a moment's snapshot. A rank whose heartbeat is older than
// staleAfter is reported stale; one in the caller's PID namespace is also
// judged by its pid, one in another by its heartbeat alone. Garbage is
// reported, never fatal; only an unreadable root is an error.
func Root(root string, staleAfter time.Duration) ([]GroupReport, error) {
	// Without its own namespace, inspect judges every rank by heartbeat.
	self, _ := staging.SelfPidNS()
	rootfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rootfd)
	names, err := folder.ReadDirNames(rootfd, root)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	groups := []GroupReport{}
	for _, n := range names {
		if strings.HasPrefix(n, folder.GroupDirPrefix) {
			groups = append(groups, inspectGroup(rootfd, root, n, self, staleAfter))
		}
	}
	return groups, nil
}

func inspectGroup(rootfd int, root, name string, self staging.PidNS, staleAfter time.Duration) GroupReport {
	path := filepath.Join(root, name)
	g := GroupReport{Group: name, Path: path, UID: -1, Ranks: []RankReport{}}
	var st unix.Stat_t
	if err := unix.Fstatat(rootfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		g.Problems = append(g.Problems, err.Error())
		return g
	}
	g.UID, g.Mode = int(st.Uid), fmt.Sprintf("%04o", st.Mode&0o7777)
	if err := folder.CheckPrivate(path, &st, g.UID, unix.S_IFDIR); err != nil {
		g.Problems = append(g.Problems, err.Error())
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return g
		}
	}
	if uid, ok := groupDirUID(name); !ok || uid != g.UID {
		g.Problems = append(g.Problems, fmt.Sprintf("name does not carry the owner's uid %d", g.UID))
	}
	fd, err := unix.Openat(rootfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		g.Problems = append(g.Problems, (&os.PathError{Op: "open", Path: path, Err: err}).Error())
		return g
	}
	defer unix.Close(fd)
	names, err := folder.ReadDirNamesUpTo(fd, path, MaxGroupEntries+1)
	if err != nil {
		g.Problems = append(g.Problems, err.Error())
		return g
	}
	if len(names) > MaxGroupEntries {
		names, g.Truncated = names[:MaxGroupEntries], true
	}
	sort.Strings(names)
	now := staging.MonoNanos()
	ranks := make(map[staging.Identity]*RankReport)
	var arenas []arenaEntry
	for _, n := range names {
		var est unix.Stat_t
		if err := unix.Fstatat(fd, n, &est, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		kind, id := folder.ParseEntryName(n)
		if err := folder.CheckPrivate(filepath.Join(path, n), &est, g.UID, 0); err != nil {
			g.Entries = append(g.Entries, EntryReport{Name: n, Kind: "unsafe", Note: err.Error()})
			continue
		}
		switch kind {
		case folder.EntryLock:
		case folder.EntryRank, folder.EntryTmp:
			rr, err := inspectRank(fd, path, n, kind, id, g.UID, self, now, staleAfter)
			if err != nil {
				k := "garbage"
				if kind == folder.EntryTmp {
					k = "initializing"
				}
				g.Entries = append(g.Entries, EntryReport{Name: n, Kind: k, Note: err.Error()})
				continue
			}
			g.Ranks = append(g.Ranks, rr)
		case folder.EntryArena, folder.EntrySock:
			arenas = append(arenas, arenaEntry{name: n, kind: kind, id: id})
		default:
			g.Entries = append(g.Entries, EntryReport{Name: n, Kind: "garbage", Note: "not a registry name"})
		}
	}
	for i := range g.Ranks {
		_, id := folder.ParseEntryName(g.Ranks[i].File)
		ranks[id] = &g.Ranks[i]
	}
	for _, a := range arenas {
		note := "in use"
		switch rr := ranks[a.id]; {
		case rr == nil:
			note = "orphan: no control file; removed once older than the heartbeat timeout"
		case rr.Liveness == JudgedByPid && folder.GoneReason(a.id.Pid, a.id.StartTime) != "":
			note = "orphan: " + folder.GoneReason(a.id.Pid, a.id.StartTime) + "; the next registrant removes it"
		case rr.Liveness == JudgedByHeartbeat && strings.HasPrefix(rr.Health, "stale: "):
			note = "its rank's heartbeat is late; a rank of the group removes it once it has not moved for the heartbeat timeout"
		}
		g.Entries = append(g.Entries, EntryReport{Name: a.name, Kind: a.kind.String(), Note: note})
	}
	return g
}

// groupDirUID parses the uid out of mooncake-pxn-<uid>-<group>.
func groupDirUID(name string) (int, bool) {
	s, _, ok := strings.Cut(strings.TrimPrefix(name, folder.GroupDirPrefix), "-")
	if !ok {
		return 0, false
	}
	uid, err := strconv.Atoi(s)
	return uid, err == nil
}

func inspectRank(dirfd int, dirPath, name string, kind folder.EntryKind, id staging.Identity, uid int, self staging.PidNS, now int64, staleAfter time.Duration) (RankReport, error) {
	fd, st, err := folder.OpenPrivate(dirfd, dirPath, name, unix.O_RDONLY, uid)
	if err != nil {
		return RankReport{}, err
	}
	defer unix.Close(fd)
	if st.Size < int64(staging.ControlSize) {
		return RankReport{}, fmt.Errorf("%w: %d bytes, want %d", folder.ErrCorruptEntry, st.Size, staging.ControlSize)
	}
	var buf [folder.HeaderSize]byte
	if err := folder.PreadFull(fd, buf[:], 0); err != nil {
		return RankReport{}, fmt.Errorf("%w: %v", folder.ErrCorruptEntry, err)
	}
	h, err := folder.DecodeHeader(buf[:])
	if err != nil {
		return RankReport{}, err
	}
	if got := folder.HeaderIdentity(&h); got != id {
		return RankReport{}, fmt.Errorf("%w: header names %v", folder.ErrCorruptEntry, got)
	}
	rr := RankReport{
		File:         name,
		Published:    kind == folder.EntryRank,
		State:        folder.StateName(h.State),
		Pid:          id.Pid,
		StartTime:    id.StartTime,
		Epoch:        fmt.Sprintf("%016x", id.Epoch),
		Rail:         folder.HeaderRail(&h),
		HCA:          folder.HeaderHCA(&h),
		Arena:        arenaKindName(h.ArenaKind),
		HeartbeatAge: -1,
		PidNS:        folder.HeaderNS(&h).String(),
		Liveness:     livenessOf(folder.HeaderNS(&h), self),
		Shares:       sharesText(h.ArenaShares),
		Health:       "live",
	}
	if h.Heartbeat != 0 {
		rr.HeartbeatAge = max(time.Duration(now-int64(h.Heartbeat)), 0)
	}
	why := ""
	if rr.Liveness == JudgedByPid {
		why = folder.GoneReason(id.Pid, id.StartTime)
	}
	switch {
	case why != "":
		rr.Health = "stale: " + why
	case kind == folder.EntryTmp && folder.HeartbeatStale(h.Heartbeat, now, staleAfter) && rr.Liveness == JudgedByHeartbeat:
		rr.Health = fmt.Sprintf("stale: heartbeat older than %v (judged by heartbeat)", staleAfter)
	case kind == folder.EntryTmp && h.State == staging.StateClosing:
		rr.Health = "revoked"
	case kind == folder.EntryTmp:
		rr.Health = "initializing"
	case folder.HeartbeatStale(h.Heartbeat, now, staleAfter):
		rr.Health = fmt.Sprintf("stale: heartbeat older than %v", staleAfter)
	}
	for i := 0; i < staging.LaneCount; i++ {
		var lh staging.LaneSummary
		off := int64(unsafe.Offsetof(staging.ControlBlock{}.Lanes) + uintptr(i)*unsafe.Sizeof(staging.LaneSummary{}))
		if err := folder.PreadFull(fd, unsafe.Slice((*byte)(unsafe.Pointer(&lh)), unsafe.Sizeof(lh)), off); err != nil {
			return RankReport{}, fmt.Errorf("%w: lane %d: %v", folder.ErrCorruptEntry, i, err)
		}
		lr := LaneReport{
			Lane:      i,
			Next:      lh.Sender.NextSeq,
			Published: lh.Sender.PublishedSeq,
			Completed: lh.Relay.CompletedSeq,
			Reaped:    lh.Sender.ReapedSeq,
		}
		if lh.Owner.LaneEpoch != 0 {
			lr.LaneEpoch = fmt.Sprintf("%016x", lh.Owner.LaneEpoch)
			lr.Open = lh.Relay.OpenEpoch == lh.Owner.LaneEpoch
		}
		if owner, held := lh.Owner.Load(); held {
			ns := lh.Owner.LoadNS()
			lr.OwnerPid, lr.OwnerEpoch, lr.OwnerHealth = owner.Pid, fmt.Sprintf("%016x", owner.Epoch), "live"
			lr.OwnerPidNS, lr.OwnerLiveness = ns.String(), livenessOf(ns, self)
			if lr.OwnerLiveness == JudgedByPid {
				if why := folder.GoneReason(owner.Pid, owner.StartTime); why != "" {
					lr.OwnerHealth = "stale: " + why
				}
			} else if c := folder.ReadControl(dirfd, dirPath, uid, owner); c.Kind != folder.CtlValid || folder.HeartbeatStale(c.Hdr.Heartbeat, now, staleAfter) {
				lr.OwnerHealth = fmt.Sprintf("stale: no heartbeat within %v (judged by heartbeat)", staleAfter)
			}
		}
		rr.Lanes = append(rr.Lanes, lr)
	}
	stats, err := folder.ReadStats(fd)
	if err == nil {
		rr.Stats, err = newStatsReport(&stats, now)
	}
	if err != nil {
		rr.StatsError = err.Error()
	}
	return rr, nil
}

func livenessOf(ns, self staging.PidNS) string {
	if ns == self {
		return JudgedByPid
	}
	return JudgedByHeartbeat
}

func sharesText(shares uint32) string {
	var s []string
	for _, sh := range [...]uint32{staging.ShareIPCHandle, staging.ShareFD, staging.ShareLaneFD} {
		if shares&sh != 0 {
			s = append(s, folder.ShareName(sh))
		}
	}
	return strings.Join(s, ",")
}

func arenaKindName(k uint32) string {
	switch k {
	case staging.ArenaHost:
		return "host"
	case staging.ArenaCUDA:
		return "cuda"
	}
	return strconv.Itoa(int(k))
}

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
