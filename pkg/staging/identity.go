// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Identity names one registration of one process, as rank headers and lane
// owners store it. StartTime tells a process from a later one that reuses
// its pid; Epoch, drawn at random for every registration and never 0, tells
// a registration from a later one of the same process.
type Identity struct {
	Pid       int
	StartTime uint64
	Epoch     uint64
}

func (id Identity) String() string {
	return fmt.Sprintf("pid %d start %d epoch %016x", id.Pid, id.StartTime, id.Epoch)
}

// PidNS names a PID namespace by the device and inode of its nsfs file
// (/proc/<pid>/ns/pid), as rank headers and lane owners store it. A pid and
// a process start time mean something only to a reader in the same PID
// namespace; the zero PidNS is no namespace.
type PidNS struct {
	Dev uint64
	Ino uint64
}

func (ns PidNS) String() string { return fmt.Sprintf("pid:[%d] on dev %d", ns.Ino, ns.Dev) }

// ReadPidNS identifies the PID namespace that path (a /proc/<pid>/ns/pid
// file) stands for.
func ReadPidNS(path string) (PidNS, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return PidNS{}, fmt.Errorf("PID namespace of %s: %w", path, err)
	}
	return PidNS{Dev: st.Dev, Ino: st.Ino}, nil
}

// SelfPidNS identifies the caller's PID namespace.
func SelfPidNS() (PidNS, error) { return ReadPidNS("/proc/self/ns/pid") }

// monoAnchor pairs one CLOCK_MONOTONIC reading with the same instant on the
// Go clock, whose monotonic part is CLOCK_MONOTONIC read through the vDSO.
var monoAnchor = sync.OnceValues(func() (int64, time.Time) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return ts.Nano(), time.Now()
})

// MonoNanos is CLOCK_MONOTONIC in nanoseconds. Heartbeats are stamped with
// it: it is one clock for every process of the machine, so a rank can judge
// another's stamp, and it never steps back. It costs no system call (the
// pump reads it every round). Ranks of one group must share a time
// namespace (pods of a node do: runtimes create none), not a PID one.
func MonoNanos() int64 {
	base, at := monoAnchor()
	return base + int64(time.Since(at))
}
