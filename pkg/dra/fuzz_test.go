// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/nodestate"
	"github.com/pxn-project/pxn/pkg/rail"
)

const fuzzNode = "node-a"

type readyRails struct{}

func (readyRails) State() (nodestate.NodeState, <-chan struct{}) {
	l := &rail.Layout{
		GPUs: []rail.GPU{{PCIBusID: "0000:18:00.0", PCIeRoot: "pci0000:15", HCA: "mlx5_0", Rail: "rail0"}},
		HCAs: []rail.HCA{{Name: "mlx5_0", PCIBusID: "0000:19:00.0", PCIeRoot: "pci0000:15", State: rail.StateActive, Port: 1, Rail: "rail0"}},
	}
	return nodestate.NodeState{Discovered: true, Healthy: true, RailMap: `{"mlx5_0":"rail0"}`, Layout: l}, nil
}

// fuzzNodeDirs is a node's folders inside base, and a file named like the
// files the driver removes (*.json) beside each of them and in the one
// above: none of them may go, whatever the driver is fed.
type fuzzNodeDirs struct {
	cfg       Config
	sentinels []string
}

func newFuzzNodeDirs(t *testing.T) fuzzNodeDirs {
	t.Helper()
	// On tmpfs where there is one: the driver syncs what it writes, and a
	// disk's syncs would make each input take tens of milliseconds.
	base, err := os.MkdirTemp("/dev/shm", "pxn-dra-fuzz-")
	if err != nil {
		base = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(base) })
	}
	node := filepath.Join(base, "node")
	n := fuzzNodeDirs{cfg: Config{
		NodeName: fuzzNode,
		Member:   group.Member{GroupID: "k8s", RegistryRoot: "/run/pxn"},
		ShmDir:   filepath.Join(node, "shm"), CDIDir: filepath.Join(node, "cdi"), StateDir: filepath.Join(node, "state"),
	}}
	for _, dir := range []string{base, node, n.cfg.ShmDir, n.cfg.StateDir, contract.OwnersDir(n.cfg.ShmDir)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "sentinel.json")
		if err := os.WriteFile(path, []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		n.sentinels = append(n.sentinels, path)
	}
	return n
}

// check fails t for a sentinel that is gone.
func (n fuzzNodeDirs) check(t *testing.T, what string) {
	t.Helper()
	for _, s := range n.sentinels {
		if _, err := os.Lstat(s); err != nil {
			t.Fatalf("%s: %s outside the driver's files is gone: %v", what, s, err)
		}
	}
}

