// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

package rail

import (
	"context"
	"fmt"
)

// NVML is the GPU lister backed by the NVIDIA management library. This
// build has no cgo, so it always reports ErrNoDriver.
func NVML() GPULister { return nvmlLister{} }

type nvmlLister struct{}

func (nvmlLister) ListGPUs(context.Context) ([]DriverGPU, error) {
	return nil, fmt.Errorf("nvml: built without cgo: %w", ErrNoDriver)
}
