// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// registerRank registers a rank in root that stays live for an hour
// without beating.
func registerRank(t *testing.T, root, rail, hca string) {
	t.Helper()
	r, err := registry.Register(context.Background(), registry.Options{Root: root, Group: "g", UID: os.Geteuid(),
		Rail: rail, HCA: hca, HeartbeatTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
}

func shmDir(t *testing.T, prefix string) string {
	t.Helper()
	shm, err := os.MkdirTemp("/dev/shm", prefix)
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	return shm
}

func groupDir(t *testing.T, shm, key string) string {
	t.Helper()
	dir := filepath.Join(contract.GroupsDir(shm), key)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

type failingPods struct{}

func (failingPods) List(context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	return nil, errors.New("kubelet restarting")
}

// TestRankMetricsOfDRAClaims: the ranks of a DRA claim's group folder, in
// the driver's own shm folder beside the device plugin's, carry the pod
// that the claim's owner record names; a pod the kubelet no longer runs is
// not named; a corrupt record names nobody and counts as a read error.
func TestRankMetricsOfDRAClaims(t *testing.T) {
	dp, dra := shmDir(t, "pxn-agent-dp-"), shmDir(t, "pxn-agent-dra-")
	slot := group.UnkeyedKey("team-a", group.SourceUID, "a-uid")
	own := group.UnkeyedKey("team-d", group.SourceClaim, "uid-own")
	shared := group.UnkeyedKey("team-d", group.SourceClaim, "uid-shared")
	gone := group.UnkeyedKey("team-d", group.SourceClaim, "uid-gone")
	corrupt := group.UnkeyedKey("team-d", group.SourceClaim, "uid-corrupt")

	registerRank(t, groupDir(t, dp, slot), "rail0", "mlx5_0")
	writeOwner(t, dp, slot, group.OwnerSlotPrefix+"dev-0", group.Owner{Namespace: "team-a", Pods: []string{"a-0"}})
	// A claim of one pod, its rank in a registry root of its own below
	// the folder (as pxn-bench makes one).
	ownRoot := filepath.Join(groupDir(t, dra, own), "bench-registry")
	if err := os.Mkdir(ownRoot, 0o700); err != nil {
		t.Fatal(err)
	}
	registerRank(t, ownRoot, "rail1", "mlx5_1")
	writeOwner(t, dra, own, group.OwnerClaimPrefix+"uid-own", group.Owner{Namespace: "team-d", Pods: []string{"d-0"}, Claim: "d-0-relay-x7"})
	// A claim two pods share.
	registerRank(t, groupDir(t, dra, shared), "rail2", "mlx5_2")
	writeOwner(t, dra, shared, group.OwnerClaimPrefix+"uid-shared", group.Owner{Namespace: "team-d", Pods: []string{"d-1", "d-2"}, Claim: "job"})
	// A claim whose pod has ended (the record not yet removed).
	registerRank(t, groupDir(t, dra, gone), "rail3", "mlx5_3")
	writeOwner(t, dra, gone, group.OwnerClaimPrefix+"uid-gone", group.Owner{Namespace: "team-d", Pods: []string{"d-old"}, Claim: "old"})
	registerRank(t, groupDir(t, dra, corrupt), "rail4", "mlx5_4")
	if err := os.WriteFile(filepath.Join(contract.OwnersDir(dra), group.OwnerRecordName(corrupt, group.OwnerClaimPrefix+"uid-corrupt")),
		[]byte(`{"version":1,"namespace":"team-d","pods":["../../etc"]}`), 0o644); err != nil {
		t.Fatal(err)
	}

	running := fakePods{"dev-0": {"team-a", "a-0"}, "x-0": {"team-d", "d-0"}, "x-1": {"team-d", "d-1"}, "x-2": {"team-d", "d-2"}}
	c, err := agent.NewRankCollector(agent.RankMetricsOptions{NodeName: testNode, ShmDirs: []string{dp, dra, filepath.Join(dra, "absent")},
		Pods: running, StaleAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	text, fams := scrape(t, c)
	for _, want := range []map[string]string{
		{"group": slot, "namespace": "team-a", "pod": "a-0", "rail": "rail0"},
		{"group": own, "namespace": "team-d", "pod": "d-0", "rail": "rail1"},
		{"group": shared, "namespace": "team-d", "pod": "", "rail": "rail2"},
		{"group": gone, "namespace": "", "pod": "", "rail": "rail3"},
		{"group": corrupt, "namespace": "", "pod": "", "rail": "rail4"},
	} {
		if v, ok := value(fams, "pxn_ranks", want); !ok || v != 1 {
			t.Errorf("pxn_ranks%v = %v (found %v), want one rank\n%s", want, v, ok, text)
		}
	}
	if n := len(fams["pxn_ranks"].GetMetric()); n != 5 {
		t.Errorf("%d pxn_ranks series, want 5\n%s", n, text)
	}
	if v, _ := value(fams, "pxn_agent_rank_read_errors_total", nil); v != 1 {
		t.Errorf("read errors %v, want 1 (the corrupt owner record)\n%s", v, text)
	}

	// Without the kubelet's answer the records are taken as they are; the
	// failed lookup is counted.
	blind, err := agent.NewRankCollector(agent.RankMetricsOptions{NodeName: testNode, ShmDirs: []string{dra},
		Pods: failingPods{}, StaleAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	text, fams = scrape(t, blind)
	if v, ok := value(fams, "pxn_ranks", map[string]string{"group": gone, "namespace": "team-d", "pod": "d-old"}); !ok || v != 1 {
		t.Errorf("without the kubelet, the record's pod is not named\n%s", text)
	}
	if v, _ := value(fams, "pxn_agent_rank_read_errors_total", nil); v != 2 {
		t.Errorf("read errors %v, want 2 (the corrupt record, the failed lookup)\n%s", v, text)
	}
}

// TestRankMetricsBoundOwnerRecords: a group folder's owner records beyond
// the bound are left unread and counted.
func TestRankMetricsBoundOwnerRecords(t *testing.T) {
	shm := shmDir(t, "pxn-agent-owners-")
	key := group.UnkeyedKey("team-e", group.SourceLabel, "big")
	registerRank(t, groupDir(t, shm, key), "rail0", "mlx5_0")
	const records, bound = 258, 256
	for i := range records {
		writeOwner(t, shm, key, fmt.Sprintf("%sdev-%03d", group.OwnerSlotPrefix, i), group.Owner{Namespace: "team-e", Pods: []string{fmt.Sprintf("e-%03d", i)}})
	}
	c, err := agent.NewRankCollector(agent.RankMetricsOptions{NodeName: testNode, ShmDirs: []string{shm}, StaleAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	text, fams := scrape(t, c)
	if v, ok := value(fams, "pxn_ranks", map[string]string{"group": key, "namespace": "team-e", "pod": ""}); !ok || v != 1 {
		t.Errorf("the rank of a folder of %d pods is not under its namespace\n%s", records, text)
	}
	if v, _ := value(fams, "pxn_agent_rank_read_errors_total", nil); v != records-bound {
		t.Errorf("read errors %v, want %d (the records over the bound)\n%s", v, records-bound, text)
	}
}
