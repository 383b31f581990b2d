// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// startChildIn is startChild, in a PID and mount namespace of the child's
// own when ns is set (the child then mounts its /proc: --own-proc).
func startChildIn(name string, ns bool, env []string, args ...string) (*child, error) {
	if !ns {
		return startChild(name, env, args...)
	}
	c, err := startChildAttr(name, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}, env, args...)
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) {
		return nil, fmt.Errorf("--pidns: %w (new PID and mount namespaces need root, CAP_SYS_ADMIN)", err)
	}
	return c, err
}

// mountOwnProc is the first step of a process started as the first of new
// PID and mount namespaces: its mounts stop propagating to the parent's
// namespace, and /proc shows its PID namespace, as in a pod without
// hostPID.
func mountOwnProc() error {
	if pid := os.Getpid(); pid != 1 {
		return fmt.Errorf("--own-proc: this process is pid %d, not the first of a new PID namespace", pid)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("--own-proc: make the new mount namespace private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("--own-proc: mount /proc: %w", err)
	}
	return nil
}

// shareCounts are the relays' arenas a rank mapped, by the way each relay
// shared it, and how the rank shares its own.
type shareCounts struct {
	// Own is how this rank's arena is shared (fd or ipc).
	Own       string `json:"own,omitempty"`
	FD        uint64 `json:"fd"`
	IPC       uint64 `json:"ipc"`
	FailedFD  uint64 `json:"failedFd"`
	FailedIPC uint64 `json:"failedIpc"`
	// OwnFD and OwnIPC count the ranks of a sum by their own arena's way.
	OwnFD  int `json:"ownFd,omitempty"`
	OwnIPC int `json:"ownIpc,omitempty"`
}

// arenaSharer is a rank device whose arenas count their maps.
type arenaSharer interface {
	arenaShares() *shareCounts
}

func (s *shareCounts) add(o shareCounts) {
	s.FD += o.FD
	s.IPC += o.IPC
	s.FailedFD += o.FailedFD
	s.FailedIPC += o.FailedIPC
	switch o.Own {
	case "fd":
		s.OwnFD++
	case "ipc":
		s.OwnIPC++
	}
}

// shareRow says how the ranks' arenas were shared: the row is verified when
// no relay's arena failed to map.
func shareRow(prefix string, p *phaseResult, pidns bool) (Row, bool) {
	s := p.shares
	if s.OwnFD+s.OwnIPC == 0 && s.FD+s.IPC+s.FailedFD+s.FailedIPC == 0 {
		return Row{}, false
	}
	where := "ranks in one PID namespace"
	if pidns {
		where = "each rank in a PID namespace of its own"
	}
	notes := []string{fmt.Sprintf("arena shares: fd %d, ipc %d", s.FD, s.IPC)}
	if s.FailedFD+s.FailedIPC > 0 {
		notes = append(notes, fmt.Sprintf("failed maps: fd %d, ipc %d (those relays are not used)", s.FailedFD, s.FailedIPC))
	}
	notes = append(notes, fmt.Sprintf("own arenas: %d by descriptor, %d by IPC handle", s.OwnFD, s.OwnIPC), where)
	return Row{Scenario: prefix + "relays' arenas mapped by descriptor (fd) of all mapped",
		Value: float64(s.FD), Unit: fmt.Sprintf("of %d", s.FD+s.IPC), Verified: s.FailedFD+s.FailedIPC == 0,
		Note: strings.Join(notes, "; ")}, true
}
