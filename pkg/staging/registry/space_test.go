// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// mountSmallTmpfs mounts a tmpfs of 32 MiB, room for three control files,
// as a test's whole node tmpfs, and skips when it cannot.
func mountSmallTmpfs(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs of its own")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=32m,mode=0755"); err != nil {
		t.Skipf("cannot mount a tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// fillFolder writes a file into dir until its file system is full.
func fillFolder(t *testing.T, dir string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "filler"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v, want ENOSPC at the end", dir, err)
			}
			return
		}
	}
}

// A tmpfs another group filled up makes a rank's registration fail with
// an error naming the folder and the size; no process takes a signal, the
// failed rank leaves nothing behind, and the other group's rank, whose
// control file got its blocks when it was created, still beats.
func TestSpaceFullTmpfsFailsRegistrationNotTheProcess(t *testing.T) {
	root := mountSmallTmpfs(t)
	other := mustRegister(t, regOptions(root, "other", "rail9"))
	fillFolder(t, groupDir(root, "other"))

	c := startRegChild(t, childOpts{root: root, group: "g"})
	got := c.expect("register-error")
	want := fmt.Sprintf("no room for %s", folder.TmpPrefix)
	size := fmt.Sprintf("(%d bytes) in %s", staging.ControlSize, groupDir(root, "g"))
	if !strings.Contains(got, want) || !strings.Contains(got, size) || !strings.Contains(got, StepCreateControl.String()) {
		t.Errorf("register-error %q; want %q, %q and the step", got, want, size)
	}
	<-c.done
	var exit *exec.ExitError
	if !errors.As(c.err, &exit) || exit.ExitCode() != 3 {
		t.Errorf("the registrant ended with %v, want exit status 3 and no signal; stderr:\n%s", c.err, c.stderr.String())
	}
	if names := listDir(t, groupDir(root, "g")); !slices.Equal(names, []string{folder.LockFileName}) {
		t.Errorf("the failed rank left %v", names)
	}
	if !other.Heartbeat(staging.MonoNanos() + int64(heartbeatPeriod)) {
		t.Errorf("the other group's rank did not beat")
	}
	if _, err := other.Peers(context.Background()); err != nil {
		t.Errorf("the other group's Peers: %v", err)
	}
}
