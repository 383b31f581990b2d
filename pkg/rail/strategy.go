// SPDX-License-Identifier: Apache-2.0

package rail

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/pxn-project/pxn/pkg/contract"
)

// railSubnet names the rail of every HCA that is the nearest HCA of a GPU
// after its main port's subnet: for RoCE the IPv4 subnet of the first
// IPv4-mapped GID (10.1.0.0/24), for InfiniBand the GID subnet prefix, the
// upper 64 bits of the first GID (fe80:0000:0000:0000). HCAs near no GPU
// (storage NICs) get no rail, as under pci-order. InfiniBand HCAs that share
// one subnet prefix get no rail either: the prefix does not tell their rails
// apart (every subnet manager's default is fe80:0000:0000:0000), and the
// layout reports them in SharedSubnets.
func (s *sysfs) railSubnet(railMap map[string]string, gpus []gpuInfo, hcas []hcaInfo, prefixLen int) []SharedSubnet {
	facing := map[string]bool{}
	for _, g := range gpus {
		if g.HCA != "" {
			facing[g.HCA] = true
		}
	}
	members := map[string][]string{}
	linkLayer := map[string]string{}
	for _, h := range hcas {
		if !facing[h.Name] {
			continue
		}
		var port *Port
		for i := range h.Ports {
			if h.Ports[i].Num == h.Port {
				port = &h.Ports[i]
			}
		}
		if port == nil {
			s.warn(h.dir+"/ports", "%s has no rail: no port", h.Name)
			continue
		}
		gidDir := fmt.Sprintf("%s/ports/%d/gids", h.dir, port.Num)
		rail, err := subnetRail(*port, prefixLen)
		if err != nil {
			s.warn(gidDir, "%s has no rail: %v", h.Name, err)
			continue
		}
		members[rail] = append(members[rail], h.Name)
		linkLayer[rail] = port.LinkLayer
	}
	rails := make([]string, 0, len(members))
	for r := range members {
		rails = append(rails, r)
	}
	sort.Strings(rails)
	var shared []SharedSubnet
	for _, r := range rails {
		hs := members[r]
		if len(hs) > 1 && linkLayer[r] == linkInfiniBand {
			shared = append(shared, SharedSubnet{Subnet: r, LinkLayer: linkInfiniBand, HCAs: hs})
			s.log.Info("HCAs share one InfiniBand subnet prefix; they get no rail", "prefix", r, "hcas", hs)
			continue
		}
		for _, h := range hs {
			railMap[h] = r
		}
		if len(hs) > 1 {
			msg := fmt.Sprintf("rail %s has %d HCAs on this node (%s); PXN treats it as ambiguous", r, len(hs), strings.Join(hs, ", "))
			*s.warnings = append(*s.warnings, msg)
			s.log.Info("Several HCAs on one rail", "rail", r, "hcas", hs)
		}
	}
	return shared
}

const (
	linkInfiniBand = "InfiniBand"
	linkEthernet   = "Ethernet"
)

// subnetRail is the rail name of a port under the subnet strategy.
func subnetRail(p Port, prefixLen int) (string, error) {
	switch p.LinkLayer {
	case linkEthernet:
		for _, g := range p.GIDs {
			if ip, ok := v4Mapped(g); ok {
				mask := uint32(0xffffffff) << (32 - prefixLen)
				n := ip & mask
				return fmt.Sprintf("%d.%d.%d.%d/%d", n>>24, n>>16&0xff, n>>8&0xff, n&0xff, prefixLen), nil
			}
		}
		return "", errors.New("no IPv4-mapped GID (::ffff:a.b.c.d) in the GID table")
	case linkInfiniBand:
		if len(p.GIDs) == 0 {
			return "", errors.New("empty GID table")
		}
		return p.GIDs[0][:19], nil
	default:
		return "", fmt.Errorf("link layer %q has no subnet", p.LinkLayer)
	}
}

const v4MappedPrefix = "0000:0000:0000:0000:0000:ffff:"

// v4Mapped returns the IPv4 address of an IPv4-mapped GID in canonical form.
func v4Mapped(gid string) (uint32, bool) {
	rest, ok := strings.CutPrefix(gid, v4MappedPrefix)
	if !ok || len(rest) != 9 || rest[4] != ':' {
		return 0, false
	}
	hi, err1 := strconv.ParseUint(rest[:4], 16, 16)
	lo, err2 := strconv.ParseUint(rest[5:], 16, 16)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return uint32(hi)<<16 | uint32(lo), true
}

// ParseStaticTable parses a static rail table: one JSON object mapping HCA
// name to rail name, e.g. {"mlx5_0": "rail0", "mlx5_3": "rail1"}, in the
// rail map's format (contract.ParseRailMap), so every name passes the
// contract's rules. An empty table is refused.
func ParseStaticTable(data []byte) (map[string]string, error) {
	table, err := contract.ParseRailMap(string(data))
	if err != nil {
		return nil, err
	}
	if len(table) == 0 {
		return nil, errors.New("the table is empty")
	}
	return table, nil
}
