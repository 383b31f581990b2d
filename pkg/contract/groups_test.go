// SPDX-License-Identifier: Apache-2.0

package contract

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestIsGroupKey(t *testing.T) {
	for name, want := range map[string]bool{
		"0123456789abcdef":  true,
		"ffffffffffffffff":  true,
		"0123456789abcde":   false,
		"0123456789abcdef0": false,
		"0123456789ABCDEF":  false,
		"0123456789abcdeg":  false,
		"../3456789abcdef":  false,
		"":                  false,
	} {
		if got := IsGroupKey(name); got != want {
			t.Errorf("IsGroupKey(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestReadSlots lays out a state folder as the device plugin does and
// reads back only the links that point at a group folder.
func TestReadSlots(t *testing.T) {
	state, shm := t.TempDir(), t.TempDir()
	slots := SlotsDir(state)
	if err := os.MkdirAll(slots, 0o755); err != nil {
		t.Fatal(err)
	}
	link := func(name, target string) {
		t.Helper()
		if err := os.Symlink(target, filepath.Join(slots, name)); err != nil {
			t.Fatal(err)
		}
	}
	link("dev-0", filepath.Join(GroupsDir(shm), "0123456789abcdef"))
	link("dev-1", filepath.Join(GroupsDir(shm), "fedcba9876543210"))
	link("dev-2", filepath.Join(state, "empty"))                          // a runtime's empty folder
	link(".dev-3.tmp", filepath.Join(GroupsDir(shm), "0123456789abcdef")) // a link being replaced
	if err := os.WriteFile(filepath.Join(slots, "dev-4"), nil, 0o644); err != nil {
		t.Fatal(err) // not a link
	}
	got, err := ReadSlots(state)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"dev-0": "0123456789abcdef", "dev-1": "fedcba9876543210"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ReadSlots = %v, want %v", got, want)
	}
	if _, err := ReadSlots(filepath.Join(state, "absent")); err == nil {
		t.Error("ReadSlots of a missing state folder returned no error")
	}
}
