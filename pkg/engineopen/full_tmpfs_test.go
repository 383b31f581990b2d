// SPDX-License-Identifier: Apache-2.0

package engineopen_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/contract"
)

// A registry root whose tmpfs another tenant filled: the rank cannot
// register, says why (the folder and the size), and the engine opens with
// PXN off, every write going direct, instead of failing or faulting.
func TestOpenOnFullTmpfsSendsDirect(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs of its own")
	}
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=4m,mode=0755"); err != nil {
		t.Skipf("cannot mount a tmpfs at %s: %v", root, err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	f, err := os.Create(filepath.Join(root, "other-tenant"))
	if err != nil {
		t.Fatal(err)
	}
	for buf := make([]byte, 64<<10); ; {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v, want ENOSPC at the end", root, err)
			}
			break
		}
	}
	f.Close()

	e, logged := open(t, map[string]string{contract.EnvEnable: "1", contract.EnvGroupID: "job", contract.EnvRegistryRoot: root})
	if e.PXNActive() {
		t.Fatal("PXN on over a full registry tmpfs")
	}
	all := strings.Join(logged, "\n")
	if !strings.Contains(all, "PXN registry unavailable; sending direct") || !strings.Contains(all, "no room for") || !strings.Contains(all, root) {
		t.Errorf("logged %q; want the registry refused, naming the folder under %s and the size", logged, root)
	}
}
