// SPDX-License-Identifier: Apache-2.0

package rail

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// GPULister is the GPU driver library's view of the GPUs: NVML on a real
// host, a fake in tests.
type GPULister interface {
	// ListGPUs returns the GPUs, or an error wrapping ErrNoDriver when the
	// library is not there.
	ListGPUs(ctx context.Context) ([]DriverGPU, error)
}

// DriverGPU is a GPU as the driver library reports it.
type DriverGPU struct {
	Index    int
	UUID     string
	Name     string // product name, e.g. NVIDIA H200
	PCIBusID string // any form NormalizeBusID accepts, e.g. NVML's 00000000:18:00.0
}

// ErrNoDriver says the GPU driver library could not be loaded.
var ErrNoDriver = errors.New("GPU driver library not available")

// gpuInfo is a GPU with where it sits; path is nil when its PCI function was
// not found in sysfs.
type gpuInfo struct {
	GPU
	path []string
}

const busPCIDevices = "sys/bus/pci/devices"

// PCI IDs that make a function a GPU in the sysfs scan.
const (
	vendorNVIDIA   = 0x10de
	class3DControl = 0x0302 // base class and subclass, without the programming interface
)

// gpus lists the GPUs in PCI bus order: from the driver library when there
// is one that loads and at least one of its GPUs is in this sysfs tree, else
// from a scan of the PCI bus. A library that lists no GPU, or only GPUs this
// tree does not show (a host root that is not the library's host), gives way
// to the scan, with a warning when the scan finds GPUs.
func (s *sysfs) gpus(ctx context.Context, lister GPULister) ([]gpuInfo, string, error) {
	if lister != nil {
		list, err := lister.ListGPUs(ctx)
		switch {
		case err == nil:
			mark := len(*s.warnings)
			gpus := s.driverGPUs(list)
			if slices.ContainsFunc(gpus, func(g gpuInfo) bool { return g.path != nil }) {
				return gpus, GPUSourceNVML, nil
			}
			*s.warnings = (*s.warnings)[:mark]
			scanned, err := s.scanGPUs(ctx)
			if err == nil && (len(scanned) > 0 || len(list) > 0) {
				why := "lists no GPU (a container runtime that hides the GPUs, e.g. NVIDIA_VISIBLE_DEVICES=none?)"
				if len(list) > 0 {
					why = fmt.Sprintf("lists %d GPUs, none of them under %s", len(list), s.host(busPCIDevices))
				}
				*s.warnings = append(*s.warnings, fmt.Sprintf("GPU driver library %s; the PCI scan found %d GPUs and is used instead", why, len(scanned)))
				s.log.Info("GPU driver library disagrees with sysfs; using the PCI scan", "why", why, "scanned", len(scanned))
			}
			return scanned, GPUSourceSysfs, err
		case ctx.Err() != nil:
			return nil, "", ctx.Err()
		case errors.Is(err, ErrNoDriver):
			s.log.V(1).Info("No GPU driver library; scanning the PCI bus for GPUs", "reason", err.Error())
		default:
			*s.warnings = append(*s.warnings, fmt.Sprintf("GPU driver library: %v; scanning the PCI bus for GPUs instead", err))
			s.log.Info("GPU driver library failed; scanning the PCI bus for GPUs instead", "err", err.Error())
		}
	}
	gpus, err := s.scanGPUs(ctx)
	return gpus, GPUSourceSysfs, err
}

// driverGPUs places the driver's GPUs in sysfs.
func (s *sysfs) driverGPUs(list []DriverGPU) []gpuInfo {
	out := make([]gpuInfo, 0, len(list))
	for _, d := range list {
		id, err := NormalizeBusID(d.PCIBusID)
		if err != nil {
			*s.warnings = append(*s.warnings, fmt.Sprintf("GPU %d (%s): skipped: %v", d.Index, d.UUID, err))
			s.log.Info("GPU skipped", "index", d.Index, "uuid", d.UUID, "err", err.Error())
			continue
		}
		g := gpuInfo{GPU: GPU{Index: d.Index, UUID: d.UUID, Name: d.Name, PCIBusID: id, NUMANode: -1}}
		link := busPCIDevices + "/" + id
		dir, err := s.resolve(link)
		if err == nil {
			g.path, err = pciPath(dir)
		}
		if err != nil {
			s.warn(link, "GPU %d has no usable PCI device, so no distances: %v", d.Index, err)
		} else {
			g.NUMANode = s.numaNode(dir)
			g.PCIeRoot = g.path[0]
		}
		out = append(out, g)
	}
	sort.SliceStable(out, func(i, j int) bool { return busLess(out[i].PCIBusID, out[j].PCIBusID) })
	return out
}

