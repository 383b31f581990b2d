// SPDX-License-Identifier: Apache-2.0

// Package sysfixture describes machines (PCIe hierarchy, GPUs, RDMA devices,
// network interfaces) and renders them as the sysfs tree Linux shows for
// them, so that pkg/rail's tests run against realistic layouts. Every symlink
// it writes is relative, so a rendered tree can be moved anywhere.
package sysfixture

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// PCI vendor IDs and class codes used by the layouts.
const (
	VendorNVIDIA   = 0x10de
	VendorMellanox = 0x15b3
	VendorIntel    = 0x8086
	VendorBroadcom = 0x1000
	VendorASPEED   = 0x1a03

	ClassVGA        = 0x030000
	Class3D         = 0x030200
	ClassEthernet   = 0x020000
	ClassInfiniBand = 0x020700
	ClassPCIBridge  = 0x060400
	ClassBridgeMisc = 0x068000
)

// Machine is a host: its PCI root complexes and everything below them.
type Machine struct {
	Roots []Root
}

// Root is a PCI host bridge, rendered as /sys/devices/pciDDDD:BB.
type Root struct {
	Domain  int
	Bus     int
	NUMA    int
	Devices []Device
}

// Device is one PCI function.
type Device struct {
	BDF       string // 0000:18:00.0
	Vendor    uint16
	ID        uint16
	Class     uint32
	Driver    string
	LinkSpeed string // current_link_speed, e.g. "32.0 GT/s PCIe"
	LinkWidth int
	Devices   []Device // on the secondary bus of a bridge
	RDMA      *RDMA
	Netdev    *Netdev
	VFs       []Device // SR-IOV virtual functions, siblings of this one
}

// RDMA is the ib_core device a function carries (infiniband/NAME).
type RDMA struct {
	Name     string
	HCAType  string
	FWVer    string
	BoardID  string
	NodeGUID string // four groups: a088:c203:0030:1a2c
	Ports    []Port // port N is Ports[N-1]
}

// Port is one port of an RDMA device.
type Port struct {
	State       string   // "4: ACTIVE"
	PhysState   string   // "5: LinkUp"
	LinkLayer   string   // InfiniBand or Ethernet
	Rate        string   // "400 Gb/sec (4X NDR)"
	LID         string   // "0x1a"
	GIDs        []string // entries from index 0; the rest of the table is zero
	GIDTypes    []string // per entry of GIDs, RoCE only ("IB/RoCE v1", "RoCE v2")
	GIDTableLen int
	Netdev      string // RoCE: gid_attrs/ndevs of every non-zero entry
}

// Netdev is a network interface of a function (device/net/NAME).
type Netdev struct {
	Name      string
	MAC       string
	DevPort   int
	Operstate string
	MTU       int
	Type      int // ARPHRD: 1 Ethernet, 32 InfiniBand
}

// Entry is one node of a rendered tree: a regular file or a symlink.
type Entry struct {
	Link bool
	Data string // file contents, or the link's target
}

// Tree is a rendered sysfs tree, keyed by slash-separated paths relative to
// the host root. Directories are implied by the paths; none is empty, so the
// tree survives a round trip through git unchanged.
type Tree map[string]Entry

// Render returns the sysfs tree of m.
func (m Machine) Render() Tree {
	t := Tree{}
	for _, r := range m.Roots {
		rootDir := fmt.Sprintf("sys/devices/pci%04x:%02x", r.Domain, r.Bus)
		t.file(rootDir+"/uevent", "")
		for _, d := range r.Devices {
			t.device(rootDir, r, d)
		}
	}
	return t
}

func (t Tree) file(p, data string) { t[p] = Entry{Data: data} }

// link records a symlink at p pointing at target (both relative to the host
// root), spelled the way kernfs spells it: up from the link's folder to the
// nearest proper ancestor of the target, then down (a device link of
// .../0000:19:00.0/infiniband/mlx5_0 reads ../../../0000:19:00.0).
func (t Tree) link(p, target string) {
	base, ups := path.Dir(p), 0
	for !strings.HasPrefix(target, base+"/") {
		if base == "." {
			base = ""
			break
		}
		base, ups = path.Dir(base), ups+1
	}
	rel := strings.Repeat("../", ups) + strings.TrimPrefix(target, base+"/")
	t[p] = Entry{Link: true, Data: rel}
}

