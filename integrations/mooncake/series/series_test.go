// SPDX-License-Identifier: Apache-2.0

package series

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A patch of one changed file (two hunks) and one new file.
const testPatch = `Subject: [PATCH] test

diff --git a/src/a.txt b/src/a.txt
index 1111111..2222222 100644
--- a/src/a.txt
+++ b/src/a.txt
@@ -1,3 +1,5 @@
 one
+#ifdef X
+#include "x.h"
+#endif
-two
 three
@@ -6,2 +8,3 @@
 six
 seven
+eight
diff --git a/src/new.txt b/src/new.txt
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/src/new.txt
@@ -0,0 +1,3 @@
+first
+second
+third
`

const testBase = "one\ntwo\nthree\nfour\nfive\nsix\nseven\n"

func testDef(body string) string {
	return "base 0123456\nauthor T <t@example.com>\n" + body
}

func cut(t *testing.T, def string) *Split {
	t.Helper()
	p, err := ParsePatch([]byte(testPatch))
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseDefinition(strings.NewReader(def))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Cut(p, d)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestAtSplitsHunks: a hunk's changed lines split between commits give each
// commit's file as the definition says, and the last commit's is the whole
// patch's.
func TestAtSplitsHunks(t *testing.T) {
	s := cut(t, testDef(`
commit first
take src/a.txt 1:1,3-4
take src/new.txt 1:1
| one
commit second
take src/a.txt 1:2 2
take src/new.txt 1:2-3
| two
`))
	a, n := s.Patch.File("src/a.txt"), s.Patch.File("src/new.txt")
	cases := []struct {
		k          int
		a, n       string
		newPresent bool
	}{
		{0, testBase, "", false},
		{1, "one\n#ifdef X\n#endif\nthree\nfour\nfive\nsix\nseven\n", "first\n", true},
		{2, "one\n#ifdef X\n#include \"x.h\"\n#endif\nthree\nfour\nfive\nsix\nseven\neight\n", "first\nsecond\nthird\n", true},
	}
	for _, c := range cases {
		got, ok, err := s.At(a, []byte(testBase), c.k)
		if err != nil || !ok || string(got) != c.a {
			t.Errorf("a.txt after %d commits: %q, %v, %v; want %q", c.k, got, ok, err, c.a)
		}
		got, ok, err = s.At(n, nil, c.k)
		if err != nil || ok != c.newPresent || string(got) != c.n {
			t.Errorf("new.txt after %d commits: %q, %v, %v; want %q, present %v", c.k, got, ok, err, c.n, c.newPresent)
		}
	}
	if got := s.Touched(1); len(got) != 2 {
		t.Errorf("commit 1 touches %d files, want 2", len(got))
	}
	if got := s.Touched(2); len(got) != 2 {
		t.Errorf("commit 2 touches %d files, want 2", len(got))
	}
}

// TestCutRefuses: a definition that leaves a line out, takes one twice,
// names what the patch lacks or makes an empty commit is refused, naming it.
func TestCutRefuses(t *testing.T) {
	cases := []struct {
		name, def, want string
	}{
		{"line left out", `
commit c
take src/a.txt 1:1-3 2
take src/new.txt
| s
`, `src/a.txt hunk 1 line 4 (-two)`},
		{"line taken twice", `
commit c
take src/a.txt
take src/new.txt
| s
commit d
take src/a.txt 2:1
| t
`, `src/a.txt hunk 2 line 1 (+eight) is taken by commits 1 and 2`},
		{"unknown file", `
commit c
take src/b.txt
| s
`, `takes src/b.txt, which the patch does not change`},
		{"hunk out of range", `
commit c
take src/a.txt 3
| s
`, `hunk 3 of src/a.txt, which has 2`},
		{"line out of range", `
commit c
take src/a.txt 2:2
| s
`, `line 2 of hunk 2 of src/a.txt, which changes 1 lines`},
	}
	p, err := ParsePatch([]byte(testPatch))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := ParseDefinition(strings.NewReader(testDef(c.def)))
			if err != nil {
				t.Fatal(err)
			}
			_, err = Cut(p, d)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Cut: %v; want an error saying %q", err, c.want)
			}
		})
	}
}

