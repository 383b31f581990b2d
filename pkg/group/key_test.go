// SPDX-License-Identifier: Apache-2.0

package group

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/contract"
)

func testKeyer(t testing.TB) *Keyer {
	t.Helper()
	k, err := LoadKeyer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKeyIsUnambiguous(t *testing.T) {
	type triple struct{ ns, source, id string }
	pairs := []struct {
		name string
		a, b triple
	}{
		{"namespace/identity boundary", triple{"a", SourcePodName, "bc"}, triple{"ab", SourcePodName, "c"}},
		{"slash inside a field", triple{"a/b", SourcePodName, "c"}, triple{"a", SourcePodName, "b/c"}},
		{"separator-like bytes", triple{"a\x00", SourceLabel, "b"}, triple{"a", SourceLabel, "\x00b"}},
		{"source boundary", triple{"ns", "label", "x"}, triple{"ns", "labe", "lx"}},
		{"label vs uid", triple{"ns", SourceLabel, "x"}, triple{"ns", SourceUID, "x"}},
		{"label vs pod name", triple{"ns", SourceLabel, "x"}, triple{"ns", SourcePodName, "x"}},
		{"same label, other namespace", triple{"team-a", SourceLabel, "job"}, triple{"team-b", SourceLabel, "job"}},
		{"empty fields", triple{"", SourceLabel, "ab"}, triple{"ab", SourceLabel, ""}},
	}
	k := testKeyer(t)
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			for name, key := range map[string]func(ns, source, id string) string{"keyed": k.Key, "unkeyed": UnkeyedKey} {
				ka := key(p.a.ns, p.a.source, p.a.id)
				kb := key(p.b.ns, p.b.source, p.b.id)
				if ka == kb {
					t.Fatalf("%s: Key%q == Key%q == %s", name, p.a, p.b, ka)
				}
				for _, k := range []string{ka, kb} {
					if !contract.IsGroupKey(k) {
						t.Fatalf("%s: key %q is not 16 lower-case hex digits", name, k)
					}
				}
			}
		})
	}
}

func TestUnkeyedKeyIsStable(t *testing.T) {
	// Folders made before keys took a secret are found by this name after
	// an upgrade; changing it would split every live group.
	if got, want := UnkeyedKey("default", SourceLabel, "job-1"), "c94935b066f42b16"; got != want {
		t.Fatalf("UnkeyedKey(default, label, job-1) = %s, want %s", got, want)
	}
}

func TestKeyTakesTheNodeSecret(t *testing.T) {
	a, b := testKeyer(t), testKeyer(t)
	ka, kb := a.Key("default", SourceLabel, "job-1"), b.Key("default", SourceLabel, "job-1")
	if ka == kb {
		t.Fatalf("two secrets give one key %s", ka)
	}
	if u := UnkeyedKey("default", SourceLabel, "job-1"); ka == u || kb == u {
		t.Fatalf("a keyed name is the public name %s", u)
	}
}

func TestLoadKeyerKeepsItsSecret(t *testing.T) {
	dir := t.TempDir()
	first, err := LoadKeyer(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, SecretFile)
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 || fi.Size() != SecretLen {
		t.Fatalf("secret %s: mode %v, %d bytes; want a regular 0600 file of %d", path, fi.Mode(), fi.Size(), SecretLen)
	}
	second, err := LoadKeyer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := first.Key("ns", SourceUID, "u"), second.Key("ns", SourceUID, "u"); a != b {
		t.Fatalf("keys changed across loads: %s, then %s", a, b)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("state folder holds %v (%v), want the secret alone", entries, err)
	}
}

func TestLoadKeyerRefusesBadSecret(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, path string)
		want  string
	}{
		{"short", func(t *testing.T, path string) { write(t, path, make([]byte, SecretLen-1), 0o600) }, "holds 31 bytes"},
		{"long", func(t *testing.T, path string) { write(t, path, make([]byte, SecretLen+1), 0o600) }, "more than 32 bytes"},
		{"readable by others", func(t *testing.T, path string) { write(t, path, make([]byte, SecretLen), 0o644) }, "want 0600"},
		{"directory", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"link", func(t *testing.T, path string) {
			target := filepath.Join(t.TempDir(), "secret")
			write(t, target, make([]byte, SecretLen), 0o600)
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, "too many levels of symbolic links"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, SecretFile)
			tc.setup(t, path)
			_, err := LoadKeyer(dir)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadKeyer = %v, want an error naming %s and saying %q", err, path, tc.want)
			}
		})
	}
}

func write(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func TestFolderKey(t *testing.T) {
	k := testKeyer(t)
	keyed, unkeyed := k.Key("ns", SourceLabel, "job"), UnkeyedKey("ns", SourceLabel, "job")
	for _, tc := range []struct {
		name    string
		present map[string]string // name → "dir" or "link"
		want    string
	}{
		{"none", nil, keyed},
		{"keyed", map[string]string{keyed: "dir"}, keyed},
		{"unkeyed, made before the upgrade", map[string]string{unkeyed: "dir"}, unkeyed},
		{"both", map[string]string{keyed: "dir", unkeyed: "dir"}, keyed},
		{"unkeyed is a link", map[string]string{unkeyed: "link"}, keyed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			groups := t.TempDir()
			for name, kind := range tc.present {
				var err error
				if kind == "dir" {
					err = os.Mkdir(filepath.Join(groups, name), 0o700)
				} else {
					err = os.Symlink(t.TempDir(), filepath.Join(groups, name))
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			got, err := k.FolderKey(groups, "ns", SourceLabel, "job")
			if err != nil || got != tc.want {
				t.Fatalf("FolderKey = %s, %v; want %s", got, err, tc.want)
			}
		})
	}
}

func FuzzKey(f *testing.F) {
	f.Add("a", "bc", "ab", "c")
	f.Add("a/b", "c", "a", "b/c")
	f.Add("", "", "", "")
	k, err := LoadKeyer(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ns1, id1, ns2, id2 string) {
		k1 := k.Key(ns1, SourceLabel, id1)
		k2 := k.Key(ns2, SourceLabel, id2)
		if !contract.IsGroupKey(k1) || !contract.IsGroupKey(k2) {
			t.Fatalf("malformed key %q or %q", k1, k2)
		}
		if (ns1 == ns2 && id1 == id2) != (k1 == k2) {
			t.Fatalf("(%q,%q)→%s vs (%q,%q)→%s", ns1, id1, k1, ns2, id2, k2)
		}
	})
}
