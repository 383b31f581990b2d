// SPDX-License-Identifier: Apache-2.0

package rail

import (
	"context"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/rail/internal/sysfixture"
)

func TestClassify(t *testing.T) {
	p := func(s string) []string { return strings.Split(s, "/") }
	tests := []struct {
		name         string
		a, b         string
		numaA, numaB int
		class        string
		hops         int
	}{
		{"one switch, two downstream ports", "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
			"pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0", 0, 0, DistancePIX, 2},
		{"functions of one device on one port", "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
			"pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.1", 0, 0, DistancePIX, 0},
		{"device on the switch, other behind a second switch", "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0",
			"pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:1b:00.0", 0, 0, DistancePXB, 4},
		{"both behind second-level switches", "pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:00.0/0000:13:00.0/0000:14:00.0/0000:15:00.0",
			"pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:17:00.0/0000:18:00.0/0000:19:00.0", 0, 0, DistancePXB, 6},
		{"different root ports", "pci0000:20/0000:20:01.0/0000:21:00.0",
			"pci0000:20/0000:20:02.0/0000:22:00.0", 0, 0, DistancePHB, 2},
		{"different root complexes, one NUMA node", "pci0000:15/0000:15:01.0/0000:16:00.0",
			"pci0000:37/0000:37:01.0/0000:38:00.0/0000:39:00.0", 0, 0, DistanceNODE, 3},
		{"different root complexes, NUMA unknown", "pci0000:15/0000:15:01.0/0000:16:00.0",
			"pci0000:97/0000:97:01.0/0000:98:00.0", -1, 1, DistanceNODE, 2},
		{"different NUMA nodes", "pci0000:15/0000:15:01.0/0000:16:00.0",
			"pci0000:97/0000:97:01.0/0000:98:00.0", 0, 1, DistanceSYS, 2},
		{"VMD domain below a root port", "pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1d.0/10000:e1:00.0",
			"pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1e.0/10000:e2:00.0", 0, 0, DistancePHB, 2},
		{"VMD domain, one switch", "pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1d.0/10000:e1:00.0/10000:e2:00.0/10000:e3:00.0",
			"pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1d.0/10000:e1:00.0/10000:e2:01.0/10000:e4:00.0", 0, 0, DistancePIX, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, swap := range []bool{false, true} {
				a, b, na, nb := p(tc.a), p(tc.b), tc.numaA, tc.numaB
				if swap {
					a, b, na, nb = b, a, nb, na
				}
				d, ok := classify(a, b, na, nb)
				if !ok || d.class != tc.class || d.hops != tc.hops {
					t.Errorf("classify (swapped %v) = %+v, %v; want %s with %d bridges", swap, d, ok, tc.class, tc.hops)
				}
			}
		})
	}
	if _, ok := classify(nil, p("pci0000:00/0000:00:01.0"), 0, 0); ok {
		t.Error("classify with an unknown path succeeded")
	}
}

