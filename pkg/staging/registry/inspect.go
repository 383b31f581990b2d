// SPDX-License-Identifier: Apache-2.0

package registry

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
)

// GroupReport is what InspectRoot finds in one registry directory.
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
}

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
	// Health is "live", "initializing", or why the rank is stale.
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
	// OwnerHealth is "live" or why the owner is gone; empty for a free lane.
	OwnerHealth string `json:"owner_health,omitempty"`
}

// EntryReport is any other entry: an arena, garbage, something unsafe.
type EntryReport struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	Note string `json:"note,omitempty"`
}

// laneHead is the part of a Lane that inspect reads.
type laneHead struct {
	Owner  staging.LaneOwner
	Sender staging.SenderProgress
	Relay  staging.RelayProgress
}

var (
	_ [unsafe.Offsetof(staging.Lane{}.Ready) - unsafe.Sizeof(laneHead{})]struct{}
	_ [unsafe.Sizeof(laneHead{}) - unsafe.Offsetof(staging.Lane{}.Ready)]struct{}
)

// InspectRoot reports every registry directory (mooncake-pxn-*) under
// root. It only reads: it takes no lock and changes nothing (the counters
// block is read through a read-only mapping), so what it shows of live
// ranks is a moment's snapshot. A rank whose
// heartbeat is older than staleAfter is reported stale. Garbage is reported,
// never fatal; only an unreadable root is an error.
func InspectRoot(root string, staleAfter time.Duration) ([]GroupReport, error) {
	rootfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rootfd)
	names, err := readDirNames(rootfd, root)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	groups := []GroupReport{}
	for _, n := range names {
		if strings.HasPrefix(n, GroupDirPrefix) {
			groups = append(groups, inspectGroup(rootfd, root, n, staleAfter))
		}
	}
	return groups, nil
}

func inspectGroup(rootfd int, root, name string, staleAfter time.Duration) GroupReport {
	path := filepath.Join(root, name)
	g := GroupReport{Group: name, Path: path, UID: -1, Ranks: []RankReport{}}
	var st unix.Stat_t
	if err := unix.Fstatat(rootfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		g.Problems = append(g.Problems, err.Error())
		return g
	}
	g.UID, g.Mode = int(st.Uid), fmt.Sprintf("%04o", st.Mode&0o7777)
	if err := checkPrivate(path, &st, g.UID, unix.S_IFDIR); err != nil {
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
	names, err := readDirNames(fd, path)
	if err != nil {
		g.Problems = append(g.Problems, err.Error())
		return g
	}
	sort.Strings(names)
	now := staging.MonoNanos()
	ranks := make(map[staging.Identity]bool)
	var arenas []dirEntry
	for _, n := range names {
		var est unix.Stat_t
		if err := unix.Fstatat(fd, n, &est, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		kind, id := parseEntryName(n)
		if err := checkPrivate(filepath.Join(path, n), &est, g.UID, 0); err != nil {
			g.Entries = append(g.Entries, EntryReport{Name: n, Kind: "unsafe", Note: err.Error()})
			continue
		}
		switch kind {
		case entryLock:
		case entryRank, entryTmp:
			rr, err := inspectRank(fd, path, n, kind, id, g.UID, now, staleAfter)
			if err != nil {
				k := "garbage"
				if kind == entryTmp {
					k = "initializing"
				}
				g.Entries = append(g.Entries, EntryReport{Name: n, Kind: k, Note: err.Error()})
				continue
			}
			ranks[id] = true
			g.Ranks = append(g.Ranks, rr)
		case entryArena:
			arenas = append(arenas, dirEntry{name: n, kind: kind, id: id})
		default:
			g.Entries = append(g.Entries, EntryReport{Name: n, Kind: "garbage", Note: "not a registry name"})
		}
	}
	for _, a := range arenas {
		note := "in use"
		switch why := goneReason(a.id.Pid, a.id.StartTime); {
		case why != "":
			note = "orphan: " + why + "; the next registrant removes it"
		case !ranks[a.id]:
			note = "no control file: its process is initializing, or quarantined the arena"
		}
		g.Entries = append(g.Entries, EntryReport{Name: a.name, Kind: "arena", Note: note})
	}
	return g
}

// groupDirUID parses the uid out of mooncake-pxn-<uid>-<group>.
func groupDirUID(name string) (int, bool) {
	s, _, ok := strings.Cut(strings.TrimPrefix(name, GroupDirPrefix), "-")
	if !ok {
		return 0, false
	}
	uid, err := strconv.Atoi(s)
	return uid, err == nil
}

func inspectRank(dirfd int, dirPath, name string, kind entryKind, id staging.Identity, uid int, now int64, staleAfter time.Duration) (RankReport, error) {
	fd, st, err := openPrivate(dirfd, dirPath, name, unix.O_RDONLY, uid)
	if err != nil {
		return RankReport{}, err
	}
	defer unix.Close(fd)
	if st.Size < int64(staging.ControlSize) {
		return RankReport{}, fmt.Errorf("%w: %d bytes, want %d", ErrCorruptEntry, st.Size, staging.ControlSize)
	}
	var buf [headerSize]byte
	if err := preadFull(fd, buf[:], 0); err != nil {
		return RankReport{}, fmt.Errorf("%w: %v", ErrCorruptEntry, err)
	}
	h, err := decodeHeader(buf[:])
	if err != nil {
		return RankReport{}, err
	}
	if got := headerIdentity(&h); got != id {
		return RankReport{}, fmt.Errorf("%w: header names %v", ErrCorruptEntry, got)
	}
	rr := RankReport{
		File:         name,
		Published:    kind == entryRank,
		State:        stateName(h.State),
		Pid:          id.Pid,
		StartTime:    id.StartTime,
		Epoch:        fmt.Sprintf("%016x", id.Epoch),
		Rail:         headerRail(&h),
		HCA:          headerHCA(&h),
		Arena:        arenaKindName(h.ArenaKind),
		HeartbeatAge: -1,
		Health:       "live",
	}
	if h.Heartbeat != 0 {
		rr.HeartbeatAge = max(time.Duration(now-int64(h.Heartbeat)), 0)
	}
	switch why := goneReason(id.Pid, id.StartTime); {
	case why != "":
		rr.Health = "stale: " + why
	case kind == entryTmp:
		rr.Health = "initializing"
	case heartbeatStale(h.Heartbeat, now, staleAfter):
		rr.Health = fmt.Sprintf("stale: heartbeat older than %v", staleAfter)
	}
	for i := 0; i < staging.LaneCount; i++ {
		var lh laneHead
		off := int64(unsafe.Offsetof(staging.ControlBlock{}.Lanes) + uintptr(i)*unsafe.Sizeof(staging.Lane{}))
		if err := preadFull(fd, unsafe.Slice((*byte)(unsafe.Pointer(&lh)), unsafe.Sizeof(lh)), off); err != nil {
			return RankReport{}, fmt.Errorf("%w: lane %d: %v", ErrCorruptEntry, i, err)
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
		}
		if owner, held := lh.Owner.Load(); held {
			lr.OwnerPid, lr.OwnerEpoch, lr.OwnerHealth = owner.Pid, fmt.Sprintf("%016x", owner.Epoch), "live"
			if why := goneReason(owner.Pid, owner.StartTime); why != "" {
				lr.OwnerHealth = "stale: " + why
			}
		}
		rr.Lanes = append(rr.Lanes, lr)
	}
	stats, err := readStats(fd)
	if err == nil {
		rr.Stats, err = newStatsReport(&stats, now)
	}
	if err != nil {
		rr.StatsError = err.Error()
	}
	return rr, nil
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
