// SPDX-License-Identifier: Apache-2.0

package rail

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// hcaInfo is an HCA with where it sits.
type hcaInfo struct {
	HCA
	dir  string   // resolved infiniband/NAME folder
	path []string // PCI path, see pciPath
}

const classInfiniBand = "sys/class/infiniband"

// hcas lists the RDMA physical functions under sys/class/infiniband, in PCI
// bus order. SR-IOV virtual functions are left out; devices that cannot be
// placed on PCI are skipped with a warning.
func (s *sysfs) hcas(ctx context.Context) ([]hcaInfo, error) {
	names, err := s.readDirNames(classInfiniBand)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			s.warn(classInfiniBand, "missing: no RDMA devices")
		} else {
			s.warn(classInfiniBand, "unreadable: %s", errText(err))
		}
		return nil, nil
	}
	var out []hcaInfo
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if h, ok := s.hca(name); ok {
			out = append(out, h)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PCIBusID != out[j].PCIBusID {
			return busLess(out[i].PCIBusID, out[j].PCIBusID)
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

func (s *sysfs) hca(name string) (hcaInfo, bool) {
	classPath := classInfiniBand + "/" + name
	dir, err := s.resolve(classPath)
	if err != nil {
		s.warn(classPath, "skipped: %v", err)
		return hcaInfo{}, false
	}
	pci, err := s.resolve(dir + "/device")
	if err != nil {
		s.warn(dir+"/device", "skipped %s: %v", name, err)
		return hcaInfo{}, false
	}
	comps, err := pciPath(pci)
	if err != nil {
		s.warn(dir+"/device", "skipped %s: %v", name, err)
		return hcaInfo{}, false
	}
	if s.isVF(pci) {
		s.log.V(2).Info("Skipping SR-IOV virtual function", "hca", name, "path", s.host(pci))
		return hcaInfo{}, false
	}
	h := hcaInfo{
		HCA:  HCA{Name: name, PCIBusID: path.Base(pci), PCIeRoot: comps[0], NUMANode: s.numaNode(pci), State: StateUnknown},
		dir:  dir,
		path: comps,
	}
	netdevs := s.functionNetdevs(pci)
	h.Ports = s.ports(dir, netdevs)
	if len(h.Ports) == 0 {
		return h, true
	}
	main := h.Ports[0]
	for _, p := range h.Ports {
		if p.Num == 1 {
			main = p
		}
	}
	h.Port, h.LinkLayer, h.State, h.PhysState, h.Rate, h.Netdev = main.Num, main.LinkLayer, main.State, main.PhysState, main.Rate, main.Netdev
	return h, true
}

// netdev is a network interface of a PCI function.
type netdev struct {
	name    string
	devPort int // -1 when unknown
}

// functionNetdevs lists the interfaces under a PCI function's net/ folder.
func (s *sysfs) functionNetdevs(pci string) []netdev {
	names, err := s.readDirNames(pci + "/net")
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.warn(pci+"/net", "unreadable: %s", errText(err))
		}
		return nil
	}
	out := make([]netdev, 0, len(names))
	for _, n := range names {
		nd := netdev{name: n, devPort: -1}
		if v, err := s.read(pci + "/net/" + n + "/dev_port"); err == nil {
			if p, err := strconv.Atoi(v); err == nil && p >= 0 {
				nd.devPort = p
			}
		}
		out = append(out, nd)
	}
	return out
}

// ports reads ports/N of an RDMA device in port order.
func (s *sysfs) ports(dir string, netdevs []netdev) []Port {
	portsDir := dir + "/ports"
	names, err := s.readDirNames(portsDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			s.warn(portsDir, "missing: the device shows no port")
		} else {
			s.warn(portsDir, "unreadable: %s", errText(err))
		}
		return nil
	}
	var nums []int
	for _, n := range names {
		num, err := strconv.Atoi(n)
		if err != nil || num < 1 || num > 255 {
			s.warn(portsDir+"/"+n, "not a port number")
			continue
		}
		nums = append(nums, num)
	}
	sort.Ints(nums)
	out := make([]Port, 0, len(nums))
	for _, num := range nums {
		out = append(out, s.port(portsDir+"/"+strconv.Itoa(num), num, netdevs))
	}
	return out
}

