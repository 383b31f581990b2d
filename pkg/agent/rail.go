// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/pkg/rail"
)

// RailDiscoverer discovers with pkg/rail under a host root.
type RailDiscoverer struct {
	Options rail.Options
}

// Discover runs rail.Discover and converts its layout to the API's types.
func (r RailDiscoverer) Discover(ctx context.Context) (*Discovery, error) {
	l, err := rail.Discover(ctx, r.Options)
	if err != nil {
		return nil, err
	}
	d := &Discovery{Layout: LayoutFromRail(l), Warnings: l.Warnings, SharedSubnetMessage: l.SharedSubnetMessage()}
	d.Ready, d.NotReadyMessage = l.Ready()
	if d.Ready {
		d.NotReadyMessage = ""
	}
	return d, nil
}

// LayoutFromRail converts a discovered layout to the PxnRailMap status form.
func LayoutFromRail(l *rail.Layout) pxnv1alpha1.RailLayout {
	out := pxnv1alpha1.RailLayout{
		Rails:     int32(l.Rails),
		Strategy:  l.Strategy,
		GPUSource: l.GPUSource,
	}
	for _, g := range l.GPUs {
		out.GPUs = append(out.GPUs, pxnv1alpha1.GPU{
			Index: int32(g.Index), UUID: g.UUID, Name: g.Name, PCIBusID: g.PCIBusID, NUMANode: int32(g.NUMANode),
			HCA: g.HCA, Distance: g.Distance, Rail: g.Rail,
		})
	}
	for _, h := range l.HCAs {
		out.HCAs = append(out.HCAs, pxnv1alpha1.HCA{
			Name: h.Name, PCIBusID: h.PCIBusID, NUMANode: int32(h.NUMANode), LinkLayer: h.LinkLayer,
			State: h.State, PhysState: h.PhysState, Rate: h.Rate, Netdev: h.Netdev, Rail: h.Rail, Port: int32(h.Port),
		})
	}
	for _, p := range l.Pairs {
		out.Pairs = append(out.Pairs, pxnv1alpha1.Pair{GPU: int32(p.GPU), HCA: p.HCA, Distance: p.Distance})
	}
	if len(l.RailMap) > 0 {
		out.RailMap = make(map[string]string, len(l.RailMap))
		for k, v := range l.RailMap {
			out.RailMap[k] = v
		}
	}
	return out
}

// Fingerprint hashes what a discovery depends on and what changes at run
// time: the HCA devices and their ports' states, the PCI functions and the
// GPUs bound to the driver, and the static table. sysfs sends no inotify
// events, so the agent polls this. GIDs (the subnet strategy's input) are
// left to the periodic resync: reading every GID table each poll is not cheap.
func (r RailDiscoverer) Fingerprint() (string, error) {
	root := r.Options.NodeRoot
	if root == "" {
		root = "/"
	}
	h := sha256.New()
	ib := filepath.Join(root, "sys/class/infiniband")
	hcas, err := readDirNames(ib)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("fingerprint %s: %w", ib, err)
	}
	for _, hca := range hcas {
		dir := filepath.Join(ib, hca)
		target, _ := os.Readlink(dir)
		fmt.Fprintf(h, "hca %s %s\n", hca, target)
		ports, _ := readDirNames(filepath.Join(dir, "ports"))
		for _, p := range ports {
			fmt.Fprintf(h, "port %s", p)
			for _, attr := range []string{"state", "phys_state", "link_layer"} {
				hashFile(h, filepath.Join(dir, "ports", p, attr))
			}
		}
	}
	for _, dir := range []string{"sys/bus/pci/devices", "sys/bus/pci/drivers/nvidia"} {
		names, _ := readDirNames(filepath.Join(root, dir))
		fmt.Fprintf(h, "%s %q\n", dir, names)
	}
	if f := r.Options.StaticFile; f != "" {
		hashFile(h, f)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func readDirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, err
}

// hashFile adds a file's contents, or the kind of error reading it gave.
func hashFile(h hash.Hash, path string) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		fmt.Fprintf(h, " %q", b)
	case errors.Is(err, fs.ErrNotExist):
		fmt.Fprintf(h, " <missing>")
	default:
		fmt.Fprintf(h, " <unreadable>")
	}
}
