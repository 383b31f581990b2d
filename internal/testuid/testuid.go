// SPDX-License-Identifier: Apache-2.0

// Package testuid runs shell commands as another user, for tests that check
// what a process of a foreign uid on the same host can reach.
package testuid

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// Other is the uid and gid the commands run as: nobody's.
const Other = 65534

// Require skips t unless it runs as root, which it needs to start a
// process as Other.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root to run a process as uid %d (running as uid %d)", Other, os.Geteuid())
	}
}

// OpenTempDir returns a new folder that every user may enter and list, so
// that the folders a test makes below it are the only barrier a command
// of Other meets; t.TempDir's are closed to others by their parent.
func OpenTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pxn-uid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Run runs script with /bin/sh as uid and gid Other, with no
// supplementary groups, and files open from descriptor 3 on; it returns
// the command's output and its error.
func Run(t testing.TB, script string, files ...*os.File) (string, error) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: Other, Gid: Other, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
