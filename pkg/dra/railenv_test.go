// SPDX-License-Identifier: Apache-2.0

package dra_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/dra"
	"github.com/pxn-project/pxn/pkg/nodestate"
)

// withRail adds a result of request allocating this node's rail device.
func withRail(request, device string) claimOpt {
	return func(c *resourceapi.ResourceClaim) {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: request, Driver: dra.DriverName, Pool: node, Device: device, ShareID: ptrUID("share-" + request)})
	}
}

// withGPU adds a result of another driver, as a GPU driver's allocation in
// the same claim is: the driver leaves it alone.
func withGPU(request, device string) claimOpt {
	return func(c *resourceapi.ResourceClaim) {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: request, Driver: "gpu.example.com", Pool: node, Device: device})
	}
}

// withoutRelay drops the relay device's result.
func withoutRelay(c *resourceapi.ResourceClaim) {
	c.Status.Allocation.Devices.Results = slices.DeleteFunc(c.Status.Allocation.Devices.Results,
		func(r resourceapi.DeviceRequestAllocationResult) bool { return r.Device == dra.DeviceName })
}

func ptrUID(s string) *types.UID { u := types.UID(s); return &u }

// claimEnv prepares a claim and returns the environment its container gets
// from the CDI spec, and checks the answer names every device of the
// driver the claim was allocated.
func claimEnv(t *testing.T, p *plugin, dirs nodeDirs, c *resourceapi.ResourceClaim) map[string]string {
	t.Helper()
	r := p.prepare(t, c)[string(c.UID)]
	if r.Error != "" {
		t.Fatalf("prepare %s: %s", c.Name, r.Error)
	}
	var want, got []string
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver == dra.DriverName {
			want = append(want, res.Device)
		}
	}
	for _, d := range r.Devices {
		got = append(got, d.DeviceName)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("prepare %s answered devices %v, want %v", c.Name, got, want)
	}
	spec, err := inject(t, dirs.cdi, c.UID)
	if err != nil {
		t.Fatalf("inject %s: %v", c.Name, err)
	}
	return envMap(spec.Process.Env)
}

// memberEnv is the engine's environment on a node in state st.
func memberEnv(st nodestate.NodeState) map[string]string {
	return map[string]string{
		contract.EnvEnable:       contract.EnableOn,
		contract.EnvRailMap:      st.RailMap,
		contract.EnvGroupID:      "k8s",
		contract.EnvRegistryRoot: registryRoot,
	}
}

func checkEnv(t *testing.T, got, want map[string]string) {
	t.Helper()
	if !mapsEqual(got, want) || len(got) != len(want) {
		t.Fatalf("env\n%v\nwant\n%v", got, want)
	}
}

func TestRailClaimNamesItsHCA(t *testing.T) {
	st := fixtureState(t, "hgx-8gpu")
	dirs := newNodeDirs(t)
	// A rank of GPU 2 (0000:4b:00.0 on pci0000:48) and the rail device on
	// that root.
	c := newClaim("serving", "rank-2", "uid-rank-2", withGPU("gpu", "gpu-2"), withRail("nic", "hca-mlx5-3"))
	p := startPlugin(t, dirs, newClient(t, c), newRailState(st))
	want := memberEnv(st)
	want[dra.EnvHCA] = "mlx5_3"
	want[dra.EnvRail] = "rail2"
	want[dra.EnvSGLangIBDevice] = `{"0":"mlx5_3"}`
	want[dra.EnvVLLMGPUNICMapping] = "0000:4b:00.0=0000:4c:00.0"
	checkEnv(t, claimEnv(t, p, dirs, c), want)

	// The checkpoint holds the environment: a restarted driver answers the
	// same without looking at the rails again.
	p.stop()
	down := fixtureState(t, "hgx-8gpu-portdown")
	p = startPlugin(t, dirs, newClient(t, c), newRailState(down))
	checkEnv(t, claimEnv(t, p, dirs, c), want)
}