func (t Tree) device(parent string, r Root, d Device) {
	dir := parent + "/" + d.BDF
	t.function(dir, r, d)
	for i, vf := range d.VFs {
		vfDir := parent + "/" + vf.BDF
		t.function(vfDir, r, vf)
		t.link(vfDir+"/physfn", dir)
		t.link(fmt.Sprintf("%s/virtfn%d", dir, i), vfDir)
	}
	if len(d.VFs) > 0 {
		t.file(dir+"/sriov_numvfs", fmt.Sprintf("%d\n", len(d.VFs)))
		t.file(dir+"/sriov_totalvfs", "16\n")
	}
	for _, c := range d.Devices {
		t.device(dir, r, c)
	}
}

func (t Tree) function(dir string, r Root, d Device) {
	t.file(dir+"/vendor", fmt.Sprintf("0x%04x\n", d.Vendor))
	t.file(dir+"/device", fmt.Sprintf("0x%04x\n", d.ID))
	t.file(dir+"/class", fmt.Sprintf("0x%06x\n", d.Class))
	t.file(dir+"/numa_node", fmt.Sprintf("%d\n", r.NUMA))
	if d.LinkSpeed != "" {
		t.file(dir+"/current_link_speed", d.LinkSpeed+"\n")
		t.file(dir+"/current_link_width", fmt.Sprintf("%d\n", d.LinkWidth))
	}
	t.link("sys/bus/pci/devices/"+d.BDF, dir)
	if d.Driver != "" {
		drv := "sys/bus/pci/drivers/" + d.Driver
		t.file(drv+"/bind", "")
		t.link(drv+"/"+d.BDF, dir)
		t.link(dir+"/driver", drv)
	}
	if n := d.Netdev; n != nil {
		nd := dir + "/net/" + n.Name
		t.file(nd+"/address", n.MAC+"\n")
		t.file(nd+"/dev_port", fmt.Sprintf("%d\n", n.DevPort))
		t.file(nd+"/operstate", n.Operstate+"\n")
		t.file(nd+"/mtu", fmt.Sprintf("%d\n", n.MTU))
		t.file(nd+"/type", fmt.Sprintf("%d\n", n.Type))
		t.link(nd+"/device", dir)
		t.link("sys/class/net/"+n.Name, nd)
	}
	if rd := d.RDMA; rd != nil {
		t.rdma(dir, rd)
	}
}

func (t Tree) rdma(fnDir string, rd *RDMA) {
	dir := fnDir + "/infiniband/" + rd.Name
	t.file(dir+"/node_type", "1: CA\n")
	t.file(dir+"/node_guid", rd.NodeGUID+"\n")
	t.file(dir+"/sys_image_guid", rd.NodeGUID+"\n")
	t.file(dir+"/fw_ver", rd.FWVer+"\n")
	t.file(dir+"/hca_type", rd.HCAType+"\n")
	t.file(dir+"/board_id", rd.BoardID+"\n")
	t.link(dir+"/device", fnDir)
	t.link("sys/class/infiniband/"+rd.Name, dir)
	for i, p := range rd.Ports {
		pd := fmt.Sprintf("%s/ports/%d", dir, i+1)
		t.file(pd+"/state", p.State+"\n")
		t.file(pd+"/phys_state", p.PhysState+"\n")
		t.file(pd+"/link_layer", p.LinkLayer+"\n")
		t.file(pd+"/rate", p.Rate+"\n")
		t.file(pd+"/lid", p.LID+"\n")
		for g := 0; g < p.GIDTableLen; g++ {
			gid := ZeroGID
			if g < len(p.GIDs) {
				gid = p.GIDs[g]
			}
			t.file(fmt.Sprintf("%s/gids/%d", pd, g), gid+"\n")
			if g < len(p.GIDTypes) && gid != ZeroGID {
				t.file(fmt.Sprintf("%s/gid_attrs/types/%d", pd, g), p.GIDTypes[g]+"\n")
				t.file(fmt.Sprintf("%s/gid_attrs/ndevs/%d", pd, g), p.Netdev+"\n")
			}
		}
	}
}

