// SPDX-License-Identifier: Apache-2.0

package folder

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
)

// NewIdentity identifies this process under a fresh epoch.
func NewIdentity() (staging.Identity, error) {
	pid := os.Getpid()
	st, err := ReadProcStat(pid)
	if err != nil {
		return staging.Identity{}, fmt.Errorf("read own start time: %w", err)
	}
	epoch, err := RandomEpoch()
	if err != nil {
		return staging.Identity{}, err
	}
	return staging.Identity{Pid: pid, StartTime: st.StartTime, Epoch: epoch}, nil
}

// RandomEpoch returns a random non-zero 64-bit number.
func RandomEpoch() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("draw epoch: %w", err)
		}
		if e := binary.LittleEndian.Uint64(b[:]); e != 0 {
			return e, nil
		}
	}
}

// ProcStat is what the registry needs from /proc/<pid>/stat.
type ProcStat struct {
	State     byte
	StartTime uint64 // field 22, clock ticks after boot
}

func ReadProcStat(pid int) (ProcStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ProcStat{}, err
	}
	return ParseProcStat(b)
}

// ParseProcStat parses "pid (comm) state ppid ...". comm is whatever the
// process named itself, spaces and parentheses included, so the fields are
// counted from the last ')'.
func ParseProcStat(b []byte) (ProcStat, error) {
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return ProcStat{}, fmt.Errorf("proc stat %q: no (comm)", truncateForError(b))
	}
	fields := bytes.Fields(b[end+1:])
	// fields[0] is field 3 (state); field 22 (starttime) is fields[19].
	if len(fields) < 20 {
		return ProcStat{}, fmt.Errorf("proc stat: %d fields after comm, want at least 20", len(fields))
	}
	if len(fields[0]) != 1 {
		return ProcStat{}, fmt.Errorf("proc stat: state %q is not one letter", fields[0])
	}
	start, err := strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return ProcStat{}, fmt.Errorf("proc stat: start time: %w", err)
	}
	return ProcStat{State: fields[0][0], StartTime: start}, nil
}

func truncateForError(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

// GoneReason says why the process pid that started at start is no longer
// running, or returns "" while it is, or when that cannot be proven: a
// registry entry is only ever removed on proof. Pids are those of this PID
// namespace.
func GoneReason(pid int, start uint64) string {
	if pid <= 0 || pid > staging.MaxPid {
		return fmt.Sprintf("pid %d is not a valid pid", pid)
	}
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return fmt.Sprintf("pid %d has exited", pid)
	}
	st, err := ReadProcStat(pid)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("pid %d has exited", pid)
	case err != nil:
		return ""
	case st.State == 'Z' || st.State == 'X':
		return fmt.Sprintf("pid %d has exited (zombie)", pid)
	case st.StartTime != start:
		return fmt.Sprintf("pid %d was reused (start time %d, registered %d)", pid, st.StartTime, start)
	}
	return ""
}
