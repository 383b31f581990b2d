// SPDX-License-Identifier: Apache-2.0

package rail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/rail/internal/sysfixture"
)

func fixture(name string) string { return filepath.Join("testdata", "sysfs", name) }

func staticFile(name string) string { return filepath.Join("testdata", "static", name+".json") }

// hgxCompute are the 8-GPU layout's compute NICs in GPU bus order; mlx5_1
// and mlx5_6 are the storage NICs on root complexes of their own.
var hgxCompute = []string{"mlx5_0", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_7", "mlx5_8", "mlx5_9"}

func railsOf(hcas []string, name func(k int) string) map[string]string {
	m := map[string]string{}
	for k, h := range hcas {
		m[h] = name(k)
	}
	return m
}

func TestDiscoverFixtures(t *testing.T) {
	hgxHCAs := []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"}
	hgxGPUs := []string{"0000:18:00.0", "0000:3a:00.0", "0000:4b:00.0", "0000:5c:00.0", "0000:9a:00.0", "0000:ba:00.0", "0000:c9:00.0", "0000:d8:00.0"}
	pix8 := []string{"PIX", "PIX", "PIX", "PIX", "PIX", "PIX", "PIX", "PIX"}
	hgxPCIOrder := railsOf(hgxCompute, func(k int) string { return fmt.Sprintf("rail%d", k) })
	hgxSubnet := railsOf(hgxCompute, func(k int) string { return fmt.Sprintf("fe80:0000:0000:%04x", k) })
	hgxStatic := railsOf(hgxCompute, func(k int) string { return "rail-" + string(rune('a'+k)) })

	pcieHCAs := []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}
	pcieGPUs := []string{"0000:15:00.0", "0000:16:00.0", "0000:35:00.0", "0000:36:00.0", "0000:95:00.0", "0000:96:00.0", "0000:b5:00.0", "0000:b6:00.0"}
	pcieNearest := []string{"mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_2", "mlx5_2", "mlx5_3", "mlx5_3"}
	pxb8 := []string{"PXB", "PXB", "PXB", "PXB", "PXB", "PXB", "PXB", "PXB"}

	type want struct {
		hcas     []string
		gpus     []string // PCI bus ids in order
		nearest  []string
		distance []string
		railMap  map[string]string
		rails    int
		ready    bool
		readyMsg string
	}
	hgx := func(railMap map[string]string) want {
		return want{hgxHCAs, hgxGPUs, hgxCompute, pix8, railMap, 8, true, "8 railed HCAs active on 8 rails"}
	}
	down := func(w want) want {
		w.ready, w.readyMsg = false, "not active: mlx5_3 port 1 DOWN (Disabled)"
		return w
	}
	pcie := func(railMap map[string]string) want {
		return want{pcieHCAs, pcieGPUs, pcieNearest, pxb8, railMap, 4, true, "4 railed HCAs active on 4 rails"}
	}
	tests := []struct {
		fixture  string
		strategy string
		static   string
		want     want
	}{
		{sysfixture.HGX8GPU, StrategyPCIOrder, "", hgx(hgxPCIOrder)},
		{sysfixture.HGX8GPU, StrategySubnet, "", hgx(hgxSubnet)},
		{sysfixture.HGX8GPU, StrategyStatic, sysfixture.HGX8GPU, hgx(hgxStatic)},
		{sysfixture.HGX8GPU, "", "", hgx(hgxPCIOrder)},
		{sysfixture.HGX8GPUPortDown, StrategyPCIOrder, "", down(hgx(hgxPCIOrder))},
		{sysfixture.HGX8GPUPortDown, StrategySubnet, "", down(hgx(hgxSubnet))},
		{sysfixture.HGX8GPUPortDown, StrategyStatic, sysfixture.HGX8GPU, down(hgx(hgxStatic))},
		{sysfixture.HGX8GPUSRIOV, StrategyPCIOrder, "", hgx(hgxPCIOrder)},
		{sysfixture.HGX8GPUSRIOV, StrategySubnet, "", hgx(hgxSubnet)},
		{sysfixture.HGX8GPUSRIOV, StrategyStatic, sysfixture.HGX8GPU, hgx(hgxStatic)},
		{sysfixture.PCIe8GPU4NIC, StrategyPCIOrder, "", pcie(map[string]string{"mlx5_0": "rail0", "mlx5_1": "rail1", "mlx5_2": "rail2", "mlx5_3": "rail3"})},
		{sysfixture.PCIe8GPU4NIC, StrategySubnet, "", pcie(map[string]string{"mlx5_0": "10.1.0.0/24", "mlx5_1": "10.1.1.0/24", "mlx5_2": "10.1.2.0/24", "mlx5_3": "10.1.3.0/24"})},
		{sysfixture.PCIe8GPU4NIC, StrategyStatic, sysfixture.PCIe8GPU4NIC, pcie(map[string]string{"mlx5_0": "east-0", "mlx5_1": "east-1", "mlx5_2": "west-0", "mlx5_3": "west-1"})},
	}
	for _, tc := range tests {
		t.Run(tc.fixture+"/"+tc.strategy, func(t *testing.T) {
			opts := Options{NodeRoot: fixture(tc.fixture), Strategy: tc.strategy}
			if tc.static != "" {
				opts.StaticFile = staticFile(tc.static)
			}
			l, err := Discover(context.Background(), opts)
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if len(l.Warnings) != 0 {
				t.Errorf("warnings on a clean fixture: %q", l.Warnings)
			}
			w := tc.want
			var hcas, gpus, nearest, dist []string
			for _, h := range l.HCAs {
				hcas = append(hcas, h.Name)
				if h.Rail != w.railMap[h.Name] {
					t.Errorf("HCA %s rail %q, want %q", h.Name, h.Rail, w.railMap[h.Name])
				}
			}
			for i, g := range l.GPUs {
				gpus = append(gpus, g.PCIBusID)
				nearest = append(nearest, g.HCA)
				dist = append(dist, g.Distance)
				if g.Index != i {
					t.Errorf("GPU %s index %d, want %d (bus order)", g.PCIBusID, g.Index, i)
				}
				if g.Rail != w.railMap[g.HCA] {
					t.Errorf("GPU %d rail %q, want its HCA %s's %q", i, g.Rail, g.HCA, w.railMap[g.HCA])
				}
			}
			check := func(what string, got, want any) {
				t.Helper()
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%s:\n got %v\nwant %v", what, got, want)
				}
			}
			check("HCAs", hcas, w.hcas)
			check("GPUs", gpus, w.gpus)
			check("nearest HCAs", nearest, w.nearest)
			check("distances", dist, w.distance)
			check("rail map", l.RailMap, w.railMap)
			check("rails", l.Rails, w.rails)
			ready, msg := l.Ready()
			check("ready", ready, w.ready)
			check("ready message", msg, w.readyMsg)
			check("healthy", l.Healthy(), true)
			wantStrategy := tc.strategy
			if wantStrategy == "" {
				wantStrategy = StrategyPCIOrder
			}
			check("strategy", l.Strategy, wantStrategy)
			check("GPU source", l.GPUSource, GPUSourceSysfs)
			check("pairs", len(l.Pairs), len(w.gpus)*len(w.hcas))
		})
	}
}