func (s *sysfs) port(dir string, num int, netdevs []netdev) Port {
	p := Port{Num: num, State: StateUnknown}
	if v, ok := s.attr(dir + "/state"); ok {
		if w, ok := portAttrWord(v); ok {
			p.State = w
		} else {
			s.warn(dir+"/state", "%q is not \"N: STATE\"; port marked %s", v, StateUnknown)
		}
	}
	if v, ok := s.attr(dir + "/phys_state"); ok {
		if w, ok := portAttrWord(v); ok {
			p.PhysState = w
		} else {
			s.warn(dir+"/phys_state", "%q is not \"N: STATE\"", v)
		}
	}
	if v, ok := s.attr(dir + "/link_layer"); ok {
		if v == linkInfiniBand || v == linkEthernet {
			p.LinkLayer = v
		} else {
			s.warn(dir+"/link_layer", "%q is neither InfiniBand nor Ethernet", v)
		}
	}
	if v, ok := s.attr(dir + "/rate"); ok {
		if rateOK(v) {
			p.Rate = v
		} else {
			s.warn(dir+"/rate", "%q is not \"N Gb/sec (...)\"", v)
		}
	}
	p.GIDs = s.gids(dir + "/gids")
	if v, err := s.read(dir + "/gid_attrs/ndevs/0"); err == nil && v != "" {
		p.Netdev = v
	} else {
		p.Netdev = pickNetdev(netdevs, num)
	}
	return p
}

// pickNetdev is the interface of port num among a function's interfaces: the
// one whose dev_port is num-1, else the only or first one.
func pickNetdev(netdevs []netdev, num int) string {
	for _, n := range netdevs {
		if n.devPort == num-1 {
			return n.name
		}
	}
	if len(netdevs) > 0 {
		return netdevs[0].name
	}
	return ""
}

// gids reads a port's GID table in index order, keeping non-zero entries.
// Entries the kernel refuses with EINVAL are unused RoCE entries.
func (s *sysfs) gids(dir string) []string {
	names, err := s.readDirNames(dir)
	if err != nil {
		s.warn(dir, "unreadable GID table: %s", errText(err))
		return nil
	}
	idx := make([]int, 0, len(names))
	for _, n := range names {
		i, err := strconv.Atoi(n)
		if err != nil || i < 0 {
			s.warn(dir+"/"+n, "not a GID index")
			continue
		}
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var out []string
	for _, i := range idx {
		p := dir + "/" + strconv.Itoa(i)
		v, err := s.read(p)
		if err != nil {
			if !errors.Is(err, syscall.EINVAL) {
				s.warn(p, "unreadable: %s", errText(err))
			}
			continue
		}
		g, ok := canonicalGID(v)
		if !ok {
			s.warn(p, "%q is not a GID", v)
			continue
		}
		if g != zeroGID {
			out = append(out, g)
		}
	}
	return out
}

const zeroGID = "0000:0000:0000:0000:0000:0000:0000:0000"

// canonicalGID checks the sysfs GID form, eight groups of four hex digits,
// and lowercases it.
func canonicalGID(v string) (string, bool) {
	if len(v) != len(zeroGID) {
		return "", false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if i%5 == 4 {
			if c != ':' {
				return "", false
			}
			continue
		}
		if !isHex(c) {
			return "", false
		}
	}
	return strings.ToLower(v), true
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// portAttrWord returns WORD of a port attribute "N: WORD" ("4: ACTIVE",
// "5: LinkUp").
func portAttrWord(v string) (string, bool) {
	num, word, ok := strings.Cut(v, ": ")
	if !ok || num == "" || word == "" {
		return "", false
	}
	if n, err := strconv.Atoi(num); err != nil || n < 0 || n > 255 {
		return "", false
	}
	for i := 0; i < len(word); i++ {
		c := word[i]
		if !(c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
			return "", false
		}
	}
	return word, true
}

// rateOK checks the form of a port's rate: "400 Gb/sec (4X NDR)",
// "2.5 Gb/sec (1X SDR)".
func rateOK(v string) bool {
	num, rest, ok := strings.Cut(v, " Gb/sec")
	if !ok || num == "" {
		return false
	}
	if f, err := strconv.ParseFloat(num, 64); err != nil || !(f > 0 && f < 1e6) {
		return false
	}
	return rest == "" || (strings.HasPrefix(rest, " (") && strings.HasSuffix(rest, ")"))
}
