// SPDX-License-Identifier: Apache-2.0

package nodestate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/pxn-project/pxn/pkg/rail"
)

// Fingerprint hashes what a discovery with o depends on and what changes at
// run time: the HCA devices and their ports' states, the PCI functions and
// the GPUs bound to the driver, and the static table. sysfs sends no inotify
// events, so a watcher polls this. GIDs (the subnet strategy's input) are
// left to the periodic rediscovery: reading every GID table each poll is not
// cheap.
func Fingerprint(o rail.Options) (string, error) {
	root := o.NodeRoot
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
	if f := o.StaticFile; f != "" {
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