func TestFixturePairs(t *testing.T) {
	tests := []struct {
		fixture string
		pairs   []Pair
	}{
		{sysfixture.HGX8GPU, []Pair{
			{0, "mlx5_0", DistancePIX},
			{0, "mlx5_1", DistanceNODE}, // storage NIC, same socket
			{0, "mlx5_2", DistanceNODE},
			{0, "mlx5_5", DistanceSYS},
			{0, "mlx5_6", DistanceSYS},
			{4, "mlx5_6", DistanceNODE},
			{7, "mlx5_9", DistancePIX},
			{7, "mlx5_0", DistanceSYS},
		}},
		{sysfixture.PCIe8GPU4NIC, []Pair{
			{0, "mlx5_0", DistancePXB},
			{1, "mlx5_0", DistancePXB},
			{1, "mlx5_1", DistanceNODE},
			{1, "mlx5_2", DistanceSYS},
			{6, "mlx5_3", DistancePXB},
			{6, "mlx5_2", DistanceNODE},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.fixture, func(t *testing.T) {
			l, err := Discover(context.Background(), Options{NodeRoot: fixture(tc.fixture)})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, p := range l.Pairs {
				got[fmt.Sprintf("%d/%s", p.GPU, p.HCA)] = p.Distance
			}
			for _, p := range tc.pairs {
				if d := got[fmt.Sprintf("%d/%s", p.GPU, p.HCA)]; d != p.Distance {
					t.Errorf("GPU %d - %s: %q, want %q", p.GPU, p.HCA, d, p.Distance)
				}
			}
		})
	}
}

func TestSRIOVVirtualFunctionsAreNotHCAs(t *testing.T) {
	l, err := Discover(context.Background(), Options{NodeRoot: fixture(sysfixture.HGX8GPUSRIOV)})
	if err != nil {
		t.Fatal(err)
	}
	for _, vf := range []string{"mlx5_10", "mlx5_11", "mlx5_12", "mlx5_13"} {
		if _, err := os.Lstat(filepath.Join(fixture(sysfixture.HGX8GPUSRIOV), "sys/class/infiniband", vf)); err != nil {
			t.Fatalf("fixture lacks VF %s: %v", vf, err)
		}
		for _, h := range l.HCAs {
			if h.Name == vf {
				t.Errorf("VF %s listed as an HCA", vf)
			}
		}
	}
	if len(l.HCAs) != 10 {
		t.Errorf("%d HCAs, want the 10 physical functions", len(l.HCAs))
	}
}

func TestSubnetStrategy(t *testing.T) {
	t.Run("prefix 16 puts every NIC on one rail and warns", func(t *testing.T) {
		l, err := Discover(context.Background(), Options{NodeRoot: fixture(sysfixture.PCIe8GPU4NIC), Strategy: StrategySubnet, SubnetPrefixLen: 16})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"mlx5_0": "10.1.0.0/16", "mlx5_1": "10.1.0.0/16", "mlx5_2": "10.1.0.0/16", "mlx5_3": "10.1.0.0/16"}
		if !reflect.DeepEqual(l.RailMap, want) || l.Rails != 1 {
			t.Errorf("rail map %v (%d rails), want %v (1 rail)", l.RailMap, l.Rails, want)
		}
		if len(l.Warnings) != 1 || !strings.Contains(l.Warnings[0], "rail 10.1.0.0/16 has 4 HCAs on this node (mlx5_0, mlx5_1, mlx5_2, mlx5_3)") {
			t.Errorf("warnings %q, want one about the ambiguous rail", l.Warnings)
		}
	})
	t.Run("prefix 32", func(t *testing.T) {
		l, err := Discover(context.Background(), Options{NodeRoot: fixture(sysfixture.PCIe8GPU4NIC), Strategy: StrategySubnet, SubnetPrefixLen: 32})
		if err != nil {
			t.Fatal(err)
		}
		if got := l.RailMap["mlx5_2"]; got != "10.1.2.21/32" {
			t.Errorf("mlx5_2 rail %q, want 10.1.2.21/32", got)
		}
	})
	t.Run("storage NICs near no GPU get no rail", func(t *testing.T) {
		l, err := Discover(context.Background(), Options{NodeRoot: fixture(sysfixture.HGX8GPU), Strategy: StrategySubnet})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range []string{"mlx5_1", "mlx5_6"} {
			if r, ok := l.RailMap[h]; ok {
				t.Errorf("storage NIC %s on rail %q", h, r)
			}
		}
	})
}

