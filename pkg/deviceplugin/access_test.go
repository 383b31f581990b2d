// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/internal/testuid"
	"github.com/pxn-project/pxn/pkg/group"
)

// A process of another uid that sees the host's shm folder (a hostIPC pod)
// and knows the group's namespace and label reaches nothing of the group;
// a rank of that uid with the folder mounted works in it.
func TestOtherUIDReachesNoGroupFolder(t *testing.T) {
	testuid.Require(t)
	base := testuid.OpenTempDir(t)
	shm := filepath.Join(base, "shm")
	// As the kubelet makes a hostPath folder: open to everyone.
	if err := os.Mkdir(shm, 0o755); err != nil {
		t.Fatal(err)
	}
	s := NewStore(filepath.Join(base, "state"), shm, klog.Background())
	if err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	key, err := s.GroupKey("team-a", group.SourceLabel, "job-1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir, err := s.Link([]string{"pxn-relay-00"}, key, testOwner, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "planted"), []byte("x"), 0o666); err != nil {
		t.Fatal(err)
	}
	guess := filepath.Join(s.groupsDir, group.UnkeyedKey("team-a", group.SourceLabel, "job-1"))
	if guess == dir {
		t.Fatalf("the group folder %s has the name anyone can compute", dir)
	}

	if out, err := testuid.Run(t, "ls "+shm); err != nil {
		t.Fatalf("uid %d cannot list %s, so the checks below prove nothing: %v: %s", testuid.Other, shm, err, out)
	}
	for _, c := range []struct{ what, script string }{
		{"list the group folders", "ls " + s.groupsDir},
		{"list the owner records", "ls " + s.ownersDir},
		{"list the slot links", "ls " + s.slotsDir},
		{"read a slot link", "readlink " + s.SlotPath("pxn-relay-00")},
		{"find the group folder", "stat " + dir},
		{"open a file in the group folder", "cat " + filepath.Join(dir, "planted")},
		{"create a file in the group folder", "touch " + filepath.Join(dir, "new")},
		{"create a registry in the group folder", "mkdir " + filepath.Join(dir, "mooncake-pxn-65534-k8s")},
		{"create the group folder under its public name", "mkdir " + guess},
	} {
		if out, err := testuid.Run(t, c.script); err == nil {
			t.Errorf("uid %d could %s (%s): %s", testuid.Other, c.what, c.script, out)
		}
	}

	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const reg = "mooncake-pxn-65534-k8s"
	if out, err := testuid.Run(t, "mkdir -m 0700 /proc/self/fd/3/"+reg+" && touch /proc/self/fd/3/"+reg+"/ctl", f); err != nil {
		t.Fatalf("a rank of uid %d with the group folder cannot make its registry in it: %v: %s", testuid.Other, err, out)
	}
	fi, err := os.Stat(filepath.Join(dir, reg, "ctl"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != testuid.Other {
		t.Fatalf("the rank's file is owned by uid %d, want %d", uid, testuid.Other)
	}
	names, err := f.Readdirnames(-1)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	if want := []string{reg, "planted"}; !slices.Equal(names, want) {
		t.Fatalf("group folder holds %v, want %v", names, want)
	}
	if _, err := os.Lstat(guess); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s: %v, want none", guess, err)
	}
}

// A node where an earlier version made open folders and named group folders
// without the secret: the folders are closed, a live group keeps its folder
// for new members and collection, a new group gets a keyed name, and keys
// stay the same across restarts.
func TestStoreUpgradesOpenUnkeyedLayout(t *testing.T) {
	base := t.TempDir()
	state, shm := filepath.Join(base, "state"), filepath.Join(base, "shm")
	slots, groups, owners := filepath.Join(state, "slots"), filepath.Join(shm, "groups"), filepath.Join(shm, "owners")
	old := group.UnkeyedKey("team-a", group.SourceLabel, "job-1")
	for _, d := range []string{slots, groups, owners} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(groups, old), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := group.EnsureDir(filepath.Join(groups, old)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(groups, old), filepath.Join(slots, "pxn-relay-00")); err != nil {
		t.Fatal(err)
	}

	s := NewStore(state, shm, klog.Background())
	if err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{slots, groups, owners} {
		fi, err := os.Lstat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != group.ClosedDirMode {
			t.Errorf("%s has mode %v after Prepare, want %#o", d, fi.Mode().Perm(), group.ClosedDirMode)
		}
	}
	now := time.Now()
	key, err := s.GroupKey("team-a", group.SourceLabel, "job-1", now)
	if err != nil {
		t.Fatal(err)
	}
	if key != old {
		t.Fatalf("a new member of the live group gets folder %s, not its group's %s", key, old)
	}
	if _, err := s.Link([]string{"pxn-relay-01"}, key, testOwner, now); err != nil {
		t.Fatal(err)
	}
	assertLink(t, s, "pxn-relay-00", old)
	assertLink(t, s, "pxn-relay-01", old)
	assigned := map[string]group.Owner{"pxn-relay-00": testOwner, "pxn-relay-01": testOwner}
	if _, n, err := s.Collect(assigned, now.Add(time.Hour), time.Minute); err != nil || n != 0 {
		t.Fatalf("Collect removed %d group folders (%v), want the live one kept", n, err)
	}

	fresh, err := s.GroupKey("team-b", group.SourceLabel, "job-1", now)
	if err != nil {
		t.Fatal(err)
	}
	if fresh == group.UnkeyedKey("team-b", group.SourceLabel, "job-1") || fresh != s.keys.Key("team-b", group.SourceLabel, "job-1") {
		t.Fatalf("a new group gets folder %s, want the keyed name", fresh)
	}

	again := NewStore(state, shm, klog.Background())
	if err := again.Prepare(); err != nil {
		t.Fatal(err)
	}
	if k := again.keys.Key("team-b", group.SourceLabel, "job-1"); k != fresh {
		t.Fatalf("after a restart the group's key is %s, was %s", k, fresh)
	}
}
