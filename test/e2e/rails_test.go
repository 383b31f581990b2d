// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/pxn-project/pxn/pkg/dra"
	"github.com/pxn-project/pxn/pkg/rail"
)

const (
	// gpuDriver is the suite's own DRA driver: GPU-like devices, one per
	// GPU of the node's sysfs fixture, with the standard PCIe attributes a
	// GPU driver publishes. NVIDIA's driver needs GPUs; this one needs the
	// fixture only.
	gpuDriver      = "gpu.e2e.pxn.io"
	gpuDeviceClass = "gpu.e2e.pxn.io"
	// railDeviceClass is the chart's class of the rail devices.
	railDeviceClass = "rail.pxn.io"
	nsR             = "pxn-e2e-rails"
)

// gpuPlugin is the suite's GPU driver, a kubelet plugin in the test's own
// process: it publishes the fixture's GPUs and prepares claims with
// nothing to do for them.
type gpuPlugin struct {
	log klog.Logger
}

func (p *gpuPlugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var devs []kubeletplugin.Device
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Driver == gpuDriver {
					devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
				}
			}
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (p *gpuPlugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (p *gpuPlugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (p *gpuPlugin) HandleError(ctx context.Context, err error, msg string) {
	p.log.Error(err, msg)
}

// fixtureLayout is the discovery of the node's sysfs fixture, which the
// chart's components read as the host's.
func (c *cluster) fixtureLayout() *rail.Layout {
	c.t.Helper()
	root := filepath.Join(c.dir, "fixtures", "hgx-8gpu")
	l, err := rail.Discover(c.ctx, rail.Options{FS: os.DirFS(root), NodeRoot: root})
	if err != nil {
		c.t.Fatalf("discover the fixture %s: %v", root, err)
	}
	return l
}

// startGPUDriver registers the suite's GPU driver with the kubelet and
// publishes the fixture's GPUs, each with its PCIe root read by Kubernetes'
// own helper; it stops at the end of the step.
func (c *cluster) startGPUDriver(l *rail.Layout) {
	t := c.t
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sys := os.DirFS(filepath.Join(c.dir, "fixtures", "hgx-8gpu", "sys"))
	var devs []resourceapi.Device
	for _, g := range l.GPUs {
		root, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(g.PCIBusID, deviceattribute.WithFS(sys.(fs.ReadLinkFS)))
		if err != nil {
			t.Fatalf("PCIe root of GPU %s: %v", g.PCIBusID, err)
		}
		devs = append(devs, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", g.Index),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				root.Name:                         root.Value,
				"resource.kubernetes.io/pciBusID": {StringValue: ptr.To(g.PCIBusID)},
				"index":                           {IntValue: ptr.To(int64(g.Index))},
			},
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	dataDir := filepath.Join(c.dir, "kubelet", "plugins", gpuDriver)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	plugin := &gpuPlugin{log: klog.Background()}
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.DriverName(gpuDriver),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(c.node),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(c.dir, "kubelet", "plugins_registry")),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		cancel()
		t.Fatalf("start the GPU driver: %v", err)
	}
	t.Cleanup(func() {
		helper.Stop()
		cancel()
		// Its slices go with it, so that a later run starts clean.
		_, _ = c.detached().kc("delete", "resourceslices", "--field-selector", "spec.driver="+gpuDriver, "--ignore-not-found")
	})
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		c.node: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}); err != nil {
		t.Fatalf("publish the GPUs: %v", err)
	}
	// Not helper.RegistrationStatus: the helper writes it from the
	// kubelet's call without a lock, a data race for any reader. A claim
	// prepared before the kubelet knows the driver is retried by the
	// kubelet, which the later steps' deadlines cover.
	c.poll("the GPU driver's slice", time.Minute, func() (bool, string) {
		out, err := c.kc("get", "resourceslices", "--field-selector", "spec.driver="+gpuDriver, "-o", "name")
		return err == nil && strings.TrimSpace(out) != "", fmt.Sprintf("%q %v", out, err)
	})
}

// railSliceDevice is a device of the driver's slice with its taints.
type railSliceDevice struct {
	Name       string `json:"name"`
	Attributes map[string]struct {
		Int    *int64  `json:"int"`
		Bool   *bool   `json:"bool"`
		String *string `json:"string"`
	} `json:"attributes"`
	Taints []struct {
		Key    string `json:"key"`
		Value  string `json:"value"`
		Effect string `json:"effect"`
	} `json:"taints"`
}

