// SPDX-License-Identifier: Apache-2.0

package sysfixture

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Layout names, each a folder under testdata/sysfs.
const (
	HGX8GPU         = "hgx-8gpu"
	HGX8GPUPortDown = "hgx-8gpu-portdown"
	HGX8GPUSRIOV    = "hgx-8gpu-sriov"
	// HGX8GPUDefaultPrefix is hgx-8gpu on a fabric whose subnet managers all
	// keep the default subnet prefix fe80:0000:0000:0000.
	HGX8GPUDefaultPrefix = "hgx-8gpu-defaultprefix"
	PCIe8GPU4NIC         = "pcie-8gpu-4nic"
)

// All returns every layout and static rail table the generator writes.
func All() Generated {
	return Generated{
		Trees: map[string]Tree{
			HGX8GPU:              HGX(HGXOptions{}).Render(),
			HGX8GPUPortDown:      HGX(HGXOptions{DownNIC: "mlx5_3"}).Render(),
			HGX8GPUSRIOV:         HGX(HGXOptions{VFs: map[int]int{0: 2, 4: 2}}).Render(),
			HGX8GPUDefaultPrefix: HGX(HGXOptions{DefaultSubnetPrefix: true}).Render(),
			PCIe8GPU4NIC:         PCIe4NIC().Render(),
		},
		Static: map[string]string{
			HGX8GPU + ".json": staticTable(map[string]string{
				"mlx5_0": "rail-a", "mlx5_2": "rail-b", "mlx5_3": "rail-c", "mlx5_4": "rail-d",
				"mlx5_5": "rail-e", "mlx5_7": "rail-f", "mlx5_8": "rail-g", "mlx5_9": "rail-h",
			}),
			PCIe8GPU4NIC + ".json": staticTable(map[string]string{
				"mlx5_0": "east-0", "mlx5_1": "east-1", "mlx5_2": "west-0", "mlx5_3": "west-1",
			}),
		},
	}
}

func staticTable(m map[string]string) string {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		panic(err)
	}
	return string(b) + "\n"
}

// HGXOptions varies the 8-GPU layout.
type HGXOptions struct {
	DownNIC string      // compute NIC whose port is down (cable pulled, port disabled)
	VFs     map[int]int // GPU/NIC pair (0..7) -> number of SR-IOV VFs on its NIC
	// DefaultSubnetPrefix gives every InfiniBand port the default subnet
	// prefix instead of one prefix per rail.
	DefaultSubnetPrefix bool
}

const gen5 = "32.0 GT/s PCIe"