func TestEightRankClaimMapsEveryGPU(t *testing.T) {
	st := fixtureState(t, "hgx-8gpu")
	dirs := newNodeDirs(t)
	// Requests in another order than the bus's: the forms follow the bus.
	devs := []string{"hca-mlx5-9", "hca-mlx5-0", "hca-mlx5-2", "hca-mlx5-3", "hca-mlx5-4", "hca-mlx5-5", "hca-mlx5-7", "hca-mlx5-8"}
	opts := []claimOpt{withoutRelay}
	for i, d := range devs {
		opts = append(opts, withRail("nic-"+string(rune('a'+i)), d))
	}
	c := newClaim("serving", "prefill-0", "uid-prefill-0", opts...)
	p := startPlugin(t, dirs, newClient(t, c), newRailState(st))
	env := claimEnv(t, p, dirs, c)

	want := memberEnv(st)
	want[dra.EnvHCA] = "mlx5_0,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_7,mlx5_8,mlx5_9"
	want[dra.EnvRail] = "rail0,rail1,rail2,rail3,rail4,rail5,rail6,rail7"
	want[dra.EnvVLLMGPUNICMapping] = "0000:18:00.0=0000:19:00.0,0000:3a:00.0=0000:3b:00.0,0000:4b:00.0=0000:4c:00.0,0000:5c:00.0=0000:5d:00.0," +
		"0000:9a:00.0=0000:9b:00.0,0000:ba:00.0=0000:bb:00.0,0000:c9:00.0=0000:ca:00.0,0000:d8:00.0=0000:d9:00.0"
	var sglang map[string]string
	if err := json.Unmarshal([]byte(env[dra.EnvSGLangIBDevice]), &sglang); err != nil {
		t.Fatalf("%s %q: %v", dra.EnvSGLangIBDevice, env[dra.EnvSGLangIBDevice], err)
	}
	wantSGLang := map[string]string{"0": "mlx5_0", "1": "mlx5_2", "2": "mlx5_3", "3": "mlx5_4", "4": "mlx5_5", "5": "mlx5_7", "6": "mlx5_8", "7": "mlx5_9"}
	if !mapsEqual(sglang, wantSGLang) || len(sglang) != 8 {
		t.Fatalf("%s %v, want %v", dra.EnvSGLangIBDevice, sglang, wantSGLang)
	}
	want[dra.EnvSGLangIBDevice] = env[dra.EnvSGLangIBDevice]
	checkEnv(t, env, want)
	// A claim of rail devices alone is a group as a relay claim is.
	checkGroupMount(t, dirs, c)
}

// checkGroupMount checks the claim's container gets its group folder.
func checkGroupMount(t *testing.T, dirs nodeDirs, c *resourceapi.ResourceClaim) {
	t.Helper()
	spec, err := inject(t, dirs.cdi, c.UID)
	if err != nil {
		t.Fatal(err)
	}
	dir := dirs.groupDir(t, c.Namespace, c.UID)
	if len(spec.Mounts) != 1 || spec.Mounts[0].Source != dir || spec.Mounts[0].Destination != registryRoot {
		t.Fatalf("%s: mounts %+v, want %s at %s", c.Name, spec.Mounts, dir, registryRoot)
	}
}

// A rank that asked for no rail device keeps the relay's environment alone.
func TestRelayClaimGetsNoHCA(t *testing.T) {
	st := fixtureState(t, "hgx-8gpu")
	dirs := newNodeDirs(t)
	c := newClaim("serving", "decode-0", "uid-decode-0", withGPU("gpu", "gpu-0"))
	p := startPlugin(t, dirs, newClient(t, c), newRailState(st))
	checkEnv(t, claimEnv(t, p, dirs, c), memberEnv(st))
}

func TestRailClaimRefusedNamesWhy(t *testing.T) {
	for _, tc := range []struct {
		name, fixture, device string
		want                  []string
	}{
		{"port down", "hgx-8gpu-portdown", "hca-mlx5-3", []string{"request nic", "hca-mlx5-3", "mlx5_3 port 1 is DOWN"}},
		{"no such device", "hgx-8gpu", "hca-mlx5-1", []string{"request nic", "no rail device hca-mlx5-1", "hca-mlx5-0"}},
		{"not a device of the driver", "hgx-8gpu", "nic-0", []string{"request nic", "nic-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dirs := newNodeDirs(t)
			c := newClaim("serving", "rank", "uid-rank", withRail("nic", tc.device))
			p := startPlugin(t, dirs, newClient(t, c), newRailState(fixtureState(t, tc.fixture)))
			r := p.prepare(t, c)[string(c.UID)]
			for _, w := range append(tc.want, "serving/rank") {
				if !strings.Contains(r.Error, w) {
					t.Fatalf("error %q does not name %q", r.Error, w)
				}
			}
			checkGone(t, dirs, c)
			if len(p.driver.Prepared()) != 0 {
				t.Fatal("a refused claim is in the checkpoint")
			}
		})
	}
}