// scanGPUs finds NVIDIA 3D controllers (class 0x0302xx) on the PCI bus,
// leaving out virtual functions. NVSwitches (class 0x0680xx), NVIDIA PCIe
// switch ports (0x0604xx) and display controllers (0x0300xx) are not GPUs.
func (s *sysfs) scanGPUs(ctx context.Context) ([]gpuInfo, error) {
	names, err := s.readDirNames(busPCIDevices)
	if err != nil {
		s.warn(busPCIDevices, "unreadable, so no GPUs: %s", errText(err))
		return nil, nil
	}
	var out []gpuInfo
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		link := busPCIDevices + "/" + name
		if !isBusID(name) {
			s.warn(link, "not a PCI address")
			continue
		}
		dir, err := s.resolve(link)
		if err != nil {
			s.warn(link, "skipped: %v", err)
			continue
		}
		vendor, ok := s.hexAttr(dir + "/vendor")
		if !ok || vendor != vendorNVIDIA {
			continue
		}
		class, ok := s.hexAttr(dir + "/class")
		if !ok || class>>8 != class3DControl || s.isVF(dir) {
			continue
		}
		comps, err := pciPath(dir)
		if err != nil {
			s.warn(link, "skipped GPU: %v", err)
			continue
		}
		out = append(out, gpuInfo{
			GPU:  GPU{PCIBusID: name, PCIeRoot: comps[0], NUMANode: s.numaNode(dir)},
			path: comps,
		})
	}
	sort.Slice(out, func(i, j int) bool { return busLess(out[i].PCIBusID, out[j].PCIBusID) })
	for i := range out {
		out[i].Index = i
	}
	return out, nil
}

// NormalizeBusID turns a PCI address into its sysfs form, 0000:18:00.0:
// lowercase, a domain of at least four digits. It accepts NVML's
// 00000000:18:00.0 and a missing domain (18:00.0, domain 0).
func NormalizeBusID(id string) (string, error) {
	d, err := parseBusID(id)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", d.domain, d.bus, d.dev, d.fn), nil
}

type busAddr struct {
	domain       uint32
	bus, dev, fn uint8
}

func parseBusID(id string) (busAddr, error) {
	bad := func(why string) (busAddr, error) {
		return busAddr{}, fmt.Errorf("PCI address %q: %s", id, why)
	}
	parts := strings.Split(id, ":")
	var domain string
	switch len(parts) {
	case 2:
		domain = "0"
	case 3:
		domain, parts = parts[0], parts[1:]
	default:
		return bad("want [DOMAIN:]BUS:DEVICE.FUNCTION")
	}
	devFn := strings.Split(parts[1], ".")
	if len(devFn) != 2 {
		return bad("want DEVICE.FUNCTION after the bus")
	}
	field := func(s string, maxDigits int, max uint64) (uint64, bool) {
		if s == "" || len(s) > maxDigits {
			return 0, false
		}
		for i := 0; i < len(s); i++ {
			if !isHex(s[i]) {
				return 0, false
			}
		}
		n, err := strconv.ParseUint(s, 16, 32)
		return n, err == nil && n <= max
	}
	dom, ok1 := field(domain, 8, 0xffffffff)
	bus, ok2 := field(parts[0], 2, 0xff)
	dev, ok3 := field(devFn[0], 2, 0x1f)
	fn, ok4 := field(devFn[1], 1, 7)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return bad("a field is not hex or out of range")
	}
	return busAddr{domain: uint32(dom), bus: uint8(bus), dev: uint8(dev), fn: uint8(fn)}, nil
}

// isBusID reports whether s is a PCI address in sysfs form.
func isBusID(s string) bool {
	n, err := NormalizeBusID(s)
	return err == nil && n == s
}

// busLess orders PCI addresses numerically; addresses that do not parse sort
// last, by text.
func busLess(a, b string) bool {
	x, errA := parseBusID(a)
	y, errB := parseBusID(b)
	switch {
	case errA != nil || errB != nil:
		if (errA == nil) != (errB == nil) {
			return errA == nil
		}
		return a < b
	case x.domain != y.domain:
		return x.domain < y.domain
	case x.bus != y.bus:
		return x.bus < y.bus
	case x.dev != y.dev:
		return x.dev < y.dev
	case x.fn != y.fn:
		return x.fn < y.fn
	}
	return a < b
}
