// SPDX-License-Identifier: Apache-2.0

// Package tree checks what the repository holds: sources, not what a build
// makes from them.
package tree

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/testtools"
)

// elfMagic starts every executable, shared library and object file that a
// build on Linux writes.
var elfMagic = []byte{0x7f, 'E', 'L', 'F'}

func TestNoBuildOutputTracked(t *testing.T) {
	root := testtools.RepoRoot()
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skipf("%s is not a git checkout (%v): the file list comes from git ls-files", root, err)
	}
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", root, err)
	}
	checked := 0
	for _, path := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		head, err := readHead(filepath.Join(root, path), len(elfMagic))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree, not yet in the index
			}
			t.Fatalf("%s: %v", path, err)
		}
		checked++
		if bytes.Equal(head, elfMagic) {
			t.Errorf("%s is an ELF file (build output): remove it from git and ignore it", path)
		}
	}
	if checked == 0 {
		t.Fatalf("git ls-files listed no file in %s", root)
	}
}

func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, err
	}
	b := make([]byte, n)
	m, err := io.ReadFull(f, b)
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		return b[:m], nil
	}
	return b, err
}