// checkpointBytes is a checkpoint holding one claim.
func checkpointBytes(uid types.UID, pc preparedClaim) []byte {
	b, err := json.Marshal(checkpoint{Version: checkpointVersion, Claims: map[types.UID]preparedClaim{uid: pc}})
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzCheckpoint starts a driver on any bytes in its checkpoint file and
// unprepares every claim the driver took from it. A checkpoint is refused
// with an error naming the file, or taken whole: saved and loaded again it
// encodes the same. Unprepare then removes nothing outside the CDI
// folder's specs, the owners folder's records and the groups folder,
// whatever UIDs and group keys the file names; the claims it reports
// unprepared are gone from memory and from the checkpoint, the others
// stay in both.
func FuzzCheckpoint(f *testing.F) {
	key := group.UnkeyedKey("ns", group.SourceClaim, "uid-1")
	f.Add(checkpointBytes("uid-1", preparedClaim{Namespace: "ns", Name: "c", Group: key,
		Devices: []preparedDevice{{Requests: []string{"r"}, Pool: fuzzNode, Device: DeviceName}}}))
	f.Add(checkpointBytes("uid-2", preparedClaim{Namespace: "ns", Name: "admin"}))
	f.Add(checkpointBytes("/../../sentinel", preparedClaim{Namespace: "ns", Name: "c"}))
	f.Add(checkpointBytes("uid-3", preparedClaim{Namespace: "ns", Name: "c", Group: "../../sentinel"}))
	f.Add(checkpointBytes("uid-4", preparedClaim{Namespace: "ns", Name: "c", Group: "../" + key}))
	f.Add([]byte(`{"version":2,"claims":{}}`))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"claims":{"":{}}}`))
	f.Add([]byte(`null`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, data []byte) {
		n := newFuzzNodeDirs(t)
		path := checkpointPath(n.cfg.StateDir)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		d, err := New(n.cfg, readyRails{})
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("checkpoint %q: error %q does not name %s", data, err, path)
			}
			n.check(t, "a refused checkpoint")
			return
		}
		again := filepath.Join(filepath.Dir(n.cfg.ShmDir), "again")
		if err := os.Mkdir(again, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := saveCheckpoint(again, d.prepared); err != nil {
			t.Fatalf("checkpoint %q taken, but not saved again: %v", data, err)
		}
		back, err := loadCheckpoint(again)
		if err != nil {
			t.Fatalf("checkpoint %q taken, saved, and not loaded again: %v", data, err)
		}
		if a, b := mustJSON(t, d.prepared), mustJSON(t, back); a != b {
			t.Fatalf("checkpoint %q taken as %s, loaded again as %s", data, a, b)
		}

		var claims []kubeletplugin.NamespacedObject
		for uid, pc := range d.prepared {
			claims = append(claims, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: pc.Namespace, Name: pc.Name}, UID: uid})
		}
		results, err := d.UnprepareResourceClaims(context.Background(), claims)
		if err != nil {
			t.Fatalf("checkpoint %q: unprepare: %v", data, err)
		}
		n.check(t, fmt.Sprintf("unprepare of checkpoint %q", data))
		left, err := loadCheckpoint(n.cfg.StateDir)
		if err != nil {
			t.Fatalf("checkpoint after unprepare: %v", err)
		}
		for _, c := range claims {
			_, inMemory := d.prepared[c.UID]
			_, inFile := left[c.UID]
			if gone := results[c.UID] == nil; gone == inMemory || gone == inFile {
				t.Fatalf("claim %q unprepared with %v, but in memory %v and in the checkpoint %v", c.UID, results[c.UID], inMemory, inFile)
			}
		}
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A fuzzed allocation result: which driver, pool and device it names
// (ours or another's), and whether it asked for admin access.
const (
	resultOurs = iota
	resultOtherDriver
	resultOtherPool
	resultOtherDevice
	resultRail        // the node's rail device
	resultMissingRail // a rail device the node does not have
	resultKinds
)

// FuzzPrepareAllocation prepares a claim whose allocation the fuzzer
// chose: its UID, up to four results for this driver or another, on this
// node's relay, its rail device, a rail device it lacks or elsewhere, with
// or without admin access, and an opaque configuration's bytes. Prepare
// succeeds exactly when the claim is allocated, every result for this
// driver names this node's relay or a rail device, admin and user requests
// are not mixed, the configuration is a RelayConfig, the UID is a file name
// and a user claim's rail devices are the node's; then the claim has its
// CDI spec, PXN_HCA exactly when a user request holds a rail device, and,
// unless it is an admin claim, its group folder inside the groups folder,
// and Unprepare removes both. A refusal names the offending value and leaves
// nothing behind; nothing outside the driver's files goes either way.
func FuzzPrepareAllocation(f *testing.F) {
	f.Add("uid-1", true, []byte{resultOurs << 2}, "r", []byte(`{"apiVersion":"pxn.io/v1alpha1","kind":"RelayConfig"}`))
	f.Add("uid-1", true, []byte{resultOurs<<2 | 1, resultOurs<<2 | 1}, "r", []byte(nil))
	f.Add("uid-1", true, []byte{resultOurs<<2 | 1, resultOurs << 2}, "r", []byte(nil))
	f.Add("uid-1", true, []byte{resultOtherPool << 2}, "r", []byte(nil))
	f.Add("uid-1", true, []byte{resultOtherDevice << 2, resultOtherDriver << 2}, "r", []byte(nil))
	f.Add("uid-1", true, []byte{resultOurs << 2, resultRail << 2}, "r", []byte(nil))
	f.Add("uid-1", true, []byte{resultRail << 2, resultMissingRail << 2}, "r", []byte(nil))
	f.Add("uid-1", true, []byte{resultMissingRail<<2 | 1}, "r", []byte(nil))
	f.Add("uid-1", true, []byte{resultOurs << 2}, "r", []byte(`{"apiVersion":"pxn.io/v1alpha1","kind":"RelayConfig","x":1}`))
	f.Add("uid-1", false, []byte{}, "r", []byte(nil))
	f.Add("../../sentinel", true, []byte{resultOurs << 2}, "r", []byte(nil))
	f.Add("", true, []byte{resultOurs << 2}, "r", []byte(nil))
	f.Fuzz(func(t *testing.T, uid string, allocated bool, results []byte, request string, config []byte) {
		if len(results) > 4 {
			results = results[:4]
		}
		n := newFuzzNodeDirs(t)
		d, err := New(n.cfg, readyRails{})
		if err != nil {
			t.Fatal(err)
		}
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: types.UID(uid)}}
		want := ""
		admin, user, ours := 0, 0, 0
		userRail, missing := false, ""
		if allocated {
			alloc := &resourceapi.AllocationResult{}
			for i, r := range results {
				res := resourceapi.DeviceRequestAllocationResult{Request: fmt.Sprintf("%s-%d", request, i), Driver: DriverName, Pool: fuzzNode, Device: DeviceName}
				switch r >> 2 % resultKinds {
				case resultOtherDriver:
					res.Driver = "other.example.com"
				case resultOtherPool:
					res.Pool = "node-b"
				case resultOtherDevice:
					res.Device = "gpu-0"
				case resultRail:
					res.Device = "hca-mlx5-0"
				case resultMissingRail:
					res.Device = "hca-mlx5-9"
				}
				switch r & 3 {
				case 1:
					res.AdminAccess = new(bool)
					*res.AdminAccess = true
				case 2:
					res.AdminAccess = new(bool)
				}
				alloc.Devices.Results = append(alloc.Devices.Results, res)
				if res.Driver != DriverName {
					continue
				}
				ours++
				if (res.Pool != fuzzNode || res.Device != DeviceName && !strings.HasPrefix(res.Device, "hca-")) && want == "" {
					want = fmt.Sprintf("request %s was allocated device %s/%s", res.Request, res.Pool, res.Device)
				}
				if res.AdminAccess != nil && *res.AdminAccess {
					admin++
				} else {
					user++
					userRail = userRail || res.Device == "hca-mlx5-0"
					if res.Device == "hca-mlx5-9" && missing == "" {
						missing = fmt.Sprintf("request %s: node %s has no rail device hca-mlx5-9", res.Request, fuzzNode)
					}
				}
			}
			if len(config) > 0 {
				alloc.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
					Source:              resourceapi.AllocationConfigSourceClaim,
					DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: runtime.RawExtension{Raw: config}}},
				}}
			}
			claim.Status.Allocation = alloc
		}
		_, configErr := decodeRelayConfig(config)
		switch {
		case !allocated:
			want = "not allocated"
		case want != "":
		case admin > 0 && user > 0:
			want = fmt.Sprintf("%d requests with admin access and %d without", admin, user)
		case len(config) > 0 && configErr != nil:
			want = "opaque config 0 for driver " + DriverName
		case checkClaimUID(types.UID(uid)) != nil:
			want = fmt.Sprintf("claim UID %q", uid)
		case admin == 0 && missing != "":
			want = missing
		}
		got, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
		if err != nil {
			t.Fatalf("prepare: %v", err)
		}
		res := got[claim.UID]
		n.check(t, "prepare")
		spec := cdiSpecPath(n.cfg.CDIDir, claim.UID)
		if want != "" {
			if res.Err == nil || !strings.Contains(res.Err.Error(), want) {
				t.Fatalf("claim %+v: result %+v, want an error saying %q", claim.Status.Allocation, res, want)
			}
			if len(d.prepared) != 0 {
				t.Fatalf("refused claim is held as prepared: %+v", d.prepared)
			}
			if entries, _ := os.ReadDir(contract.GroupsDir(n.cfg.ShmDir)); len(entries) != 0 {
				t.Fatalf("refused claim left %d group folders", len(entries))
			}
			if entries, _ := os.ReadDir(n.cfg.CDIDir); len(entries) != 0 {
				t.Fatalf("refused claim left %d CDI specs", len(entries))
			}
			return
		}
		if res.Err != nil {
			t.Fatalf("claim %q with %d results for the driver: %v", uid, ours, res.Err)
		}
		if len(res.Devices) != ours {
			t.Fatalf("%d devices prepared for %d results of the driver", len(res.Devices), ours)
		}
		for _, dev := range res.Devices {
			if len(dev.CDIDeviceIDs) != 1 || dev.CDIDeviceIDs[0] != cdiDeviceID(claim.UID) {
				t.Fatalf("device %+v, want the CDI device %s", dev, cdiDeviceID(claim.UID))
			}
		}
		if filepath.Dir(spec) != n.cfg.CDIDir {
			t.Fatalf("CDI spec %s outside %s", spec, n.cfg.CDIDir)
		}
		if _, err := os.Stat(spec); err != nil {
			t.Fatalf("prepared claim has no CDI spec: %v", err)
		}
		pc := d.prepared[claim.UID]
		if hca, ok := pc.Edits.Env[EnvHCA]; ok != userRail || ok && hca != "mlx5_0" {
			t.Fatalf("claim %+v: %s=%q (set: %v), want mlx5_0 exactly when a user request holds hca-mlx5-0", claim.Status.Allocation, EnvHCA, hca, ok)
		}
		if (pc.Group == "") != (admin > 0) {
			t.Fatalf("claim with %d admin requests prepared with group %q", admin, pc.Group)
		}
		groupDir := filepath.Join(contract.GroupsDir(n.cfg.ShmDir), pc.Group)
		if pc.Group != "" {
			if fi, err := os.Stat(groupDir); err != nil || !fi.IsDir() {
				t.Fatalf("prepared claim has no group folder %s: %v", groupDir, err)
			}
		}
		gone, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: claim.UID}})
		if err != nil || gone[claim.UID] != nil {
			t.Fatalf("unprepare: %v, %v", err, gone[claim.UID])
		}
		n.check(t, "unprepare")
		if _, err := os.Stat(spec); !os.IsNotExist(err) {
			t.Fatalf("CDI spec after unprepare: %v", err)
		}
		if pc.Group != "" {
			if _, err := os.Stat(groupDir); !os.IsNotExist(err) {
				t.Fatalf("group folder after unprepare: %v", err)
			}
		}
	})
}