// HGX is an HGX H100-like node: two sockets, eight GPU/NIC pairs each behind
// its own PCIe switch on its own root complex (four per socket), a RoCE
// storage NIC per socket on a root complex of its own, four NVSwitches behind
// an NVIDIA PCIe switch, an NVMe drive behind two of the switches and the
// BMC's ASPEED VGA. RDMA devices are named in bus order, so the storage NICs
// are mlx5_1 and mlx5_6, between compute NICs; VFs are named after all PFs.
func HGX(o HGXOptions) Machine {
	pairBuses := []int{0x15, 0x37, 0x48, 0x59, 0x97, 0xb7, 0xc6, 0xd5}
	storageBuses := []int{0x26, 0xa8}
	var nicBuses []int
	for _, b := range pairBuses {
		nicBuses = append(nicBuses, b+4)
	}
	for _, b := range storageBuses {
		nicBuses = append(nicBuses, b+1)
	}
	slices.Sort(nicBuses)
	names := map[int]string{}
	next := 0
	for _, b := range nicBuses {
		names[b] = fmt.Sprintf("mlx5_%d", next)
		next++
	}
	vfName := func() string {
		n := fmt.Sprintf("mlx5_%d", next)
		next++
		return n
	}

	m := Machine{}
	m.Roots = append(m.Roots, bmcRoot())
	for i, b := range pairBuses {
		numa := 0
		if i >= 4 {
			numa = 1
		}
		nicBus := b + 4
		nic := IBNIC(bdf(nicBus, 0, 0), names[nicBus], i)
		if o.DefaultSubnetPrefix {
			nic.RDMA.Ports[0].GIDs = []string{ibGID(0, nic.RDMA.NodeGUID)}
		}
		if o.DownNIC == nic.RDMA.Name {
			p := &nic.RDMA.Ports[0]
			p.State, p.PhysState, p.Rate = "1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)"
			nic.Netdev.Operstate = "down"
		}
		for v := 0; v < o.VFs[i]; v++ {
			vf := Device{
				BDF: bdf(nicBus, 0, v+1), Vendor: VendorMellanox, ID: 0x101e, Class: ClassInfiniBand,
				Driver: "mlx5_core",
				RDMA:   ibDevice(vfName(), nicBus, i),
			}
			vf.RDMA.NodeGUID = fmt.Sprintf("a088:c203:00%02x:%04x", v+1, 0x1a00+nicBus)
			vf.RDMA.Ports[0].GIDs = []string{ibGID(i, vf.RDMA.NodeGUID)}
			nic.VFs = append(nic.VFs, vf)
		}
		dsps := []Device{
			switchDSP(bdf(b+2, 0, 0), GPU(bdf(b+3, 0, 0))),
			switchDSP(bdf(b+2, 1, 0), nic),
		}
		if i == 0 || i == 4 {
			dsps = append(dsps, switchDSP(bdf(b+2, 2, 0), Device{
				BDF: bdf(b+5, 0, 0), Vendor: 0x144d, ID: 0xa80a, Class: 0x010802,
				Driver: "nvme", LinkSpeed: "16.0 GT/s PCIe", LinkWidth: 4,
			}))
		}
		m.Roots = append(m.Roots, Root{
			Bus: b, NUMA: numa,
			Devices: []Device{rootPort(bdf(b, 1, 0), Device{
				BDF: bdf(b+1, 0, 0), Vendor: VendorBroadcom, ID: 0xc030, Class: ClassPCIBridge,
				Driver: "pcieport", LinkSpeed: gen5, LinkWidth: 16, Devices: dsps,
			})},
		})
	}
	for i, b := range storageBuses {
		numa := 0
		if i == 1 {
			numa = 1
		}
		nicBus := b + 1
		m.Roots = append(m.Roots, Root{
			Bus: b, NUMA: numa,
			Devices: []Device{rootPort(bdf(b, 1, 0), RoCENIC(bdf(nicBus, 0, 0), names[nicBus], fmt.Sprintf("10.200.%d.11", i)))},
		})
	}
	var nvswitches []Device
	for i := 0; i < 4; i++ {
		nvswitches = append(nvswitches, Device{
			BDF: bdf(0x8a, i, 0), Vendor: VendorNVIDIA, ID: 0x22a4, Class: ClassPCIBridge,
			Driver: "pcieport", LinkSpeed: "16.0 GT/s PCIe", LinkWidth: 2,
			Devices: []Device{{
				BDF: bdf(0x8b+i, 0, 0), Vendor: VendorNVIDIA, ID: 0x22a3, Class: ClassBridgeMisc,
				Driver: "nvidia", LinkSpeed: "16.0 GT/s PCIe", LinkWidth: 2,
			}},
		})
	}
	m.Roots = append(m.Roots, Root{
		Bus: 0x88, NUMA: 1,
		Devices: []Device{rootPort(bdf(0x88, 1, 0), Device{
			BDF: bdf(0x89, 0, 0), Vendor: VendorNVIDIA, ID: 0x22a4, Class: ClassPCIBridge,
			Driver: "pcieport", LinkSpeed: "16.0 GT/s PCIe", LinkWidth: 4, Devices: nvswitches,
		})},
	})
	return m
}

// PCIe4NIC is a two-socket PCIe server with eight GPUs and four RoCE NICs:
// each root complex has a switch whose one downstream port leads to a second
// switch with two GPUs and whose other downstream port holds the NIC, so two
// GPUs share each NIC across nested switches (PXB).
func PCIe4NIC() Machine {
	m := Machine{Roots: []Root{bmcRoot()}}
	for i, b := range []int{0x10, 0x30, 0x90, 0xb0} {
		numa := 0
		if i >= 2 {
			numa = 1
		}
		gpu := func(bus int) Device {
			return Device{
				BDF: bdf(bus, 0, 0), Vendor: VendorNVIDIA, ID: 0x2331, Class: Class3D,
				Driver: "nvidia", LinkSpeed: gen5, LinkWidth: 16,
			}
		}
		nicBus := b + 7
		l2 := Device{
			BDF: bdf(b+3, 0, 0), Vendor: VendorBroadcom, ID: 0xc010, Class: ClassPCIBridge,
			Driver: "pcieport", LinkSpeed: gen5, LinkWidth: 16,
			Devices: []Device{
				switchDSP(bdf(b+4, 0, 0), gpu(b+5)),
				switchDSP(bdf(b+4, 1, 0), gpu(b+6)),
			},
		}
		l1 := Device{
			BDF: bdf(b+1, 0, 0), Vendor: VendorBroadcom, ID: 0xc030, Class: ClassPCIBridge,
			Driver: "pcieport", LinkSpeed: gen5, LinkWidth: 16,
			Devices: []Device{
				switchDSP(bdf(b+2, 0, 0), l2),
				switchDSP(bdf(b+2, 1, 0), Device{
					BDF: bdf(nicBus, 0, 0), Vendor: VendorMellanox, ID: 0x1021, Class: ClassEthernet,
					Driver: "mlx5_core", LinkSpeed: gen5, LinkWidth: 16,
					RDMA:   roceDevice(fmt.Sprintf("mlx5_%d", i), nicBus, fmt.Sprintf("10.1.%d.21", i), "400 Gb/sec (4X NDR)"),
					Netdev: ethNetdev(nicBus),
				}),
			},
		}
		m.Roots = append(m.Roots, Root{
			Bus: b, NUMA: numa,
			Devices: []Device{rootPort(bdf(b, 1, 0), l1)},
		})
	}
	return m
}

