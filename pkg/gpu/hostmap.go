// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/pxn-project/pxn/pkg/cuda"
)

// hostRange is host memory registered with cuMemHostRegister and its device
// address.
type hostRange struct {
	host uintptr
	size uint64
	dev  cuda.DevicePtr
}

// hostMap translates registered host addresses (lanes' sender blocks) to
// device addresses. Readers load an immutable sorted slice; writers copy it
// under mu.
type hostMap struct {
	mu     sync.Mutex
	ranges atomic.Pointer[[]hostRange]
}

// device returns the device address of host address p, for n bytes.
func (m *hostMap) device(p uintptr, n uint64) (cuda.DevicePtr, bool) {
	rs := m.ranges.Load()
	if rs == nil {
		return 0, false
	}
	r := *rs
	i := sort.Search(len(r), func(i int) bool { return r[i].host+uintptr(r[i].size) > p })
	if i == len(r) || p < r[i].host || uint64(p-r[i].host)+n > r[i].size {
		return 0, false
	}
	return r[i].dev + cuda.DevicePtr(p-r[i].host), true
}

func (m *hostMap) add(hr hostRange) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var cur []hostRange
	if rs := m.ranges.Load(); rs != nil {
		cur = *rs
	}
	for _, r := range cur {
		if hr.host < r.host+uintptr(r.size) && r.host < hr.host+uintptr(hr.size) {
			return fmt.Errorf("gpu: host range %#x+%d overlaps registered %#x+%d", hr.host, hr.size, r.host, r.size)
		}
	}
	next := append(append([]hostRange(nil), cur...), hr)
	sort.Slice(next, func(i, j int) bool { return next[i].host < next[j].host })
	m.ranges.Store(&next)
	return nil
}

func (m *hostMap) remove(host uintptr) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	rs := m.ranges.Load()
	if rs == nil {
		return false
	}
	next := make([]hostRange, 0, len(*rs))
	found := false
	for _, r := range *rs {
		if r.host == host {
			found = true
			continue
		}
		next = append(next, r)
	}
	m.ranges.Store(&next)
	return found
}

func (m *hostMap) all() []hostRange {
	if rs := m.ranges.Load(); rs != nil {
		return append([]hostRange(nil), *rs...)
	}
	return nil
}