// TestParseDefinitionRefuses: malformed definitions are refused, naming the
// line or the commit.
func TestParseDefinitionRefuses(t *testing.T) {
	cases := []struct {
		name, def, want string
	}{
		{"no base", "author T <t@x>\ncommit c\ntake f\n| s\n", "no base commit"},
		{"message first", testDef("| s\n"), "line 3: a message line before any commit"},
		{"unknown directive", testDef("commit c\ntakes f\n"), `line 4: unknown directive "takes"`},
		{"bad hunk", testDef("commit c\ntake f x\n| s\n"), `hunk "x" is not a number from 1`},
		{"bad lines", testDef("commit c\ntake f 1:3-2\n| s\n"), `bad range "3-2"`},
		{"no subject", testDef("commit c\ntake f\n"), "commit 1 (c) has no message subject"},
		{"takes nothing", testDef("commit c\n| s\n"), "commit 1 (c) takes nothing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseDefinition(strings.NewReader(c.def))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("ParseDefinition: %v; want an error saying %q", err, c.want)
			}
		})
	}
}

// TestAtRefusesOtherBase: a base whose lines differ from the patch's context
// is refused, naming the line, not patched with fuzz.
func TestAtRefusesOtherBase(t *testing.T) {
	s := cut(t, testDef("commit c\ntake src/a.txt\ntake src/new.txt\n| s\n"))
	_, _, err := s.At(s.Patch.File("src/a.txt"), []byte("one\nTWO\nthree\nfour\nfive\nsix\nseven\n"), 1)
	if err == nil || !strings.Contains(err.Error(), `line 2 of the base is not "two"`) {
		t.Errorf("At on another base: %v; want an error naming line 2", err)
	}
}

// TestParsePatchRefuses: what the cutter cannot split is refused.
func TestParsePatchRefuses(t *testing.T) {
	cases := []struct{ name, patch, want string }{
		{"deleted file", "diff --git a/f b/f\ndeleted file mode 100644\n", "only changed and new text files"},
		{"short hunk", "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n", "ends inside a hunk of f"},
		{"no newline", "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n\\ No newline at end of file\n", "without a final newline"},
		{"nothing", "Subject: x\n", "changes no file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParsePatch([]byte(c.patch))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("ParsePatch: %v; want an error saying %q", err, c.want)
			}
		})
	}
}

// TestGenerateAndCheckLast makes a two-commit series with git on a small
// tree, checks it against patch(1)'s whole-patch tree, and then sees the
// check name a file that differs.
func TestGenerateAndCheckLast(t *testing.T) {
	for _, tool := range []string{"git", "patch"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s not found", tool)
		}
	}
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	for path, content := range map[string]string{
		"mooncake-transfer-engine/CMakeLists.txt": "x\n",
		"src/a.txt": testBase,
	} {
		p := filepath.Join(base, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	patchFile := filepath.Join(dir, "p.patch")
	if err := os.WriteFile(patchFile, []byte(testPatch), 0o644); err != nil {
		t.Fatal(err)
	}
	s := cut(t, testDef(`
commit first
take src/a.txt 1:1,3-4
| Add the guard
|
| Body.
commit second
take src/a.txt 1:2 2
take src/new.txt
| Add the rest
`))
	ctx := context.Background()
	out := filepath.Join(dir, "out")
	res, err := Generate(ctx, s, base, out)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Commits) != 2 || len(res.Patches) != 2 {
		t.Fatalf("got commits %v and patches %v, want 2 of each", res.Commits, res.Patches)
	}
	first, err := os.ReadFile(res.Patches[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Subject: [PATCH 1/2] Add the guard", "Body.", "+#ifdef X", " src/a.txt | 3 ++-"} {
		if !strings.Contains(string(first), want) {
			t.Errorf("the first patch lacks %q:\n%s", want, first)
		}
	}
	if strings.Contains(string(first), "x.h") || strings.Contains(string(first), "new.txt") {
		t.Errorf("the first patch holds the second commit's lines:\n%s", first)
	}
	if err := CheckLast(ctx, res, base, patchFile, out); err != nil {
		t.Fatalf("CheckLast on a faithful series: %v", err)
	}

	if err := os.WriteFile(filepath.Join(res.Repo, "src", "new.txt"), []byte("first\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(out, "whole")); err != nil {
		t.Fatal(err)
	}
	err = CheckLast(ctx, res, base, patchFile, out)
	if err == nil || !strings.Contains(err.Error(), "differs from the tree with the whole patch in: src/new.txt") {
		t.Errorf("CheckLast with src/new.txt changed: %v; want it named", err)
	}
}