// bmcRoot is root complex 0 with the host bridge and the BMC's VGA behind
// the ASPEED PCIe-to-PCI bridge.
func bmcRoot() Root {
	return Root{
		Bus: 0x00, NUMA: 0,
		Devices: []Device{
			{BDF: bdf(0, 0, 0), Vendor: VendorIntel, ID: 0x09a2, Class: 0x060000},
			{
				BDF: bdf(0, 0x1c, 0), Vendor: VendorIntel, ID: 0x1bbc, Class: ClassPCIBridge,
				Driver: "pcieport", LinkSpeed: "5.0 GT/s PCIe", LinkWidth: 1,
				Devices: []Device{{
					BDF: bdf(0x02, 0, 0), Vendor: VendorASPEED, ID: 0x1150, Class: ClassPCIBridge,
					Devices: []Device{{
						BDF: bdf(0x03, 0, 0), Vendor: VendorASPEED, ID: 0x2000, Class: ClassVGA,
						Driver: "ast",
					}},
				}},
			},
		},
	}
}

func rootPort(addr string, below Device) Device {
	return Device{
		BDF: addr, Vendor: VendorIntel, ID: 0x352a, Class: ClassPCIBridge,
		Driver: "pcieport", LinkSpeed: below.LinkSpeed, LinkWidth: below.LinkWidth,
		Devices: []Device{below},
	}
}

func switchDSP(addr string, below Device) Device {
	return Device{
		BDF: addr, Vendor: VendorBroadcom, ID: 0xc030, Class: ClassPCIBridge,
		Driver: "pcieport", LinkSpeed: below.LinkSpeed, LinkWidth: below.LinkWidth,
		Devices: []Device{below},
	}
}

func bdf(bus, dev, fn int) string { return fmt.Sprintf("0000:%02x:%02x.%x", bus, dev, fn) }

// BDF is the sysfs PCI address 0000:BUS:DEV.FN.
func BDF(bus, dev, fn int) string { return bdf(bus, dev, fn) }

// Bridge is a PCIe switch port with devices on its secondary bus; as the
// only device of a Root it stands for a root port.
func Bridge(addr string, below ...Device) Device {
	return Device{
		BDF: addr, Vendor: VendorBroadcom, ID: 0xc030, Class: ClassPCIBridge,
		Driver: "pcieport", LinkSpeed: gen5, LinkWidth: 16, Devices: below,
	}
}

// GPU is an H100 SXM function.
func GPU(addr string) Device {
	return Device{BDF: addr, Vendor: VendorNVIDIA, ID: 0x2330, Class: Class3D, Driver: "nvidia", LinkSpeed: gen5, LinkWidth: 16}
}

// IBNIC is a ConnectX-7 InfiniBand function carrying RDMA device name, its
// port ACTIVE on the fabric of the given rail.
func IBNIC(addr, name string, rail int) Device {
	var bus int
	if _, err := fmt.Sscanf(addr, "0000:%x:", &bus); err != nil {
		panic(fmt.Sprintf("sysfixture: PCI address %q: %v", addr, err))
	}
	return Device{
		BDF: addr, Vendor: VendorMellanox, ID: 0x1021, Class: ClassInfiniBand,
		Driver: "mlx5_core", LinkSpeed: gen5, LinkWidth: 16,
		RDMA: ibDevice(name, bus, rail), Netdev: ipoibNetdev(bus, rail),
	}
}

