// SPDX-License-Identifier: Apache-2.0

// Package rail discovers a node's GPUs and RDMA NICs (HCAs), how far apart
// they sit on PCIe, and which rail each HCA is on.
//
// Everything is read from sysfs under an injectable host root, so every
// machine layout is a test fixture (see testdata/sysfs, written by
// internal/genfixtures). GPUs come from NVML when the library loads and its
// GPUs are in the sysfs tree, otherwise from a scan of the PCI bus. docs/rails.md
// explains the sources, the distance classes and the rail strategies.
package rail

//go:generate go run ./internal/genfixtures -out testdata

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/contract"
)

// Rail strategies.
const (
	StrategyPCIOrder = "pci-order"
	StrategySubnet   = "subnet"
	StrategyStatic   = "static"
)

// DefaultSubnetPrefixLen is the IPv4 prefix length of the subnet strategy
// when Options leaves it zero.
const DefaultSubnetPrefixLen = 24

// GPU sources reported in Layout.GPUSource.
const (
	GPUSourceNVML  = "nvml"
	GPUSourceSysfs = "sysfs"
)

// Options says where and how to discover.
type Options struct {
	// NodeRoot is the folder the node's root filesystem is visible at (the
	// daemons' --host-root); "/" when empty.
	NodeRoot string
	// FS, when set, is read instead of NodeRoot (which then only names paths
	// in warnings). It must implement fs.ReadLinkFS for sysfs links.
	FS fs.FS
	// Strategy is StrategyPCIOrder (when empty), StrategySubnet or
	// StrategyStatic.
	Strategy string
	// SubnetPrefixLen is the IPv4 prefix length of the subnet strategy
	// (1..32); DefaultSubnetPrefixLen when zero.
	SubnetPrefixLen int
	// StaticFile is the static strategy's table: a JSON object mapping HCA
	// name to rail name.
	StaticFile string
	// GPUs, when set, lists the GPUs instead of NVML. When nil, NVML is
	// used unless FS is set, whatever the host root: the driver library is
	// found through the dynamic loader, not under the host root.
	GPUs GPULister
	// Logger receives one line per warning, with the offending path. The
	// zero Logger discards.
	Logger klog.Logger
}

// Layout is a node's discovered GPUs, HCAs and rails.
type Layout struct {
	GPUs      []GPU             `json:"gpus"`
	HCAs      []HCA             `json:"hcas"`
	RailMap   map[string]string `json:"railMap"` // HCA name -> rail, railed HCAs only
	Rails     int               `json:"rails"`   // number of distinct rails
	Strategy  string            `json:"strategy"`
	GPUSource string            `json:"gpuSource,omitempty"` // nvml or sysfs
	Pairs     []Pair            `json:"pairs,omitempty"`     // every GPU/HCA pair with a known distance
	// SharedSubnets lists the subnets the subnet strategy refused to make
	// rails of; the layout is not ready while there is one.
	SharedSubnets []SharedSubnet `json:"sharedSubnets,omitempty"`
	Warnings      []string       `json:"-"`
}

// SharedSubnet is an InfiniBand subnet prefix that several GPU-facing HCAs of
// the node carry. The subnet strategy names rails after subnets, so it cannot
// tell those HCAs' rails apart, and gives them none.
type SharedSubnet struct {
	Subnet    string   `json:"subnet"`
	LinkLayer string   `json:"linkLayer"`
	HCAs      []string `json:"hcas"`
}

func (s SharedSubnet) String() string {
	return fmt.Sprintf("HCAs %s share %s subnet prefix %s", strings.Join(s.HCAs, ", "), s.LinkLayer, s.Subnet)
}

// GPU is one GPU, in PCI bus order within Layout.GPUs.
type GPU struct {
	Index    int    `json:"index"` // NVML index, or position in bus order when scanned from sysfs
	UUID     string `json:"uuid,omitempty"`
	Name     string `json:"name,omitempty"`     // product name from NVML
	PCIBusID string `json:"pciBusID"`           // sysfs form, 0000:18:00.0
	PCIeRoot string `json:"pcieRoot,omitempty"` // host bridge above it, pci0000:15; empty when its PCI function was not found
	NUMANode int    `json:"numaNode"`
	HCA      string `json:"hca,omitempty"`      // nearest HCA
	Distance string `json:"distance,omitempty"` // to HCA: PIX|PXB|PHB|NODE|SYS
	Rail     string `json:"rail,omitempty"`     // HCA's rail
}

// HCA is one RDMA physical function, in PCI bus order within Layout.HCAs.
// LinkLayer, State, PhysState, Rate and Netdev describe the HCA's main port:
// port 1, or its lowest-numbered port when it has no port 1 (Port says
// which). Every port is in Ports.
type HCA struct {
	Name      string `json:"name"`
	PCIBusID  string `json:"pciBusID"`
	PCIeRoot  string `json:"pcieRoot"` // host bridge above it, pci0000:15
	NUMANode  int    `json:"numaNode"`
	LinkLayer string `json:"linkLayer"`
	State     string `json:"state"`     // word after the number: ACTIVE, DOWN, ... ; UNKNOWN when unreadable
	PhysState string `json:"physState"` // e.g. LinkUp, Disabled
	Rate      string `json:"rate"`
	Netdev    string `json:"netdev,omitempty"`
	Rail      string `json:"rail,omitempty"`
	Port      int    `json:"port"` // the main port; 0 when the HCA shows none
	Ports     []Port `json:"ports,omitempty"`
}