// TestSubnetStrategySharedInfiniBandPrefix: on a fabric whose subnet
// managers keep the default prefix, the subnet strategy must not put every
// HCA on one rail; it rails none of them and the layout says why.
func TestSubnetStrategySharedInfiniBandPrefix(t *testing.T) {
	l, err := Discover(context.Background(), Options{NodeRoot: fixture(sysfixture.HGX8GPUDefaultPrefix), Strategy: StrategySubnet})
	if err != nil {
		t.Fatal(err)
	}
	compute := []string{"mlx5_0", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_7", "mlx5_8", "mlx5_9"}
	want := []SharedSubnet{{Subnet: "fe80:0000:0000:0000", LinkLayer: "InfiniBand", HCAs: compute}}
	if !reflect.DeepEqual(l.SharedSubnets, want) {
		t.Errorf("shared subnets %+v, want %+v", l.SharedSubnets, want)
	}
	if len(l.RailMap) != 0 || l.Rails != 0 {
		t.Errorf("rail map %v (%d rails), want none", l.RailMap, l.Rails)
	}
	ready, msg := l.Ready()
	wantMsg := "rail strategy subnet: HCAs " + strings.Join(compute, ", ") +
		" share InfiniBand subnet prefix fe80:0000:0000:0000, so the prefix cannot tell their rails apart and they get no rail; " +
		"give each rail's subnet manager its own subnet prefix, or use rail strategy pci-order or static"
	if ready || msg != wantMsg {
		t.Errorf("Ready() = %v, %q; want false, %q", ready, msg, wantMsg)
	}
	if j := l.RailMapJSON(); j != "{}" {
		t.Errorf("RailMapJSON() = %s, want {}", j)
	}

	for _, strategy := range []string{StrategyPCIOrder, StrategySubnet} {
		root := fixture(sysfixture.HGX8GPU)
		l, err := Discover(context.Background(), Options{NodeRoot: root, Strategy: strategy})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.SharedSubnets) != 0 || l.Rails != 8 {
			t.Errorf("%s on %s: shared subnets %v, %d rails; want none and 8", strategy, root, l.SharedSubnets, l.Rails)
		}
	}
}

