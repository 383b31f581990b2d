// SPDX-License-Identifier: Apache-2.0

// Package folder is the registry folder's format, shared by the ranks
// (package registry) and the reader (package inspect): entry names, the
// private-file checks, a control file's header, a process's liveness from
// /proc and the read of a rank's counters block.
package folder

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/pxn-project/pxn/pkg/staging"
)

// GroupDirPrefix opens the name of every registry directory:
// <root>/mooncake-pxn-<euid>-<group>.
const GroupDirPrefix = "mooncake-pxn-"

// Names inside a registry directory. <id> is <pid>-<start time>-<epoch as 16
// hex digits>, so the name alone says whose an entry is and whether its
// process still runs.
const (
	// LockFileName is the flock target; it is never deleted.
	LockFileName = ".lock"
	// RankPrefix opens rank-<id>, a published (READY) control file.
	RankPrefix = "rank-"
	// TmpPrefix and TmpSuffix enclose .rank-<id>.tmp, a control file
	// being initialized.
	TmpPrefix = ".rank-"
	TmpSuffix = ".tmp"
	// ArenaPrefix opens arena-<id>, a host arena.
	ArenaPrefix = "arena-"
	// SockPrefix opens sock-<id>, the unix socket through which the rank
	// hands descriptors of its arena to the holders of its lanes.
	SockPrefix = "sock-"
)

type EntryKind int

const (
	EntryOther EntryKind = iota
	EntryLock
	EntryRank
	EntryTmp
	EntryArena
	EntrySock
)

func (k EntryKind) String() string {
	switch k {
	case EntryLock:
		return "lock"
	case EntryRank:
		return "rank"
	case EntryTmp:
		return "initializing rank"
	case EntryArena:
		return "arena"
	case EntrySock:
		return "arena socket"
	}
	return "unknown"
}

func IDSuffix(id staging.Identity) string {
	return strconv.Itoa(id.Pid) + "-" + strconv.FormatUint(id.StartTime, 10) + "-" + fmt.Sprintf("%016x", id.Epoch)
}

func RankFileName(id staging.Identity) string { return RankPrefix + IDSuffix(id) }

func TmpFileName(id staging.Identity) string { return TmpPrefix + IDSuffix(id) + TmpSuffix }

func ArenaFileName(id staging.Identity) string { return ArenaPrefix + IDSuffix(id) }

func SockFileName(id staging.Identity) string { return SockPrefix + IDSuffix(id) }

// ParseEntryName classifies a directory entry by its name. Only canonical
// names count: one identity has exactly one name of each kind.
func ParseEntryName(name string) (EntryKind, staging.Identity) {
	var kind EntryKind
	var s string
	switch {
	case name == LockFileName:
		return EntryLock, staging.Identity{}
	case strings.HasPrefix(name, TmpPrefix) && strings.HasSuffix(name, TmpSuffix) && len(name) > len(TmpPrefix)+len(TmpSuffix):
		kind, s = EntryTmp, name[len(TmpPrefix):len(name)-len(TmpSuffix)]
	case strings.HasPrefix(name, RankPrefix):
		kind, s = EntryRank, name[len(RankPrefix):]
	case strings.HasPrefix(name, ArenaPrefix):
		kind, s = EntryArena, name[len(ArenaPrefix):]
	case strings.HasPrefix(name, SockPrefix):
		kind, s = EntrySock, name[len(SockPrefix):]
	default:
		return EntryOther, staging.Identity{}
	}
	id, ok := ParseIDSuffix(s)
	if !ok {
		return EntryOther, staging.Identity{}
	}
	return kind, id
}

func ParseIDSuffix(s string) (staging.Identity, bool) {
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
	if IDSuffix(id) != s {
		return staging.Identity{}, false
	}
	return id, true
}
