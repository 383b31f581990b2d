// SPDX-License-Identifier: Apache-2.0

package group

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnsureDirMakesStickyWorldWritable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "g")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := EnsureDir(dir); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&(os.ModeType|os.ModePerm|os.ModeSticky) != os.ModeDir|DirMode {
			t.Fatalf("mode %v, want %v", fi.Mode(), os.ModeDir|DirMode)
		}
	}
}

func TestEnsureDirRefusesLink(t *testing.T) {
	root := t.TempDir()
	target := filepath.Join(root, "elsewhere")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "g")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := EnsureDir(link); err == nil || !strings.Contains(err.Error(), link) {
		t.Fatalf("EnsureDir(link) = %v, want an error naming %s", err, link)
	}
	fi, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("link target's mode changed to %v", fi.Mode())
	}
}

func TestCheckPrivateDir(t *testing.T) {
	root := t.TempDir()
	private := filepath.Join(root, "private")
	open := filepath.Join(root, "open")
	file := filepath.Join(root, "file")
	for _, d := range []string{private, open} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CheckPrivateDir(private); err != nil {
		t.Fatalf("private folder: %v", err)
	}
	for _, bad := range []string{open, file} {
		if err := CheckPrivateDir(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Fatalf("CheckPrivateDir(%s) = %v, want an error naming it", bad, err)
		}
	}
}