// ZeroGID is an unused GID table entry.
const ZeroGID = "0000:0000:0000:0000:0000:0000:0000:0000"

// Write writes t under dir, which must not exist yet or be empty.
func (t Tree) Write(dir string) error {
	paths := make([]string, 0, len(t))
	for p := range t {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		e := t[p]
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if e.Link {
			if err := os.Symlink(e.Data, full); err != nil {
				return err
			}
			continue
		}
		if err := os.WriteFile(full, []byte(e.Data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ReadTree reads the files and symlinks under dir (directories are implied).
func ReadTree(dir string) (Tree, error) {
	t := Tree{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			t[rel] = Entry{Link: true, Data: target}
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			t[rel] = Entry{Data: string(b)}
		case d.IsDir():
		default:
			return fmt.Errorf("%s: neither file, symlink nor directory", p)
		}
		return nil
	})
	return t, err
}

// Diff lists the differences between want and got, at most max of them.
func Diff(want, got Tree, max int) []string {
	var diffs []string
	keys := make(map[string]bool, len(want)+len(got))
	for k := range want {
		keys[k] = true
	}
	for k := range got {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		w, inW := want[k]
		g, inG := got[k]
		switch {
		case !inG:
			diffs = append(diffs, k+": missing")
		case !inW:
			diffs = append(diffs, k+": unexpected")
		case w.Link != g.Link:
			diffs = append(diffs, fmt.Sprintf("%s: link %v, want link %v", k, g.Link, w.Link))
		case w.Data != g.Data:
			diffs = append(diffs, fmt.Sprintf("%s: %q, want %q", k, g.Data, w.Data))
		}
		if len(diffs) >= max {
			break
		}
	}
	return diffs
}

// Generated is the set of fixtures the generator owns under testdata: one
// sysfs tree per layout under sysfs/NAME and the static rail tables under
// static/.
type Generated struct {
	Trees  map[string]Tree   // layout name -> tree
	Static map[string]string // file name under static/ -> contents
}

// SysfsModFile makes testdata/sysfs a module of its own. Sysfs names contain
// ':', which Go module zips refuse; files inside a nested module are left out
// of the zip, so the pxn module stays fetchable through a module proxy.
const SysfsModFile = "// Sysfs fixture trees of pkg/rail, kept out of the pxn module zip.\nmodule pxn.invalid/rail/testdata/sysfs\n"

// WriteAll replaces dir/sysfs and dir/static with g.
func (g Generated) WriteAll(dir string) error {
	for _, sub := range []string{"sysfs", "static"} {
		if err := os.RemoveAll(filepath.Join(dir, sub)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "sysfs"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "sysfs", "go.mod"), []byte(SysfsModFile), 0o644); err != nil {
		return err
	}
	for name, t := range g.Trees {
		if err := t.Write(filepath.Join(dir, "sysfs", name)); err != nil {
			return fmt.Errorf("layout %s: %w", name, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "static"), 0o755); err != nil {
		return err
	}
	for name, data := range g.Static {
		if err := os.WriteFile(filepath.Join(dir, "static", name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Combined returns g as one tree keyed like the files under dir after
// WriteAll, for comparing with ReadTree(dir) limited to sysfs/ and static/.
func (g Generated) Combined() Tree {
	all := Tree{"sysfs/go.mod": {Data: SysfsModFile}}
	for name, t := range g.Trees {
		for p, e := range t {
			all["sysfs/"+name+"/"+p] = e
		}
	}
	for name, data := range g.Static {
		all["static/"+name] = Entry{Data: data}
	}
	return all
}

// ReadGenerated reads dir/sysfs and dir/static into one tree keyed like
// Combined.
func ReadGenerated(dir string) (Tree, error) {
	all := Tree{}
	for _, sub := range []string{"sysfs", "static"} {
		t, err := ReadTree(filepath.Join(dir, sub))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		for p, e := range t {
			all[sub+"/"+p] = e
		}
	}
	return all, nil
}
