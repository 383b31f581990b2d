// SPDX-License-Identifier: Apache-2.0

package dra_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/pxn-project/pxn/pkg/dra"
	"github.com/pxn-project/pxn/pkg/nodestate"
	"github.com/pxn-project/pxn/pkg/rail"
)

// fixtureState is the node state a rail monitor reaches on one of the
// rail package's sysfs fixtures.
func fixtureState(t *testing.T, fixture string) nodestate.NodeState {
	t.Helper()
	root := filepath.Join("..", "rail", "testdata", "sysfs", fixture)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m := nodestate.NewMonitor(nodestate.RailDiscoverer{Options: rail.Options{FS: os.DirFS(root), NodeRoot: root}},
		nodestate.Options{Interval: time.Hour})
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var st nodestate.NodeState
	waitFor(t, "discovery of "+fixture, func() bool { st, _ = m.State(); return st.Discovered })
	if st.Err != nil || st.Layout == nil {
		t.Fatalf("discovery of %s: %v", fixture, st.Err)
	}
	return st
}

// nodeSlice is the one ResourceSlice of the node, nil before there is one.
func nodeSlice(t *testing.T, client *fake.Clientset) *resourceapi.ResourceSlice {
	t.Helper()
	l, err := client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) > 1 {
		t.Fatalf("%d slices, want one", len(l.Items))
	}
	if len(l.Items) == 0 {
		return nil
	}
	return &l.Items[0]
}

// deviceLines is a slice's devices, one line each: name, attributes in
// name order, taints.
func deviceLines(s *resourceapi.ResourceSlice) []string {
	var lines []string
	for _, d := range s.Spec.Devices {
		names := make([]string, 0, len(d.Attributes))
		for n := range d.Attributes {
			names = append(names, string(n))
		}
		slices.Sort(names)
		parts := []string{d.Name}
		for _, n := range names {
			a := d.Attributes[resourceapi.QualifiedName(n)]
			var v any
			switch {
			case a.StringValue != nil:
				v = *a.StringValue
			case a.IntValue != nil:
				v = *a.IntValue
			case a.BoolValue != nil:
				v = *a.BoolValue
			case a.VersionValue != nil:
				v = *a.VersionValue
			}
			parts = append(parts, fmt.Sprintf("%s=%v", n, v))
		}
		for _, tn := range d.Taints {
			parts = append(parts, fmt.Sprintf("taint:%s=%s:%s", tn.Key, tn.Value, tn.Effect))
		}
		lines = append(lines, strings.Join(parts, " "))
	}
	return lines
}

func railLine(hca, busID, root string, numa int, rail, rate, state string, healthy bool) string {
	line := fmt.Sprintf("%s hca=%s healthy=%v linkLayer=InfiniBand linkRateGbps=%s portState=%s rail=%s "+
		"resource.kubernetes.io/numaNode=%d resource.kubernetes.io/pciBusID=%s resource.kubernetes.io/pcieRoot=%s",
		dra.RailDeviceName(hca), hca, healthy, rate, state, rail, numa, busID, root)
	if !healthy {
		line += " taint:" + dra.TaintUnhealthy + "=" + state + ":NoSchedule"
	}
	return line
}

// hgxRailLines is the rail devices of the bundled 8-GPU node: one per
// railed HCA, each on the PCIe root of its GPU; mlx5_1 and mlx5_6 (the
// Ethernet HCAs no GPU is near) have no rail and no device.
func hgxRailLines(down string) []string {
	type h struct {
		name, bus, root string
		numa            int
		rail            string
	}
	var lines []string
	for _, x := range []h{
		{"mlx5_0", "0000:19:00.0", "pci0000:15", 0, "rail0"},
		{"mlx5_2", "0000:3b:00.0", "pci0000:37", 0, "rail1"},
		{"mlx5_3", "0000:4c:00.0", "pci0000:48", 0, "rail2"},
		{"mlx5_4", "0000:5d:00.0", "pci0000:59", 0, "rail3"},
		{"mlx5_5", "0000:9b:00.0", "pci0000:97", 1, "rail4"},
		{"mlx5_7", "0000:bb:00.0", "pci0000:b7", 1, "rail5"},
		{"mlx5_8", "0000:ca:00.0", "pci0000:c6", 1, "rail6"},
		{"mlx5_9", "0000:d9:00.0", "pci0000:d5", 1, "rail7"},
	} {
		if x.name == down {
			lines = append(lines, railLine(x.name, x.bus, x.root, x.numa, x.rail, "10", "DOWN", false))
			continue
		}
		lines = append(lines, railLine(x.name, x.bus, x.root, x.numa, x.rail, "400", "ACTIVE", true))
	}
	return lines
}

