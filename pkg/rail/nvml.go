// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package rail

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is the GPU lister backed by the NVIDIA management library, loaded at
// run time; without a driver it reports ErrNoDriver.
func NVML() GPULister { return nvmlLister{} }

type nvmlLister struct{}

func (nvmlLister) ListGPUs(ctx context.Context) ([]DriverGPU, error) {
	lib := nvml.New()
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		return nil, fmt.Errorf("nvml: %s: %w", lib.ErrorString(ret), ErrNoDriver)
	default:
		return nil, fmt.Errorf("nvml init: %s", lib.ErrorString(ret))
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %s", lib.ErrorString(ret))
	}
	out := make([]DriverGPU, 0, n)
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml GPU %d: %s", i, lib.ErrorString(ret))
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml GPU %d UUID: %s", i, lib.ErrorString(ret))
		}
		name, ret := dev.GetName()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml GPU %d name: %s", i, lib.ErrorString(ret))
		}
		pci, ret := dev.GetPciInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml GPU %d PCI info: %s", i, lib.ErrorString(ret))
		}
		out = append(out, DriverGPU{Index: i, UUID: uuid, Name: name, PCIBusID: cString(pci.BusId[:])})
	}
	return out, nil
}

func cString(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
