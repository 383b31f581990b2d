package rail

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// railSubnet names the rail of every HCA that is the nearest HCA of a GPU
// after its main port's subnet: for RoCE the IPv4 subnet of the first
// IPv4-mapped GID (10.1.0.0/24), for InfiniBand the GID subnet prefix, the
// upper 64 bits of the first GID (fe80:0000:0000:0000). HCAs near no GPU
// (storage NICs) get no rail, as under pci-order.
func (s *sysfs) railSubnet(railMap map[string]string, gpus []gpuInfo, hcas []hcaInfo, prefixLen int) {
	facing := map[string]bool{}
	for _, g := range gpus {
		if g.HCA != "" {
			facing[g.HCA] = true
		}
	}
	members := map[string][]string{}
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
		railMap[h.Name] = rail
		members[rail] = append(members[rail], h.Name)
	}
	rails := make([]string, 0, len(members))
	for r := range members {
		rails = append(rails, r)
	}
	sort.Strings(rails)
	for _, r := range rails {
		if hs := members[r]; len(hs) > 1 {
			msg := fmt.Sprintf("rail %s has %d HCAs on this node (%s); PXN treats it as ambiguous", r, len(hs), strings.Join(hs, ", "))
			*s.warnings = append(*s.warnings, msg)
			s.log.Info("Several HCAs on one rail", "rail", r, "hcas", hs)
		}
	}
}

// subnetRail is the rail name of a port under the subnet strategy.
func subnetRail(p Port, prefixLen int) (string, error) {
	switch p.LinkLayer {
	case "Ethernet":
		for _, g := range p.GIDs {
			if ip, ok := v4Mapped(g); ok {
				mask := uint32(0xffffffff) << (32 - prefixLen)
				n := ip & mask
				return fmt.Sprintf("%d.%d.%d.%d/%d", n>>24, n>>16&0xff, n>>8&0xff, n&0xff, prefixLen), nil
			}
		}
		return "", errors.New("no IPv4-mapped GID (::ffff:a.b.c.d) in the GID table")
	case "InfiniBand":
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
// name to rail name, e.g. {"mlx5_0": "rail0", "mlx5_3": "rail1"}. Names are
// checked (HCA names: letters, digits, '_', '.', '-', at most 64; rail
// names: letters, digits, '.', '_', ':', '/', '-', at most 63), duplicate
// HCA names and empty tables are refused.
func ParseStaticTable(data []byte) (map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, errors.New("want a JSON object of HCA name to rail name")
	}
	table := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("bad JSON: %w", err)
		}
		hca, _ := tok.(string)
		var rail string
		if err := dec.Decode(&rail); err != nil {
			return nil, fmt.Errorf("HCA %q: rail must be a string: %w", hca, err)
		}
		if !nameOK(hca, 64, "_.-") {
			return nil, fmt.Errorf("HCA name %q: want 1 to 64 letters, digits, '_', '.' or '-'", hca)
		}
		if !nameOK(rail, 63, "._:/-") {
			return nil, fmt.Errorf("HCA %q: rail name %q: want 1 to 63 letters, digits, '.', '_', ':', '/' or '-'", hca, rail)
		}
		if _, dup := table[hca]; dup {
			return nil, fmt.Errorf("HCA %q is listed twice", hca)
		}
		table[hca] = rail
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("bad JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON object")
	}
	if len(table) == 0 {
		return nil, errors.New("the table is empty")
	}
	return table, nil
}

func nameOK(s string, max int, punct string) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || strings.IndexByte(punct, c) >= 0 {
			continue
		}
		return false
	}
	return true
}