func TestPublishesRailDevicesOfTheFixture(t *testing.T) {
	dirs := newNodeDirs(t)
	client := newClient(t)
	state := newRailState(fixtureState(t, "hgx-8gpu"))
	p := startPlugin(t, dirs, client, state)

	waitFor(t, "ResourceSlice", func() bool { return nodeSlice(t, client) != nil })
	lines := deviceLines(nodeSlice(t, client))
	t.Logf("ResourceSlice of the 8-GPU node:\n%s", strings.Join(lines, "\n"))
	relay := "relay gpus=8 hcas=10 railStrategy=pci-order rails=8 railsReady=true version=0.1.0-devel"
	if want := append([]string{relay}, hgxRailLines("")...); !slices.Equal(lines, want) {
		t.Fatalf("devices:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	for _, d := range nodeSlice(t, client).Spec.Devices {
		if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("device %s may not be allocated to several claims", d.Name)
		}
	}

	// mlx5_3's port goes down: its device stays, tainted, and the relay
	// device's counts follow the monitor.
	state.set(fixtureState(t, "hgx-8gpu-portdown"))
	// Not every railed port is up, but one is: the relay device stays ready.
	want := append([]string{relay}, hgxRailLines("mlx5_3")...)
	waitFor(t, "mlx5_3's device tainted", func() bool { return slices.Equal(deviceLines(nodeSlice(t, client)), want) })

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := p.health.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	health := map[string]drahealthv1.HealthStatus{}
	for _, d := range r.Devices {
		health[d.Device.DeviceName] = d.Health
	}
	if len(health) != 9 || health[dra.DeviceName] != drahealthv1.HealthStatus_HEALTHY ||
		health["hca-mlx5-3"] != drahealthv1.HealthStatus_UNHEALTHY || health["hca-mlx5-0"] != drahealthv1.HealthStatus_HEALTHY {
		t.Fatalf("health %v: want the relay device and 7 rail devices healthy, hca-mlx5-3 unhealthy", health)
	}
}

// The API server drops taints when its DRADeviceTaints feature is off: the
// driver then leaves a rail device whose port is down out of the slice.
func TestRailDeviceLeavesWhenTaintsAreDropped(t *testing.T) {
	dirs := newNodeDirs(t)
	client := newClient(t)
	p := startPlugin(t, dirs, client, newRailState(fixtureState(t, "hgx-8gpu-portdown")))
	waitFor(t, "ResourceSlice", func() bool { return nodeSlice(t, client) != nil })
	published := nodeSlice(t, client)
	if n := len(published.Spec.Devices); n != 9 {
		t.Fatalf("%d devices, want 9", n)
	}
	stripped := published.DeepCopy()
	for i := range stripped.Spec.Devices {
		stripped.Spec.Devices[i].Taints = nil
	}
	// The helper hands the slice controller's errors on as recoverable.
	dropped := &resourceslice.DroppedFieldsError{PoolName: node, DesiredSlice: published, ActualSlice: stripped}
	p.driver.HandleError(t.Context(), fmt.Errorf("%w: %w", kubeletplugin.ErrRecoverable, dropped), "slice update")
	waitFor(t, "hca-mlx5-3 gone", func() bool {
		var names []string
		for _, d := range nodeSlice(t, client).Spec.Devices {
			names = append(names, d.Name)
		}
		return len(names) == 8 && !slices.Contains(names, "hca-mlx5-3") && slices.Contains(names, "hca-mlx5-4")
	})
}

// classExpressions are the CEL expressions of the chart's DeviceClasses,
// in the order the template has them: the relay class's, the rail class's.
func classExpressions(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "charts", "pxn", "templates", "dra-deviceclass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, line := range strings.Split(string(data), "\n") {
		if e, ok := strings.CutPrefix(strings.TrimSpace(line), "expression: "); ok {
			exprs = append(exprs, e)
		}
	}
	if len(exprs) != 2 {
		t.Fatalf("chart has %d DeviceClass expressions, want 2: %q", len(exprs), exprs)
	}
	return exprs
}

// matching is the names of the devices an expression selects, the way the
// scheduler evaluates it.
func matching(t *testing.T, expr string, devs []resourceapi.Device) []string {
	t.Helper()
	c := dracel.GetCompiler(dracel.Features{}).CompileCELExpression(expr, dracel.Options{})
	if c.Error != nil {
		t.Fatalf("compile %s: %v", expr, c.Error)
	}
	var names []string
	for _, d := range devs {
		ok, _, err := c.DeviceMatches(t.Context(), dracel.Device{Driver: dra.DriverName, Attributes: d.Attributes,
			AllowMultipleAllocations: d.AllowMultipleAllocations})
		if err != nil {
			t.Fatalf("%s on %s: %v", expr, d.Name, err)
		}
		if ok {
			names = append(names, d.Name)
		}
	}
	return names
}

// The relay class selects the relay device alone, the rail class every rail
// device, and a claim's selector on the rail attribute one device.
func TestDeviceClassesSelectTheirDevices(t *testing.T) {
	dirs := newNodeDirs(t)
	client := newClient(t)
	startPlugin(t, dirs, client, newRailState(fixtureState(t, "hgx-8gpu")))
	waitFor(t, "ResourceSlice", func() bool { return nodeSlice(t, client) != nil })
	devs := nodeSlice(t, client).Spec.Devices
	exprs := classExpressions(t)
	if got := matching(t, exprs[0], devs); !slices.Equal(got, []string{dra.DeviceName}) {
		t.Errorf("relay class selects %v, want [%s]", got, dra.DeviceName)
	}
	rails := matching(t, exprs[1], devs)
	if len(rails) != 8 || slices.Contains(rails, dra.DeviceName) {
		t.Errorf("rail class selects %v, want the 8 rail devices", rails)
	}
	// A claim's own selectors see only the devices its class selected.
	var railDevs []resourceapi.Device
	for _, d := range devs {
		if slices.Contains(rails, d.Name) {
			railDevs = append(railDevs, d)
		}
	}
	if got := matching(t, `device.attributes["pxn.io"].rail == "rail5"`, railDevs); !slices.Equal(got, []string{"hca-mlx5-7"}) {
		t.Errorf("rail5 selector selects %v, want [hca-mlx5-7]", got)
	}
	sel := `device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:48" && device.attributes["pxn.io"].healthy`
	if got := matching(t, sel, railDevs); !slices.Equal(got, []string{"hca-mlx5-3"}) {
		t.Errorf("pcieRoot selector selects %v, want [hca-mlx5-3]", got)
	}
}