// railSlice is the node's devices of the pxn.io driver, by name.
func (c *cluster) railSlice() (map[string]railSliceDevice, error) {
	var list struct {
		Items []struct {
			Spec struct {
				Driver   string            `json:"driver"`
				NodeName string            `json:"nodeName"`
				Devices  []railSliceDevice `json:"devices"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := c.getJSON(&list, "resourceslices"); err != nil {
		return nil, err
	}
	devs := map[string]railSliceDevice{}
	for _, s := range list.Items {
		if s.Spec.Driver != draDriver || s.Spec.NodeName != c.node {
			continue
		}
		for _, d := range s.Spec.Devices {
			devs[d.Name] = d
		}
	}
	return devs, nil
}

// line is a device as one line: name, attributes in name order, taints.
func (d railSliceDevice) line() string {
	names := make([]string, 0, len(d.Attributes))
	for n := range d.Attributes {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := []string{d.Name}
	for _, n := range names {
		a := d.Attributes[n]
		switch {
		case a.String != nil:
			parts = append(parts, n+"="+*a.String)
		case a.Int != nil:
			parts = append(parts, fmt.Sprintf("%s=%d", n, *a.Int))
		case a.Bool != nil:
			parts = append(parts, fmt.Sprintf("%s=%v", n, *a.Bool))
		}
	}
	for _, tn := range d.Taints {
		parts = append(parts, "taint:"+tn.Key+"="+tn.Value+":"+tn.Effect)
	}
	return strings.Join(parts, " ")
}

// alignedClaimYAML is a claim of pairs: a GPU of the suite's driver and a
// rail device on the same PCIe root; rails, when not empty, picks each
// pair's rail.
func alignedClaimYAML(ns, name string, pairs int, rails ...string) string {
	var req, cons []string
	for i := range pairs {
		sel := ""
		if i < len(rails) {
			sel = fmt.Sprintf(`
          selectors:
            - cel:
                expression: device.attributes["pxn.io"].rail == %q`, rails[i])
		}
		req = append(req, fmt.Sprintf(`      - name: gpu-%d
        exactly:
          deviceClassName: %s
      - name: nic-%d
        exactly:
          deviceClassName: %s%s`, i, gpuDeviceClass, i, railDeviceClass, sel))
		cons = append(cons, fmt.Sprintf(`      - requests: [gpu-%d, nic-%d]
        matchAttribute: resource.kubernetes.io/pcieRoot`, i, i))
	}
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: %s
  namespace: %s
spec:
  devices:
    requests:
%s
    constraints:
%s
`, name, ns, strings.Join(req, "\n"), strings.Join(cons, "\n"))
}

// allocation is a claim's allocation results: request to driver/device.
func (c *cluster) allocation(ns, claim string) (map[string]string, error) {
	var rc struct {
		Status struct {
			Allocation *struct {
				Devices struct {
					Results []struct {
						Request string `json:"request"`
						Driver  string `json:"driver"`
						Device  string `json:"device"`
					} `json:"results"`
				} `json:"devices"`
			} `json:"allocation"`
		} `json:"status"`
	}
	if err := c.getJSON(&rc, "resourceclaim", "-n", ns, claim); err != nil {
		return nil, err
	}
	if rc.Status.Allocation == nil {
		return nil, nil
	}
	out := map[string]string{}
	for _, r := range rc.Status.Allocation.Devices.Results {
		out[r.Request] = r.Driver + "/" + r.Device
	}
	return out, nil
}

// podEnv is a running pod's environment, as env prints it.
func (c *cluster) podEnv(ns, pod string) map[string]string {
	c.t.Helper()
	out, err := c.exec(ns, pod, "env")
	if err != nil {
		c.t.Fatalf("%s/%s: %v", ns, pod, err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	return env
}

// checkAlignedPod checks a running pod of an aligned claim: each pair was
// allocated a GPU and a rail device on one PCIe root, and the container's
// PXN_HCA names exactly those rail devices' HCAs.
func (c *cluster) checkAlignedPod(l *rail.Layout, ns, pod, claim string, pairs int) (map[string]string, map[string]string) {
	t := c.t
	alloc, err := c.allocation(ns, claim)
	if err != nil || alloc == nil {
		t.Fatalf("claim %s/%s: allocation %v (%v)", ns, claim, alloc, err)
	}
	gpuRoot := map[string]string{}
	for _, g := range l.GPUs {
		gpuRoot[fmt.Sprintf("%s/gpu-%d", gpuDriver, g.Index)] = g.PCIeRoot
	}
	hcaOf := map[string]rail.HCA{}
	for _, h := range l.HCAs {
		hcaOf[draDriver+"/"+dra.RailDeviceName(h.Name)] = h
	}
	var hcas []string
	for i := range pairs {
		gpu, nic := alloc[fmt.Sprintf("gpu-%d", i)], alloc[fmt.Sprintf("nic-%d", i)]
		h, ok := hcaOf[nic]
		if root := gpuRoot[gpu]; !ok || root == "" || h.PCIeRoot != root {
			t.Errorf("claim %s/%s: pair %d got %s (root %s) and %s (root %s), want one root", ns, claim, i, gpu, root, nic, h.PCIeRoot)
		}
		hcas = append(hcas, h.Name)
	}
	slices.Sort(hcas)
	env := c.podEnv(ns, pod)
	got := strings.Split(env["PXN_HCA"], ",")
	slices.Sort(got)
	if !slices.Equal(got, hcas) {
		t.Errorf("%s/%s: PXN_HCA=%q, want the HCAs on its GPUs' roots %v", ns, pod, env["PXN_HCA"], hcas)
	}
	return alloc, env
}

// portStateFile is the state file of an HCA's port 1 in the node's fixture.
func (c *cluster) portStateFile(hca string) string {
	c.t.Helper()
	for _, f := range c.fixturePortStates() {
		if filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(f)))) == hca && filepath.Base(filepath.Dir(f)) == "1" {
			return f
		}
	}
	c.t.Fatalf("no port 1 state of %s in the fixture", hca)
	return ""
}

// checkDRARails: the driver's rail devices on the real scheduler and
// kubelet, beside the suite's GPU driver: claims matching pcieRoot across
// the two drivers get pairs on one root and their containers the HCA on
// it; a rail selector picks its rail; a port going down marks its device
// and no new claim gets it until the port is back.
func (c *cluster) checkDRARails() {
	t := c.t
	c.waitRailsReady(true)
	l := c.fixtureLayout()
	c.startGPUDriver(l)
	c.mustKC("create", "namespace", nsR)
	c.root.Cleanup(func() {
		if c.root.Failed() && c.reuse {
			_, _ = c.detached().kc("delete", "namespace", nsR, "--ignore-not-found", "--wait=false")
		}
	})
	c.apply(fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: %s
spec:
  selectors:
    - cel:
        expression: device.driver == %q
`, gpuDeviceClass, gpuDriver))
	t.Cleanup(func() { _, _ = c.detached().kc("delete", "deviceclass", gpuDeviceClass, "--ignore-not-found") })

	devs, err := c.railSlice()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, d := range devs {
		lines = append(lines, d.line())
	}
	slices.Sort(lines)
	t.Logf("ResourceSlice of %s on %s, one line a device:\n%s", draDriver, c.node, strings.Join(lines, "\n"))
	if len(devs) != 1+l.Rails {
		t.Fatalf("%d devices, want the relay device and %d rail devices", len(devs), l.Rails)
	}

	// Two ranks, each a GPU and the NIC on its root; and a rank on rail5.
	aligned := workload{nsR, "r1", relayHolder{claim: "pairs"}}
	onRail := workload{nsR, "r2", relayHolder{claim: "rail5"}}
	// The pairs claim holds the relay device too: the relay class picks it
	// alone among the driver's devices.
	pairs := strings.Replace(alignedClaimYAML(nsR, "pairs", 2), "    requests:\n", fmt.Sprintf(`    requests:
      - name: relay
        exactly:
          deviceClassName: %s
`, draDeviceClass), 1)
	c.apply(pairs + "---\n" + alignedClaimYAML(nsR, "rail5", 1, "rail5"))
	c.startWorkloads(aligned, onRail)
	alloc, env := c.checkAlignedPod(l, nsR, aligned.name, "pairs", 2)
	t.Logf("claim %s/pairs allocated %v; its container saw PXN_HCA=%s PXN_RAIL=%s PXN_SGLANG_IB_DEVICE=%s PXN_VLLM_GPU_NIC_PCIE_MAPPING=%s MC_PXN_ENABLE=%s MC_PXN_GROUP_ID=%s",
		nsR, alloc, env["PXN_HCA"], env["PXN_RAIL"], env["PXN_SGLANG_IB_DEVICE"], env["PXN_VLLM_GPU_NIC_PCIE_MAPPING"], env["MC_PXN_ENABLE"], env["MC_PXN_GROUP_ID"])
	if alloc["relay"] != draDriver+"/"+dra.DeviceName {
		t.Errorf("claim %s/pairs: request relay allocated %q, want %s/%s", nsR, alloc["relay"], draDriver, dra.DeviceName)
	}
	if env["MC_PXN_ENABLE"] != "1" || env["MC_PXN_GROUP_ID"] != groupID {
		t.Errorf("%s/%s: the engine's environment is missing: %v", nsR, aligned.name, env)
	}
	alloc, env = c.checkAlignedPod(l, nsR, onRail.name, "rail5", 1)
	if env["PXN_RAIL"] != "rail5" || alloc["nic-0"] != draDriver+"/hca-mlx5-7" {
		t.Errorf("claim %s/rail5 allocated %v, PXN_RAIL=%q; want rail5's hca-mlx5-7", nsR, alloc, env["PXN_RAIL"])
	}

	// mlx5_3 (rail2)'s port goes down: its device is tainted (or, where the
	// API server drops taints, gone), and a claim for rail2 stays
	// unallocated until the port is back.
	state := c.portStateFile("mlx5_3")
	restore := func() {
		if err := os.WriteFile(state, []byte("4: ACTIVE\n"), 0o644); err != nil {
			t.Errorf("restore %s: %v", state, err)
		}
	}
	defer restore()
	if err := os.WriteFile(state, []byte("1: DOWN\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.poll("hca-mlx5-3 marked unhealthy in the slice", time.Minute, func() (bool, string) {
		devs, err := c.railSlice()
		if err != nil {
			return false, err.Error()
		}
		d, ok := devs["hca-mlx5-3"]
		if !ok {
			return len(devs) == l.Rails, "hca-mlx5-3 left the slice"
		}
		tainted := slices.ContainsFunc(d.Taints, func(tn struct {
			Key    string `json:"key"`
			Value  string `json:"value"`
			Effect string `json:"effect"`
		}) bool {
			return tn.Key == "pxn.io/unhealthy" && tn.Value == "DOWN" && tn.Effect == "NoSchedule"
		})
		return tainted, d.line()
	})
	if devs, err := c.railSlice(); err == nil {
		if d, ok := devs["hca-mlx5-3"]; ok {
			t.Logf("with mlx5_3's port down: %s", d.line())
		} else {
			t.Logf("with mlx5_3's port down hca-mlx5-3 left the slice (the API server drops device taints)")
		}
	}
	down := workload{nsR, "r3", relayHolder{claim: "rail2"}}
	c.apply(alignedClaimYAML(nsR, "rail2", 1, "rail2") + "---\n" + probePod(down.ns, down.name, down.relayHolder))
	t.Logf("rail2 while its port is down: %s", c.podEventWith(nsR, down.name, "cannot allocate"))
	if alloc, err := c.allocation(nsR, "rail2"); err != nil || alloc != nil {
		t.Fatalf("claim %s/rail2 allocated %v (%v) while mlx5_3's port is down", nsR, alloc, err)
	}
	restore()
	c.poll(fmt.Sprintf("pod %s/%s Running once mlx5_3's port is back", nsR, down.name), podStartTimeout+draPrepareWait, func() (bool, string) {
		var p pod
		if err := c.getJSON(&p, "pod", "-n", nsR, down.name); err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == "Running", p.summary()
	})
	if _, env := c.checkAlignedPod(l, nsR, down.name, "rail2", 1); env["PXN_HCA"] != "mlx5_3" {
		t.Errorf("%s/%s: PXN_HCA=%q, want mlx5_3", nsR, down.name, env["PXN_HCA"])
	}
	c.mustKC("delete", "namespace", nsR, "--wait=true", "--timeout=2m")
}
