// SPDX-License-Identifier: Apache-2.0

package rail

import "strings"

// Distance classes of a GPU/HCA pair, nearest first. They are computed from
// the two devices' physical sysfs paths, /sys/devices/pciDDDD:BB/<bridge>/.../<device>:
// the first element is the host bridge (root complex), every later one a PCI
// function, each below the one before. C is the deepest element both paths
// share; a and b are the numbers of PCI functions strictly between C and
// each device (the bridges, i.e. root ports and switch ports, that each
// device's traffic climbs before it reaches C).
//
//   - PIX: C is a PCI function (a switch port or root port) and a <= 1 and
//     b <= 1. Both devices hang off ports of one PCIe switch (C is its
//     upstream port), or share one port: at most one switch between them.
//   - PXB: C is a PCI function and a > 1 or b > 1: the path crosses further
//     switches below the common one, but not the host bridge.
//   - PHB: C is a host bridge: the devices are below different root ports
//     of one root complex (or of one VMD domain, whose pciDDDD:BB sits
//     below a root port), so traffic crosses the root complex.
//   - NODE: different host bridges, same NUMA node (or a node unknown, -1).
//   - SYS: different host bridges on different NUMA nodes: traffic crosses
//     the inter-socket link.
//
// The nearest HCA of a GPU is the one with the lowest class; among equals,
// the one with the fewest bridges on the path (a+b, or for different host
// bridges the bridges from each device up to its own host bridge); then the
// lowest PCI address.
const (
	DistancePIX  = "PIX"
	DistancePXB  = "PXB"
	DistancePHB  = "PHB"
	DistanceNODE = "NODE"
	DistanceSYS  = "SYS"
)

// distance is a class with its rank and the number of bridges on the path.
type distance struct {
	class string
	rank  int
	hops  int
}

func (d distance) less(o distance) bool {
	if d.rank != o.rank {
		return d.rank < o.rank
	}
	return d.hops < o.hops
}

// classify returns the distance class between two PCI paths (see pciPath);
// false when either is unknown.
func classify(a, b []string, numaA, numaB int) (distance, bool) {
	if len(a) < 2 || len(b) < 2 {
		return distance{}, false
	}
	if a[0] != b[0] {
		hops := len(a) - 2 + len(b) - 2
		if numaA >= 0 && numaB >= 0 && numaA != numaB {
			return distance{DistanceSYS, 4, hops}, true
		}
		return distance{DistanceNODE, 3, hops}, true
	}
	k := 1
	for k < len(a)-1 && k < len(b)-1 && a[k] == b[k] {
		k++
	}
	da, db := len(a)-1-k, len(b)-1-k
	switch {
	case strings.HasPrefix(a[k-1], "pci"):
		return distance{DistancePHB, 2, da + db}, true
	case da <= 1 && db <= 1:
		return distance{DistancePIX, 0, da + db}, true
	default:
		return distance{DistancePXB, 1, da + db}, true
	}
}