// TestHCANamesOutsideTheContractGetNoRail: the kernel may name an HCA
// longer than the registry header holds; that HCA gets no rail and a
// warning, and the rest of the map stays usable.
func TestHCANamesOutsideTheContractGetNoRail(t *testing.T) {
	long := strings.Repeat("h", 57)
	m := oddBase()
	m.Roots[2].Devices[0].Devices[0].Devices[1].Devices[0].RDMA.Name = long
	root := t.TempDir()
	if err := m.Render().Write(root); err != nil {
		t.Fatal(err)
	}
	l, err := Discover(context.Background(), Options{NodeRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"mlx5_0": "rail0", "mlx5_3": "rail2"}; !reflect.DeepEqual(l.RailMap, want) {
		t.Errorf("rail map %v, want %v", l.RailMap, want)
	}
	found := false
	for _, w := range l.Warnings {
		found = found || strings.Contains(w, long) && strings.Contains(w, "has no rail: length 57 not in 1..56")
	}
	if !found {
		t.Errorf("warnings %q, want one about HCA %s", l.Warnings, long)
	}
	if _, err := contract.ParseRailMap(l.RailMapJSON()); err != nil {
		t.Errorf("the engine refuses the rail map: %v", err)
	}
}

func TestStaticStrategy(t *testing.T) {
	dir := t.TempDir()
	table := filepath.Join(dir, "rails.json")
	if err := os.WriteFile(table, []byte(`{"mlx5_0": "r0", "mlx5_1": "storage", "mlx5_42": "r9"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Discover(context.Background(), Options{NodeRoot: fixture(sysfixture.HGX8GPU), Strategy: StrategyStatic, StaticFile: table})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"mlx5_0": "r0", "mlx5_1": "storage"}
	if !reflect.DeepEqual(l.RailMap, want) || l.Rails != 2 {
		t.Errorf("rail map %v (%d rails), want %v (2 rails)", l.RailMap, l.Rails, want)
	}
	if l.GPUs[1].Rail != "" {
		t.Errorf("GPU 1 on rail %q; its HCA mlx5_2 is not in the table", l.GPUs[1].Rail)
	}
	if len(l.Warnings) != 1 || !strings.HasPrefix(l.Warnings[0], table+": ") || !strings.Contains(l.Warnings[0], `"mlx5_42"`) {
		t.Errorf("warnings %q, want one naming %s and mlx5_42", l.Warnings, table)
	}
}

func TestDiscoverOptionErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`["mlx5_0"]`), 0o644); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	root := fixture(sysfixture.HGX8GPU)
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"unknown strategy", Options{NodeRoot: root, Strategy: "round-robin"}, `rail strategy "round-robin"`},
		{"prefix too long", Options{NodeRoot: root, Strategy: StrategySubnet, SubnetPrefixLen: 33}, "prefix length 33"},
		{"prefix negative", Options{NodeRoot: root, Strategy: StrategySubnet, SubnetPrefixLen: -1}, "prefix length -1"},
		{"static without file", Options{NodeRoot: root, Strategy: StrategyStatic}, "needs a static file"},
		{"static file missing", Options{NodeRoot: root, Strategy: StrategyStatic, StaticFile: filepath.Join(dir, "nope.json")}, "nope.json"},
		{"static file not an object", Options{NodeRoot: root, Strategy: StrategyStatic, StaticFile: bad}, "not a JSON object"},
		{"host root missing", Options{NodeRoot: filepath.Join(dir, "nowhere")}, "host root"},
		{"host root is a file", Options{NodeRoot: notDir}, "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Discover(context.Background(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Discover = %v, %v; want an error containing %q", l, err, tc.want)
			}
		})
	}
}

func TestDiscoverCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Discover(ctx, Options{NodeRoot: fixture(sysfixture.HGX8GPU)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Discover on a canceled context: %v, want context.Canceled", err)
	}
}

func TestLayoutReadyHealthyRailMapJSON(t *testing.T) {
	hca := func(name, rail, state string) HCA {
		return HCA{Name: name, Rail: rail, State: state, PhysState: "LinkUp", Port: 1}
	}
	tests := []struct {
		name     string
		layout   Layout
		ready    bool
		msg      string
		healthy  bool
		railJSON string
	}{
		{
			name: "all active",
			layout: Layout{Rails: 2, RailMap: map[string]string{"mlx5_1": "rail1", "mlx5_0": "rail0"},
				HCAs: []HCA{hca("mlx5_0", "rail0", "ACTIVE"), hca("mlx5_1", "rail1", "ACTIVE"), hca("mlx5_2", "", "DOWN")}},
			ready: true, msg: "2 railed HCAs active on 2 rails", healthy: true,
			railJSON: `{"mlx5_0":"rail0","mlx5_1":"rail1"}`,
		},
		{
			name: "one down, one unknown",
			layout: Layout{RailMap: map[string]string{"b": "rail0", "a": "rail1", "c": "rail2"}, HCAs: []HCA{
				hca("a", "rail1", "ACTIVE"),
				{Name: "b", Rail: "rail0", State: "DOWN", PhysState: "Polling", Port: 2},
				{Name: "c", Rail: "rail2", State: StateUnknown},
			}},
			ready: false, msg: "not active: b port 2 DOWN (Polling); c has no port", healthy: true,
			railJSON: `{"a":"rail1","b":"rail0","c":"rail2"}`,
		},
		{
			name:   "all railed down",
			layout: Layout{RailMap: map[string]string{"a": "r"}, HCAs: []HCA{{Name: "a", Rail: "r", State: "INIT", Port: 1}}},
			ready:  false, msg: "not active: a port 1 INIT", healthy: false,
			railJSON: `{"a":"r"}`,
		},
		{
			name:   "nothing railed",
			layout: Layout{HCAs: []HCA{hca("a", "", "ACTIVE")}},
			ready:  false, msg: "no HCA is on a rail", healthy: false,
			railJSON: `{}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ready, msg := tc.layout.Ready()
			if ready != tc.ready || msg != tc.msg {
				t.Errorf("Ready() = %v, %q; want %v, %q", ready, msg, tc.ready, tc.msg)
			}
			if h := tc.layout.Healthy(); h != tc.healthy {
				t.Errorf("Healthy() = %v, want %v", h, tc.healthy)
			}
			if j := tc.layout.RailMapJSON(); j != tc.railJSON {
				t.Errorf("RailMapJSON() = %s, want %s", j, tc.railJSON)
			}
		})
	}
}

