// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/group"
	"k8s.io/klog/v2"
)

var testOwner = group.Owner{Namespace: "ns", Pods: []string{"p-0"}}

func newTestStore(t *testing.T) *Store {
	t.Helper()
	base := t.TempDir()
	s := NewStore(filepath.Join(base, "state"), filepath.Join(base, "shm"), klog.Background())
	if err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	return s
}

func assertLink(t *testing.T, s *Store, id, key string) {
	t.Helper()
	target, err := os.Readlink(s.SlotPath(id))
	if err != nil {
		t.Fatalf("slot %s: %v", id, err)
	}
	if target != s.GroupPath(key) {
		t.Fatalf("slot %s → %s, want %s", id, target, s.GroupPath(key))
	}
}

func TestLinkCreatesWorldWritableStickyGroupDir(t *testing.T) {
	s := newTestStore(t)
	key := s.keys.Key("ns", group.SourceUID, "u1")
	dir, err := s.Link([]string{"pxn-relay-00", "pxn-relay-01"}, key, testOwner, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Fatalf("group dir mode %v, want drwxrwxrwt", fi.Mode())
	}
	assertLink(t, s, "pxn-relay-00", key)
	assertLink(t, s, "pxn-relay-01", key)
}

func TestLinkReplacesOldLinkAndEmptyDir(t *testing.T) {
	s := newTestStore(t)
	k1, k2 := s.keys.Key("ns", group.SourceUID, "u1"), s.keys.Key("ns", group.SourceUID, "u2")
	if _, err := s.Link([]string{"pxn-relay-00"}, k1, testOwner, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link([]string{"pxn-relay-00"}, k2, testOwner, time.Now()); err != nil {
		t.Fatal(err)
	}
	assertLink(t, s, "pxn-relay-00", k2)

	// A runtime that found no link creates an empty directory in its place.
	if err := os.Mkdir(s.SlotPath("pxn-relay-01"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link([]string{"pxn-relay-01"}, k1, testOwner, time.Now()); err != nil {
		t.Fatal(err)
	}
	assertLink(t, s, "pxn-relay-01", k1)

	entries, _ := os.ReadDir(filepath.Dir(s.SlotPath("x")))
	if len(entries) != 2 {
		t.Fatalf("slots dir holds %d entries, want 2 (no temporary links left)", len(entries))
	}
}

func TestLinkRestoresGroupDirMode(t *testing.T) {
	s := newTestStore(t)
	key := s.keys.Key("ns", group.SourceUID, "u1")
	if err := os.Mkdir(s.GroupPath(key), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link([]string{"pxn-relay-00"}, key, testOwner, time.Now()); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Lstat(s.GroupPath(key))
	if fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Fatalf("mode %v, want drwxrwxrwt", fi.Mode())
	}
}

func TestLinkRefusesSymlinkedGroupDir(t *testing.T) {
	s := newTestStore(t)
	key := s.keys.Key("ns", group.SourceUID, "u1")
	outside := t.TempDir()
	if err := os.Symlink(outside, s.GroupPath(key)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link([]string{"pxn-relay-00"}, key, testOwner, time.Now()); err == nil {
		t.Fatal("Link followed a symlinked group directory")
	}
	fi, _ := os.Stat(outside)
	if fi.Mode().Perm() == 0o777 {
		t.Fatal("Link changed the mode of a directory outside shm-dir")
	}
}

func TestPrepareRefusesWritableByOthers(t *testing.T) {
	base := t.TempDir()
	shm := filepath.Join(base, "shm")
	if err := os.Mkdir(shm, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shm, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := NewStore(filepath.Join(base, "state"), shm, klog.Background()).Prepare(); err == nil {
		t.Fatal("Prepare accepted a world-writable shm-dir")
	}
}

func TestCollect(t *testing.T) {
	const grace = time.Minute
	s := newTestStore(t)
	t0 := time.Now()
	live, dead := s.keys.Key("ns", group.SourceUID, "live"), s.keys.Key("ns", group.SourceUID, "dead")
	if _, err := s.Link([]string{"pxn-relay-00"}, live, testOwner, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link([]string{"pxn-relay-01", "pxn-relay-02"}, dead, testOwner, t0); err != nil {
		t.Fatal(err)
	}

	// A rank left a file and a link pointing out of shm-dir in the dead group.
	outside := t.TempDir()
	keep := filepath.Join(outside, "keep")
	if err := os.WriteFile(keep, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	rankDir := filepath.Join(s.GroupPath(dead), "mooncake-pxn-1000-k8s")
	if err := os.Mkdir(rankDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(rankDir, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rankDir, "ctl.0"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	assigned := map[string]group.Owner{"pxn-relay-00": testOwner}
	steps := []struct {
		at                       time.Duration
		wantSlots, wantGroups    int
		wantDeadLink, wantDeadGr bool
	}{
		{at: grace / 2, wantDeadLink: true, wantDeadGr: true},     // links too young to remove
		{at: grace + time.Second, wantSlots: 2, wantDeadGr: true}, // links gone, group last seen at t0+grace/2
		{at: grace + grace/2, wantDeadGr: true},                   // group unreferenced for grace/2
		{at: 2*grace + time.Second, wantGroups: 1},                // unreferenced for longer than grace
	}
	for _, st := range steps {
		slots, groups, err := s.Collect(assigned, t0.Add(st.at), grace)
		if err != nil {
			t.Fatalf("at %v: %v", st.at, err)
		}
		if slots != st.wantSlots || groups != st.wantGroups {
			t.Fatalf("at %v: removed %d slots, %d groups; want %d, %d", st.at, slots, groups, st.wantSlots, st.wantGroups)
		}
		_, err = os.Lstat(s.SlotPath("pxn-relay-01"))
		if (err == nil) != st.wantDeadLink {
			t.Fatalf("at %v: dead slot link present=%v", st.at, err == nil)
		}
		_, err = os.Lstat(s.GroupPath(dead))
		if (err == nil) != st.wantDeadGr {
			t.Fatalf("at %v: dead group present=%v", st.at, err == nil)
		}
		assertLink(t, s, "pxn-relay-00", live)
		if _, err := os.Stat(s.GroupPath(live)); err != nil {
			t.Fatalf("at %v: live group removed: %v", st.at, err)
		}
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("collection followed a link out of shm-dir: %v", err)
	}
}

func TestCollectKeepsUnknownEntries(t *testing.T) {
	s := newTestStore(t)
	other := filepath.Join(filepath.Dir(s.GroupPath("x")), "not-a-group")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, _, err := s.Collect(nil, time.Now().Add(time.Duration(i)*time.Hour), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("collection removed a directory it does not own: %v", err)
	}
}

// owners reads every owner record of s: file name → owner.
func owners(t *testing.T, s *Store) map[string]group.Owner {
	t.Helper()
	names, err := group.ListOwners(s.ownersDir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]group.Owner{}
	for _, files := range names {
		for _, f := range files {
			o, err := group.ReadOwner(filepath.Join(s.ownersDir, f))
			if err != nil {
				t.Fatal(err)
			}
			out[f] = o
		}
	}
	return out
}

// TestOwnerRecordsFollowSlotLinks: Link records the pod of each device in
// the device's group; moving a slot moves its record; collection removes
// the records of removed links, writes one for a link that lacks it (made
// before the records existed) and leaves records it does not own.
func TestOwnerRecordsFollowSlotLinks(t *testing.T) {
	const grace = time.Minute
	s := newTestStore(t)
	t0 := time.Now()
	k1, k2 := s.keys.Key("ns", group.SourceUID, "u1"), s.keys.Key("ns", group.SourceUID, "u2")
	a, b := group.Owner{Namespace: "ns", Pods: []string{"a"}}, group.Owner{Namespace: "ns", Pods: []string{"b"}}
	if _, err := s.Link([]string{"pxn-relay-00", "pxn-relay-01"}, k1, a, t0); err != nil {
		t.Fatal(err)
	}
	rec := func(key, dev string) string { return group.OwnerRecordName(key, group.OwnerSlotPrefix+dev) }
	want := map[string]group.Owner{rec(k1, "pxn-relay-00"): a, rec(k1, "pxn-relay-01"): a}
	if got := owners(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("after Link: records %v, want %v", got, want)
	}
	if _, err := s.Link([]string{"pxn-relay-01"}, k2, b, t0); err != nil {
		t.Fatal(err)
	}
	want = map[string]group.Owner{rec(k1, "pxn-relay-00"): a, rec(k2, "pxn-relay-01"): b}
	if got := owners(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("after moving pxn-relay-01: records %v, want %v", got, want)
	}

	// A link from before the records, and a DRA claim's record in the
	// same owners folder.
	if err := os.Symlink(s.GroupPath(k2), s.SlotPath("pxn-relay-02")); err != nil {
		t.Fatal(err)
	}
	claim := group.Owner{Namespace: "ns", Pods: []string{"c"}, Claim: "job"}
	if err := group.WriteOwner(s.ownersDir, k2, group.OwnerClaimPrefix+"uid-c", claim); err != nil {
		t.Fatal(err)
	}
	// pxn-relay-00 is no longer assigned; the kubelet says pod c2 holds
	// pxn-relay-02.
	c2 := group.Owner{Namespace: "ns", Pods: []string{"c2"}}
	assigned := map[string]group.Owner{"pxn-relay-01": b, "pxn-relay-02": c2}
	if _, _, err := s.Collect(assigned, t0.Add(grace+time.Second), grace); err != nil {
		t.Fatal(err)
	}
	want = map[string]group.Owner{
		rec(k2, "pxn-relay-01"): b, rec(k2, "pxn-relay-02"): c2,
		group.OwnerRecordName(k2, group.OwnerClaimPrefix+"uid-c"): claim,
	}
	if got := owners(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("after collection: records %v, want %v", got, want)
	}
}