// TestNearestTieBreaks builds a machine where the nearest HCA is decided by
// each tie-breaker in turn.
func TestNearestTieBreaks(t *testing.T) {
	B, bdf := sysfixture.Bridge, sysfixture.BDF
	m := sysfixture.Machine{Roots: []sysfixture.Root{
		{
			// GPU 13 and two NICs on one switch, both PIX with the same
			// number of bridges: the lower PCI address (14, named mlx5_9)
			// wins over the lower name (mlx5_0 at 15).
			Bus: 0x10, NUMA: 0,
			Devices: []sysfixture.Device{B(bdf(0x10, 1, 0), B(bdf(0x11, 0, 0),
				B(bdf(0x12, 0, 0), sysfixture.GPU(bdf(0x13, 0, 0))),
				B(bdf(0x12, 1, 0), sysfixture.IBNIC(bdf(0x14, 0, 0), "mlx5_9", 0)),
				B(bdf(0x12, 2, 0), sysfixture.IBNIC(bdf(0x15, 0, 0), "mlx5_0", 1)),
			))},
		},
		{
			// GPU 25 on its own root port; NIC 23 behind a switch and NIC
			// 24 on a root port are both PHB: the one with fewer bridges
			// (24) wins over the lower address.
			Bus: 0x20, NUMA: 0,
			Devices: []sysfixture.Device{
				B(bdf(0x20, 1, 0), B(bdf(0x21, 0, 0), B(bdf(0x22, 0, 0), sysfixture.IBNIC(bdf(0x23, 0, 0), "mlx5_2", 2)))),
				B(bdf(0x20, 2, 0), sysfixture.IBNIC(bdf(0x24, 0, 0), "mlx5_3", 3)),
				B(bdf(0x20, 3, 0), sysfixture.GPU(bdf(0x25, 0, 0))),
			},
		},
		{
			// GPU 31 alone on NUMA node 1: every NIC is SYS, the one with
			// the fewest bridges (24) wins.
			Bus: 0x30, NUMA: 1,
			Devices: []sysfixture.Device{B(bdf(0x30, 1, 0), sysfixture.GPU(bdf(0x31, 0, 0)))},
		},
	}}
	root := t.TempDir()
	if err := m.Render().Write(root); err != nil {
		t.Fatal(err)
	}
	l, err := Discover(context.Background(), Options{NodeRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Warnings) != 0 {
		t.Errorf("warnings: %q", l.Warnings)
	}
	want := []struct{ bus, hca, dist, rail string }{
		{"0000:13:00.0", "mlx5_9", DistancePIX, "rail0"},
		{"0000:25:00.0", "mlx5_3", DistancePHB, "rail1"},
		{"0000:31:00.0", "mlx5_3", DistanceSYS, "rail1"},
	}
	if len(l.GPUs) != len(want) {
		t.Fatalf("GPUs %+v", l.GPUs)
	}
	for i, w := range want {
		g := l.GPUs[i]
		if g.PCIBusID != w.bus || g.HCA != w.hca || g.Distance != w.dist || g.Rail != w.rail {
			t.Errorf("GPU %d: %+v, want %s -> %s %s %s", i, g, w.bus, w.hca, w.dist, w.rail)
		}
	}
	if l.Rails != 2 {
		t.Errorf("%d rails, want 2 (mlx5_0 and mlx5_2 are nearest to no GPU)", l.Rails)
	}
}

// TestGPUScanFilters checks which PCI functions the sysfs scan takes for
// GPUs: NVIDIA 3D controllers, not their virtual functions, NVIDIA display
// controllers, NVSwitches, NVIDIA bridges or the BMC's VGA.
func TestGPUScanFilters(t *testing.T) {
	bdf := sysfixture.BDF
	gpuWithVF := sysfixture.GPU(bdf(0x12, 0, 0))
	vf := sysfixture.GPU(bdf(0x12, 0, 4))
	vf.Driver = ""
	gpuWithVF.VFs = []sysfixture.Device{vf}
	nvidia := func(addr string, class uint32, below ...sysfixture.Device) sysfixture.Device {
		return sysfixture.Device{BDF: addr, Vendor: sysfixture.VendorNVIDIA, ID: 0x22a3, Class: class, Devices: below}
	}
	m := sysfixture.Machine{Roots: []sysfixture.Root{{
		Bus: 0x10, NUMA: 0,
		Devices: []sysfixture.Device{
			sysfixture.Bridge(bdf(0x10, 1, 0), sysfixture.Bridge(bdf(0x11, 0, 0), gpuWithVF)),
			sysfixture.Bridge(bdf(0x10, 2, 0), nvidia(bdf(0x13, 0, 0), sysfixture.ClassVGA)),
			sysfixture.Bridge(bdf(0x10, 3, 0), nvidia(bdf(0x14, 0, 0), sysfixture.ClassBridgeMisc)),
			nvidia(bdf(0x10, 4, 0), sysfixture.ClassPCIBridge, sysfixture.GPU(bdf(0x15, 0, 0))),
			sysfixture.Bridge(bdf(0x10, 5, 0), sysfixture.Device{BDF: bdf(0x16, 0, 0), Vendor: sysfixture.VendorASPEED, ID: 0x2000, Class: sysfixture.ClassVGA}),
			sysfixture.Bridge(bdf(0x10, 6, 0), sysfixture.Device{BDF: bdf(0x17, 0, 0), Vendor: sysfixture.VendorNVIDIA, ID: 0x2330, Class: 0x030201}),
		},
	}}}
	root := t.TempDir()
	if err := m.Render().Write(root); err != nil {
		t.Fatal(err)
	}
	l, err := Discover(context.Background(), Options{NodeRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range l.GPUs {
		got = append(got, g.PCIBusID)
	}
	want := []string{"0000:12:00.0", "0000:15:00.0", "0000:17:00.0"}
	if strings.Join(got, " ") != strings.Join(want, " ") || len(l.Warnings) != 1 {
		t.Errorf("GPUs %q, warnings %q; want %q and only the warning about no RDMA devices", got, l.Warnings, want)
	}
}