func TestLayoutJSONFieldNames(t *testing.T) {
	l, err := Discover(context.Background(), Options{NodeRoot: fixture(sysfixture.HGX8GPU)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"gpus", "hcas", "railMap", "rails", "strategy"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("layout JSON lacks %q: %s", k, b)
		}
	}
	for _, k := range []string{"Warnings", "warnings"} {
		if _, ok := raw[k]; ok {
			t.Errorf("layout JSON carries %q", k)
		}
	}
	var gpus []map[string]any
	if err := json.Unmarshal(raw["gpus"], &gpus); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"index", "pciBusID", "numaNode", "hca", "distance", "rail"} {
		if _, ok := gpus[0][k]; !ok {
			t.Errorf("GPU JSON lacks %q: %v", k, gpus[0])
		}
	}
	var hcas []map[string]any
	if err := json.Unmarshal(raw["hcas"], &hcas); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "pciBusID", "numaNode", "linkLayer", "state", "physState", "rate", "netdev", "rail"} {
		if _, ok := hcas[0][k]; !ok {
			t.Errorf("HCA JSON lacks %q: %v", k, hcas[0])
		}
	}
	var back Layout
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, l) {
		t.Errorf("layout does not survive a JSON round trip")
	}
}

type fakeGPUs struct {
	gpus []DriverGPU
	err  error
}