// Port is one port of an HCA.
type Port struct {
	Num       int      `json:"num"`
	LinkLayer string   `json:"linkLayer"`
	State     string   `json:"state"`
	PhysState string   `json:"physState"`
	Rate      string   `json:"rate"`
	GIDs      []string `json:"gids,omitempty"` // non-zero entries in table order
	Netdev    string   `json:"netdev,omitempty"`
}

// Pair is the PCIe distance class between a GPU and an HCA.
type Pair struct {
	GPU      int    `json:"gpu"` // GPU.Index
	HCA      string `json:"hca"`
	Distance string `json:"distance"`
}

// StateActive is the port state of a usable port.
const StateActive = "ACTIVE"

// StateUnknown marks a port whose state could not be read.
const StateUnknown = "UNKNOWN"

// Discover reads the node's layout. Odd sysfs entries do not fail it: they
// are skipped or marked, and each one adds a warning naming its path. It
// fails on bad options, an unreadable static table or host root, or ctx.
func Discover(ctx context.Context, opts Options) (*Layout, error) {
	strategy := opts.Strategy
	if strategy == "" {
		strategy = StrategyPCIOrder
	}
	prefixLen := opts.SubnetPrefixLen
	if prefixLen == 0 {
		prefixLen = DefaultSubnetPrefixLen
	}
	var static map[string]string
	switch strategy {
	case StrategyPCIOrder:
	case StrategySubnet:
		if prefixLen < 1 || prefixLen > 32 {
			return nil, fmt.Errorf("subnet prefix length %d: want 1..32", prefixLen)
		}
	case StrategyStatic:
		if opts.StaticFile == "" {
			return nil, errors.New("static rail strategy needs a static file")
		}
		data, err := os.ReadFile(opts.StaticFile)
		if err != nil {
			return nil, fmt.Errorf("static rail table: %w", err)
		}
		if static, err = ParseStaticTable(data); err != nil {
			return nil, fmt.Errorf("static rail table %s: %w", opts.StaticFile, err)
		}
	default:
		return nil, fmt.Errorf("rail strategy %q: want %s, %s or %s", opts.Strategy, StrategyPCIOrder, StrategySubnet, StrategyStatic)
	}

	root := opts.NodeRoot
	if root == "" {
		root = "/"
	}
	root = filepath.Clean(root)
	fsys, dir := opts.FS, ""
	if fsys == nil {
		fi, err := os.Stat(root)
		if err != nil {
			return nil, fmt.Errorf("host root: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("host root %s: not a directory", root)
		}
		fsys, dir = os.DirFS(root), root
	}
	lister := opts.GPUs
	if lister == nil && opts.FS == nil {
		lister = NVML()
	}

	l := &Layout{Strategy: strategy, RailMap: map[string]string{}}
	s := newSysfs(fsys, dir, root, opts.Logger, &l.Warnings)

	hcas, err := s.hcas(ctx)
	if err != nil {
		return nil, err
	}
	gpus, source, err := s.gpus(ctx, lister)
	if err != nil {
		return nil, err
	}
	l.GPUSource = source

	nearest := make([]int, len(gpus))
	for gi := range gpus {
		nearest[gi] = -1
		var best distance
		for hi := range hcas {
			d, ok := classify(gpus[gi].path, hcas[hi].path, gpus[gi].NUMANode, hcas[hi].NUMANode)
			if !ok {
				continue
			}
			l.Pairs = append(l.Pairs, Pair{GPU: gpus[gi].Index, HCA: hcas[hi].Name, Distance: d.class})
			if nearest[gi] < 0 || d.less(best) || (d == best && busLess(hcas[hi].PCIBusID, hcas[nearest[gi]].PCIBusID)) {
				nearest[gi], best = hi, d
			}
		}
		if nearest[gi] >= 0 {
			gpus[gi].HCA = hcas[nearest[gi]].Name
			gpus[gi].Distance = best.class
		}
	}

	switch strategy {
	case StrategyPCIOrder:
		railPCIOrder(l.RailMap, gpus)
	case StrategySubnet:
		l.SharedSubnets = s.railSubnet(l.RailMap, gpus, hcas, prefixLen)
	case StrategyStatic:
		s.railStatic(l.RailMap, hcas, static, opts.StaticFile)
	}
	if err := s.keepContractNames(l.RailMap, hcas); err != nil {
		return nil, err
	}

	rails := map[string]bool{}
	for _, r := range l.RailMap {
		rails[r] = true
	}
	l.Rails = len(rails)
	l.GPUs = make([]GPU, len(gpus))
	for i := range gpus {
		gpus[i].Rail = l.RailMap[gpus[i].HCA]
		l.GPUs[i] = gpus[i].GPU
	}
	l.HCAs = make([]HCA, len(hcas))
	for i := range hcas {
		hcas[i].Rail = l.RailMap[hcas[i].Name]
		l.HCAs[i] = hcas[i].HCA
	}
	return l, nil
}

// Ready reports whether every railed HCA's main port is ACTIVE and the
// strategy left no HCA unrailed for want of a distinct subnet. When not, the
// message says why: the shared subnets with the strategy, or each HCA and
// port that is not active, with its state.
func (l *Layout) Ready() (bool, string) {
	if len(l.SharedSubnets) > 0 {
		return false, l.SharedSubnetMessage()
	}
	var bad []string
	railed := 0
	for _, h := range l.HCAs {
		if h.Rail == "" {
			continue
		}
		railed++
		if h.State == StateActive {
			continue
		}
		msg := fmt.Sprintf("%s port %d %s", h.Name, h.Port, h.State)
		if h.Port == 0 {
			msg = h.Name + " has no port"
		} else if h.PhysState != "" {
			msg += " (" + h.PhysState + ")"
		}
		bad = append(bad, msg)
	}
	if railed == 0 {
		return false, "no HCA is on a rail"
	}
	if len(bad) > 0 {
		return false, "not active: " + strings.Join(bad, "; ")
	}
	return true, fmt.Sprintf("%d railed HCAs active on %d rails", railed, l.Rails)
}

// Healthy reports whether at least one railed HCA's main port is ACTIVE.
func (l *Layout) Healthy() bool {
	for _, h := range l.HCAs {
		if h.Rail != "" && h.State == StateActive {
			return true
		}
	}
	return false
}

// SharedSubnetMessage says which subnets the strategy refused and what to do
// about it; "" when there are none.
func (l *Layout) SharedSubnetMessage() string {
	if len(l.SharedSubnets) == 0 {
		return ""
	}
	parts := make([]string, len(l.SharedSubnets))
	for i, s := range l.SharedSubnets {
		parts[i] = s.String()
	}
	return fmt.Sprintf("rail strategy %s: %s, so the prefix cannot tell their rails apart and they get no rail; "+
		"give each rail's subnet manager its own subnet prefix, or use rail strategy %s or %s",
		l.Strategy, strings.Join(parts, "; "), StrategyPCIOrder, StrategyStatic)
}

// RailMapJSON is the rail map as the value of contract.EnvRailMap: compact
// JSON with sorted keys. Discover leaves only names the contract accepts, so
// this cannot fail on a discovered layout.
func (l *Layout) RailMapJSON() string {
	s, err := contract.EncodeRailMap(l.RailMap)
	if err != nil {
		panic(fmt.Sprintf("rail map cannot be encoded: %v", err))
	}
	return s
}

// keepContractNames drops the rail of every HCA whose name or rail name the
// engine would refuse, with a warning each: one bad entry would make the
// engine refuse the whole map. pci-order and subnet names always pass, and
// static tables are checked when read, so only kernel HCA names can fail.
func (s *sysfs) keepContractNames(railMap map[string]string, hcas []hcaInfo) error {
	dirs := make(map[string]string, len(hcas))
	for _, h := range hcas {
		dirs[h.Name] = h.dir
	}
	names := make([]string, 0, len(railMap))
	for hca := range railMap {
		names = append(names, hca)
	}
	sort.Strings(names)
	for _, hca := range names {
		rail := railMap[hca]
		err := contract.ValidateHCAName(hca)
		if err == nil {
			err = contract.ValidateRailName(rail)
			if err != nil {
				err = fmt.Errorf("rail name %s: %w", contract.Quote(rail), err)
			}
		}
		if err != nil {
			s.warn(dirs[hca], "%s has no rail: %v", contract.Quote(hca), err)
			delete(railMap, hca)
		}
	}
	// The map is published as MC_PXN_RAIL_MAP: the encoder owns its limits.
	if _, err := contract.EncodeRailMap(railMap); err != nil {
		return fmt.Errorf("%d railed HCAs: %w", len(railMap), err)
	}
	return nil
}

// railPCIOrder gives rail k to the k-th distinct nearest HCA, walking GPUs in
// bus order.
func railPCIOrder(railMap map[string]string, gpus []gpuInfo) {
	for _, g := range gpus {
		if g.HCA == "" {
			continue
		}
		if _, ok := railMap[g.HCA]; !ok {
			railMap[g.HCA] = fmt.Sprintf("rail%d", len(railMap))
		}
	}
}

// railStatic rails the HCAs the table names; names that are not HCAs of
// this node are warned about.
func (s *sysfs) railStatic(railMap map[string]string, hcas []hcaInfo, table map[string]string, file string) {
	present := map[string]bool{}
	for _, h := range hcas {
		present[h.Name] = true
	}
	names := make([]string, 0, len(table))
	for n := range table {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !present[n] {
			s.warnFile(file, "names HCA %q, which this node does not have", n)
			continue
		}
		railMap[n] = table[n]
	}
}
