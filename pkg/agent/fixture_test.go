// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/pxn-project/pxn/internal/testtools"
)

// railTestdata is pkg/rail's fixture folder.
func railTestdata(parts ...string) string {
	return filepath.Join(append([]string{testtools.RepoRoot(), "pkg", "rail", "testdata"}, parts...)...)
}

// copyFixture copies a sysfs fixture tree of pkg/rail into a temporary host
// root that the test may change. The tree's symlinks are relative, so they
// are copied as they are.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	src := railTestdata("sysfs", name)
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, out)
		case d.IsDir():
			return os.MkdirAll(out, 0o755)
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(out, b, 0o644)
		}
	})
	if err != nil {
		t.Fatalf("copy fixture %s: %v", name, err)
	}
	return dst
}

// setPortState replaces an HCA port's state file, as the kernel shows it,
// atomically: a poll never sees it half written.
func setPortState(t *testing.T, nodeRoot, hca, state string) {
	t.Helper()
	dir, err := filepath.EvalSymlinks(filepath.Join(nodeRoot, "sys", "class", "infiniband", hca, "ports", "1"))
	if err != nil {
		t.Fatalf("set port state: %v", err)
	}
	tmp := filepath.Join(dir, ".state.tmp")
	if err := os.WriteFile(tmp, []byte(state+"\n"), 0o644); err != nil {
		t.Fatalf("set port state: %v", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "state")); err != nil {
		t.Fatalf("set port state: %v", err)
	}
}