func (f fakeGPUs) ListGPUs(context.Context) ([]DriverGPU, error) { return f.gpus, f.err }

func TestDriverGPUs(t *testing.T) {
	root := fixture(sysfixture.HGX8GPU)
	t.Run("NVML bus ids are normalised and placed", func(t *testing.T) {
		var list []DriverGPU
		for i, id := range []string{"00000000:D8:00.0", "00000000:C9:00.0", "00000000:BA:00.0", "00000000:9A:00.0", "00000000:5C:00.0", "00000000:4B:00.0", "00000000:3A:00.0", "00000000:18:00.0"} {
			list = append(list, DriverGPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Name: "NVIDIA H200", PCIBusID: id})
		}
		l, err := Discover(context.Background(), Options{NodeRoot: root, GPUs: fakeGPUs{gpus: list}})
		if err != nil {
			t.Fatal(err)
		}
		if l.GPUSource != GPUSourceNVML || len(l.Warnings) != 0 || len(l.GPUs) != 8 {
			t.Fatalf("source %s, %d GPUs, warnings %q", l.GPUSource, len(l.GPUs), l.Warnings)
		}
		g := l.GPUs[0]
		want := GPU{Index: 7, UUID: "GPU-7", Name: "NVIDIA H200", PCIBusID: "0000:18:00.0", PCIeRoot: "pci0000:15", NUMANode: 0, HCA: "mlx5_0", Distance: DistancePIX, Rail: "rail0"}
		if g != want {
			t.Errorf("first GPU in bus order %+v, want %+v", g, want)
		}
		if g := l.GPUs[7]; g.Index != 0 || g.NUMANode != 1 || g.Rail != "rail7" {
			t.Errorf("last GPU in bus order %+v, want NVML index 0 on NUMA 1, rail7", g)
		}
	})
	t.Run("a GPU sysfs does not show is kept without distances", func(t *testing.T) {
		l, err := Discover(context.Background(), Options{NodeRoot: root, GPUs: fakeGPUs{gpus: []DriverGPU{
			{Index: 0, UUID: "GPU-a", PCIBusID: "00000000:18:00.0"},
			{Index: 1, UUID: "GPU-b", PCIBusID: "00000000:01:00.0"},
			{Index: 2, UUID: "GPU-c", PCIBusID: "not-a-bus-id"},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.GPUs) != 2 || l.GPUs[0].PCIBusID != "0000:01:00.0" || l.GPUs[0].HCA != "" || l.GPUs[0].NUMANode != -1 {
			t.Fatalf("GPUs %+v, want 0000:01:00.0 without HCA, then 0000:18:00.0", l.GPUs)
		}
		wantWarn := []string{filepath.Join(root, "sys/bus/pci/devices/0000:01:00.0") + ": GPU 1 has no usable PCI device", `GPU 2 (GPU-c): skipped: PCI address "not-a-bus-id"`}
		if len(l.Warnings) != len(wantWarn) {
			t.Fatalf("warnings %q, want %d", l.Warnings, len(wantWarn))
		}
		for i, w := range wantWarn {
			if !strings.HasPrefix(l.Warnings[i], w) {
				t.Errorf("warning %q, want it to start with %q", l.Warnings[i], w)
			}
		}
		if l.RailMapJSON() != `{"mlx5_0":"rail0"}` {
			t.Errorf("rail map %s", l.RailMapJSON())
		}
	})
	t.Run("a driver that sees no GPU or other GPUs gives way to the scan", func(t *testing.T) {
		tests := []struct {
			name     string
			list     []DriverGPU
			wantWarn string
		}{
			{name: "none visible", wantWarn: "GPU driver library lists no GPU"},
			{name: "another host's GPUs", list: []DriverGPU{{Index: 0, UUID: "GPU-x", Name: "NVIDIA H200", PCIBusID: "00000000:01:00.0"}},
				wantWarn: "GPU driver library lists 1 GPUs, none of them under " + filepath.Join(root, "sys/bus/pci/devices")},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				l, err := Discover(context.Background(), Options{NodeRoot: root, GPUs: fakeGPUs{gpus: tc.list}})
				if err != nil {
					t.Fatal(err)
				}
				if l.GPUSource != GPUSourceSysfs || len(l.GPUs) != 8 || len(l.Warnings) != 1 ||
					!strings.HasPrefix(l.Warnings[0], tc.wantWarn) || !strings.HasSuffix(l.Warnings[0], "the PCI scan found 8 GPUs and is used instead") {
					t.Errorf("source %s, %d GPUs, warnings %q; want 8 GPUs from sysfs and one warning starting %q", l.GPUSource, len(l.GPUs), l.Warnings, tc.wantWarn)
				}
			})
		}
	})
	t.Run("no driver falls back to the PCI scan quietly", func(t *testing.T) {
		l, err := Discover(context.Background(), Options{NodeRoot: root, GPUs: fakeGPUs{err: fmt.Errorf("nvml: %w", ErrNoDriver)}})
		if err != nil {
			t.Fatal(err)
		}
		if l.GPUSource != GPUSourceSysfs || len(l.GPUs) != 8 || len(l.Warnings) != 0 {
			t.Errorf("source %s, %d GPUs, warnings %q; want 8 GPUs from sysfs, no warning", l.GPUSource, len(l.GPUs), l.Warnings)
		}
	})
	t.Run("a failing driver falls back with a warning", func(t *testing.T) {
		l, err := Discover(context.Background(), Options{NodeRoot: root, GPUs: fakeGPUs{err: errors.New("nvml init: Insufficient Permissions")}})
		if err != nil {
			t.Fatal(err)
		}
		if l.GPUSource != GPUSourceSysfs || len(l.GPUs) != 8 || len(l.Warnings) != 1 || !strings.Contains(l.Warnings[0], "Insufficient Permissions") {
			t.Errorf("source %s, %d GPUs, warnings %q", l.GPUSource, len(l.GPUs), l.Warnings)
		}
	})
}

// TestNVML runs the real NVML lister: without a driver it must report
// ErrNoDriver, with one every GPU must carry a UUID and a PCI address.
func TestNVML(t *testing.T) {
	gpus, err := NVML().ListGPUs(context.Background())
	if errors.Is(err, ErrNoDriver) {
		t.Logf("no driver: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("NVML: %v", err)
	}
	for _, g := range gpus {
		if _, err := NormalizeBusID(g.PCIBusID); err != nil || g.UUID == "" || g.Name == "" {
			t.Errorf("GPU %+v: bus id error %v, or no UUID or name", g, err)
		}
	}
	t.Logf("NVML GPUs: %+v", gpus)
}

// TestDiscoverThisHost discovers the machine the test runs on: whatever it
// has, discovery must not fail.
func TestDiscoverThisHost(t *testing.T) {
	l, err := Discover(context.Background(), Options{})
	if err != nil {
		t.Fatalf("Discover on this host: %v", err)
	}
	b, _ := json.Marshal(l)
	t.Logf("layout %s; warnings %q", b, l.Warnings)
}