// ibDevice is a ConnectX-7 InfiniBand port on rail k. Each rail is its own
// fabric whose subnet manager sets subnet prefix fe80::k.
func ibDevice(name string, bus, rail int) *RDMA {
	guid := fmt.Sprintf("a088:c203:0030:%04x", 0x1a00+bus)
	return &RDMA{
		Name: name, HCAType: "MT4129", FWVer: "28.39.1002", BoardID: "MT_0000000838", NodeGUID: guid,
		Ports: []Port{{
			State: "4: ACTIVE", PhysState: "5: LinkUp", LinkLayer: "InfiniBand",
			Rate: "400 Gb/sec (4X NDR)", LID: fmt.Sprintf("0x%x", 0x20+bus),
			GIDs: []string{ibGID(rail, guid)}, GIDTableLen: 8,
		}},
	}
}

func ibGID(rail int, guid string) string {
	return fmt.Sprintf("fe80:0000:0000:%04x:%s", rail, guid)
}

// RoCENIC is a ConnectX-7 Ethernet function carrying RDMA device name with
// an IPv4 address, its port ACTIVE at 200 Gb/s.
func RoCENIC(addr, name, ipv4 string) Device {
	var bus int
	if _, err := fmt.Sscanf(addr, "0000:%x:", &bus); err != nil {
		panic(fmt.Sprintf("sysfixture: PCI address %q: %v", addr, err))
	}
	return Device{
		BDF: addr, Vendor: VendorMellanox, ID: 0x1021, Class: ClassEthernet,
		Driver: "mlx5_core", LinkSpeed: gen5, LinkWidth: 16,
		RDMA: roceDevice(name, bus, ipv4, "200 Gb/sec (4X HDR)"), Netdev: ethNetdev(bus),
	}
}

// roceDevice is a ConnectX-7 Ethernet port with an IPv4 address: link-local
// and IPv4-mapped GIDs, each as RoCE v1 and v2.
func roceDevice(name string, bus int, ipv4, rate string) *RDMA {
	mac := macOf(bus)
	ll := linkLocalGID(mac)
	v4 := v4MappedGID(ipv4)
	return &RDMA{
		Name: name, HCAType: "MT4129", FWVer: "28.39.1002", BoardID: "MT_0000000834",
		NodeGUID: fmt.Sprintf("946d:ae03:00%02x:%02x00", bus, bus),
		Ports: []Port{{
			State: "4: ACTIVE", PhysState: "5: LinkUp", LinkLayer: "Ethernet",
			Rate: rate, LID: "0x0",
			GIDs:        []string{ll, ll, v4, v4},
			GIDTypes:    []string{"IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"},
			GIDTableLen: 16,
			Netdev:      ethName(bus),
		}},
	}
}

func macOf(bus int) [6]byte { return [6]byte{0x94, 0x6d, 0xae, byte(bus), 0x00, 0x01} }

func ethName(bus int) string { return fmt.Sprintf("enp%ds0np0", bus) }

func ethNetdev(bus int) *Netdev {
	mac := macOf(bus)
	return &Netdev{
		Name:      ethName(bus),
		MAC:       fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]),
		Operstate: "up", MTU: 9000, Type: 1,
	}
}

func ipoibNetdev(bus, rail int) *Netdev {
	gid := strings.ReplaceAll(ibGID(rail, fmt.Sprintf("a088:c203:0030:%04x", 0x1a00+bus)), ":", "")
	hw := []string{"00", "00", "10", "49"}
	for i := 0; i < len(gid); i += 2 {
		hw = append(hw, gid[i:i+2])
	}
	return &Netdev{
		Name: fmt.Sprintf("ibp%ds0", bus), MAC: strings.Join(hw, ":"),
		Operstate: "up", MTU: 4092, Type: 32,
	}
}

func linkLocalGID(mac [6]byte) string {
	return fmt.Sprintf("fe80:0000:0000:0000:%02x%02x:%02xff:fe%02x:%02x%02x",
		mac[0]^0x02, mac[1], mac[2], mac[3], mac[4], mac[5])
}

func v4MappedGID(ipv4 string) string {
	var a, b, c, d int
	if _, err := fmt.Sscanf(ipv4, "%d.%d.%d.%d", &a, &b, &c, &d); err != nil {
		panic(err)
	}
	return fmt.Sprintf("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", a, b, c, d)
}
