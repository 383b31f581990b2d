// SPDX-License-Identifier: Apache-2.0

package mooncake

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fakeTree makes dir hold what hack/mooncake.sh checks a Mooncake tree for.
func fakeTree(t *testing.T, dir string) string {
	t.Helper()
	for _, f := range []string{"mooncake-transfer-engine/CMakeLists.txt", "extern/yalantinglibs/CMakeLists.txt"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("cmake_minimum_required(VERSION 3.16)\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// testedCommit is the commit docs/integration-mooncake.md says is tested.
func testedCommit(t *testing.T, root string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(root, "docs", "integration-mooncake.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?m)^\\| tested \\| `([0-9a-f]{40})`").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/integration-mooncake.md has no tested commit row")
	}
	return string(m[1])
}

// TestMooncakeSource: where hack/mooncake.sh takes Mooncake's sources from
// for each combination of what a machine holds, and that with none it would
// fetch the documented commit with git into the cache. The fetch itself is
// not run (it needs the network).
func TestMooncakeSource(t *testing.T) {
	root := repoRoot(t)
	commit := testedCommit(t, root)
	const github = "https://github.com/kvcache-ai/Mooncake.git"
	clone := "mooncake-git-" + commit[:12]

	cases := []struct {
		name string
		// given: MOONCAKE_TREE is a tree; givenBad: a folder that is not one.
		given, givenBad bool
		reference       bool // the reference tree beside the clone exists
		fetched         bool // the cache holds a complete clone
		partial         bool // the cache holds a clone cut short
		env             []string
		want            string // {tree}, {reference}, {cache} stand for the folders
		wantErr         string
	}{
		{name: "given", given: true, reference: true, fetched: true, want: "tree {tree}"},
		{name: "given not a tree", givenBad: true, reference: true, wantErr: "not a Mooncake tree"},
		{name: "reference", reference: true, want: "tree {reference}"},
		{name: "reference before a clone", reference: true, fetched: true, want: "tree {reference}"},
		{name: "fetched clone", fetched: true, want: "tree {cache}/" + clone},
		{name: "nothing: fetch", want: "fetch " + github + " " + commit + " {cache}/" + clone},
		{name: "clone cut short: fetch again", partial: true, want: "fetch " + github + " " + commit + " {cache}/" + clone},
		{name: "other remote", env: []string{"MOONCAKE_GIT=file:///srv/git/Mooncake.git"},
			want: "fetch file:///srv/git/Mooncake.git " + commit + " {cache}/" + clone},
		{name: "fetch forbidden", env: []string{"MOONCAKE_FETCH=0"}, wantErr: "MOONCAKE_FETCH=0 forbids fetching " + commit},
		{name: "fetch forbidden, clone there", fetched: true, env: []string{"MOONCAKE_FETCH=0"}, want: "tree {cache}/" + clone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			cache := filepath.Join(base, "cache")
			tree := filepath.Join(base, "tree")
			reference := filepath.Join(base, "reference")
			var env []string
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "MOONCAKE_") && !strings.HasPrefix(kv, "PXN_TOOLS_DIR=") {
					env = append(env, kv)
				}
			}
			env = append(env, "PXN_TOOLS_DIR="+cache, "MOONCAKE_REFERENCE="+reference)
			switch {
			case c.given:
				env = append(env, "MOONCAKE_TREE="+fakeTree(t, tree))
			case c.givenBad:
				if err := os.MkdirAll(tree, 0o755); err != nil {
					t.Fatal(err)
				}
				env = append(env, "MOONCAKE_TREE="+tree)
			}
			if c.reference {
				fakeTree(t, reference)
			}
			if c.fetched || c.partial {
				fakeTree(t, filepath.Join(cache, clone))
			}
			if c.fetched {
				if err := os.WriteFile(filepath.Join(cache, clone, ".fetched"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			env = append(env, c.env...)
			want := strings.NewReplacer("{tree}", tree, "{reference}", reference, "{cache}", cache).Replace(c.want)

			for _, sub := range []string{"source", "tree"} {
				cmd := exec.Command(filepath.Join(root, "hack", "mooncake.sh"), sub)
				cmd.Env = env
				var stderr strings.Builder
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				got := strings.TrimSpace(string(out))
				switch {
				case c.wantErr != "":
					if err == nil || !strings.Contains(stderr.String(), c.wantErr) {
						t.Errorf("%s: got %q, %v, %q; want a failure saying %q", sub, got, err, stderr.String(), c.wantErr)
					}
				case sub == "source":
					if err != nil || got != want {
						t.Errorf("source: got %q (%v, %s), want %q", got, err, stderr.String(), want)
					}
				case strings.HasPrefix(want, "tree "):
					if err != nil || got != strings.TrimPrefix(want, "tree ") {
						t.Errorf("tree: got %q (%v, %s), want %q", got, err, stderr.String(), strings.TrimPrefix(want, "tree "))
					}
				default:
					if err == nil || !strings.Contains(stderr.String(), "no Mooncake tree yet") {
						t.Errorf("tree, with the clone not fetched: got %q, %v, %q; want a failure saying there is no tree yet", got, err, stderr.String())
					}
				}
			}
		})
	}
}

// TestWheelVersion: the wheel's version names Mooncake's version, PXN's
// release, the Mooncake commit, a configuration other than the default and
// extra CMake options, each of which changes it.
func TestWheelVersion(t *testing.T) {
	root := repoRoot(t)
	release, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	pxn := regexp.MustCompile(`[^A-Za-z0-9.]`).ReplaceAllString(strings.TrimSpace(string(release)), ".")
	tree := fakeTree(t, filepath.Join(t.TempDir(), "tree"))
	const commit = "0123456789abcdef0123456789abcdef01234567"
	cases := []struct {
		cfg  string
		env  []string
		want string
	}{
		{"default", nil, "0+pxn." + pxn + ".mc0123456789ab"},
		{"event", nil, "0+pxn." + pxn + ".mc0123456789ab.event"},
		{"default", []string{"MOONCAKE_VERSION=0.3.9"}, "0.3.9+pxn." + pxn + ".mc0123456789ab"},
		{"default", []string{"MOONCAKE_CMAKE_ARGS=-DUSE_CUDA=ON"}, "0+pxn." + pxn + ".mc0123456789ab.x"},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		cmd := exec.Command(filepath.Join(root, "hack", "mooncake-wheel.sh"), "version", c.cfg)
		cmd.Env = append(os.Environ(), "MOONCAKE_TREE="+tree, "MOONCAKE_COMMIT="+commit, "PXN_TOOLS_DIR="+t.TempDir())
		cmd.Env = append(cmd.Env, c.env...)
		out, err := cmd.Output()
		got := strings.TrimSpace(string(out))
		if err != nil || !strings.HasPrefix(got, c.want) || (!strings.HasSuffix(c.want, ".x") && got != c.want) {
			t.Errorf("%s %v: version %q (%v), want %q", c.cfg, c.env, got, err, c.want)
		}
		if seen[got] {
			t.Errorf("%s %v: version %q is another build's too", c.cfg, c.env, got)
		}
		seen[got] = true
	}
}
