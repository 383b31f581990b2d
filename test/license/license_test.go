// SPDX-License-Identifier: Apache-2.0

// Package license checks that the tree says under which license it is
// distributed, in the LICENSE file and in every source file.
package license

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/testtools"
)

const spdx = "SPDX-License-Identifier: Apache-2.0"

// sourceKind reports whether path is a source file that must carry the
// SPDX line: Go, C, C++ and CUDA sources and headers, shell scripts,
// Python sources, Makefiles, Dockerfiles and the CI entry point.
func sourceKind(path string) bool {
	switch filepath.Ext(path) {
	case ".go", ".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".sh", ".py":
		return true
	}
	switch filepath.Base(path) {
	case "Makefile", "Dockerfile":
		return true
	}
	return path == ".ci/run"
}

func TestLicenseFile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testtools.RepoRoot(), "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Apache License", "Version 2.0, January 2004", "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("LICENSE lacks %q", want)
		}
	}
}

func TestEverySourceFileHasSPDX(t *testing.T) {
	root := testtools.RepoRoot()
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skipf("%s is not a git checkout (%v): the file list comes from git ls-files", root, err)
	}
	cmd := exec.Command("git", "ls-files", "-co", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git ls-files in %s: %v", root, err)
	}
	checked := 0
	for _, path := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !sourceKind(path) {
			continue
		}
		ok, err := headHas(filepath.Join(root, path), 4)
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree, not yet in the index
			}
			t.Errorf("%s: %v", path, err)
			continue
		}
		checked++
		if !ok {
			t.Errorf("%s: no %q in its first lines", path, spdx)
		}
	}
	if checked < 100 {
		t.Errorf("checked only %d source files: the file list looks wrong", checked)
	}
}

// headHas reports whether one of the first n lines of the file holds the
// SPDX line.
func headHas(path string, n int) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i := 0; i < n && sc.Scan(); i++ {
		if strings.Contains(sc.Text(), spdx) {
			return true, nil
		}
	}
	return false, sc.Err()
}
