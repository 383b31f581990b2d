// SPDX-License-Identifier: Apache-2.0

package dra_test

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pxn-project/pxn/internal/testuid"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/group"
)

// A process of another uid that sees the host's shm folder and knows a
// claim's namespace and UID reaches nothing of its group folder.
func TestOtherUIDReachesNoClaimFolder(t *testing.T) {
	testuid.Require(t)
	dirs := newNodeDirs(t)
	for _, d := range []string{dirs.base, dirs.shm} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		// As the kubelet makes a hostPath folder: open to everyone.
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c := newClaim("team-a", "job-a", "uid-a")
	p := startPlugin(t, dirs, newClient(t, c), newRailState(readyState()))
	p.mustPrepare(t, c)
	dir := dirs.groupDir(t, c.Namespace, c.UID)
	if err := os.WriteFile(filepath.Join(dir, "planted"), []byte("x"), 0o666); err != nil {
		t.Fatal(err)
	}
	groups := contract.GroupsDir(dirs.shm)
	guess := filepath.Join(groups, group.UnkeyedKey(c.Namespace, group.SourceClaim, string(c.UID)))

	if out, err := testuid.Run(t, "ls "+dirs.shm); err != nil {
		t.Fatalf("uid %d cannot list %s, so the checks below prove nothing: %v: %s", testuid.Other, dirs.shm, err, out)
	}
	for _, check := range []struct{ what, script string }{
		{"list the group folders", "ls " + groups},
		{"list the owner records", "ls " + contract.OwnersDir(dirs.shm)},
		{"find the group folder", "stat " + dir},
		{"open a file in the group folder", "cat " + filepath.Join(dir, "planted")},
		{"create a file in the group folder", "touch " + filepath.Join(dir, "new")},
		{"create the group folder under its public name", "mkdir " + guess},
	} {
		if out, err := testuid.Run(t, check.script); err == nil {
			t.Errorf("uid %d could %s (%s): %s", testuid.Other, check.what, check.script, out)
		}
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if out, err := testuid.Run(t, "mkdir -m 0700 /proc/self/fd/3/mooncake-pxn-65534-k8s", f); err != nil {
		t.Fatalf("a rank of uid %d with the group folder cannot make its registry in it: %v: %s", testuid.Other, err, out)
	}
}

// A label's group whose folder a version before keyed names made keeps it:
// a claim prepared after the upgrade for a pod of that job joins it.
func TestExtendedResourceClaimJoinsUnkeyedFolder(t *testing.T) {
	dirs := newNodeDirs(t)
	old := filepath.Join(contract.GroupsDir(dirs.shm), group.UnkeyedKey("team-a", group.SourceLabel, "job"))
	if err := os.MkdirAll(old, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := group.EnsureDir(old); err != nil {
		t.Fatal(err)
	}
	pod := newPod("team-a", "rank-1", "pod-1", "job")
	other := newPod("team-a", "rank-2", "pod-2", "other-job")
	claim := newClaim("team-a", "rank-1-relay", "uid-1", forPod(pod))
	fresh := newClaim("team-a", "rank-2-relay", "uid-2", forPod(other))
	client := newClient(t, claim, fresh)
	for _, p := range []*corev1.Pod{pod, other} {
		if _, err := client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p := startPlugin(t, dirs, client, newRailState(readyState()))
	p.mustPrepare(t, claim)
	p.mustPrepare(t, fresh)
	for _, c := range []struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{claim, old},
		{fresh, filepath.Join(contract.GroupsDir(dirs.shm), dirs.key(t, "team-a", group.SourceLabel, "other-job"))},
	} {
		spec, err := inject(t, dirs.cdi, c.claim.UID)
		if err != nil {
			t.Fatal(err)
		}
		if len(spec.Mounts) != 1 || spec.Mounts[0].Source != c.want {
			t.Errorf("claim %s mounts %+v, want %s", c.claim.Name, spec.Mounts, c.want)
		}
	}
	fi, err := os.Lstat(contract.GroupsDir(dirs.shm))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != group.ClosedDirMode {
		t.Fatalf("groups folder has mode %v, want %#o", fi.Mode().Perm(), group.ClosedDirMode)
	}
}
