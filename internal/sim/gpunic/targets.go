// SPDX-License-Identifier: Apache-2.0

package gpunic

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
)

// Target is one target session of an emulated NIC: the registered range
// [Addr, Addr+Len) that WriteOp.Dst refers to, backed by a device buffer
// of another process exported with cuIpcGetMemHandle.
type Target struct {
	Session string
	Addr    uint64
	Len     uint64
	Handle  cuda.IPCMemHandle
}

// Targets are targets' buffers mapped into this process (cuIpcOpenMemHandle,
// lazy peer access). Several NICs of one process share them.
type Targets struct {
	g    *gpu.GPU
	list []nicTarget
	mu   sync.Mutex
	open bool
}

type nicTarget struct {
	session string
	addr    uint64
	len     uint64
	base    cuda.DevicePtr
}

// OpenTargets maps every target's buffer on g. The targets' processes
// must keep their buffers until Close.
func OpenTargets(g *gpu.GPU, targets []Target) (*Targets, error) {
	t := &Targets{g: g, open: true}
	err := g.Do(func() error {
		for _, tg := range targets {
			if tg.Session == "" || tg.Len == 0 || tg.Addr+tg.Len < tg.Addr {
				return fmt.Errorf("gpunic: target %q: range %#x+%d", tg.Session, tg.Addr, tg.Len)
			}
			for _, o := range t.list {
				if o.session == tg.Session {
					return fmt.Errorf("gpunic: target %q listed twice", tg.Session)
				}
			}
			base, err := g.Driver().IPCOpenMemHandle(tg.Handle, cuda.IPCLazyEnablePeerAccess)
			if err != nil {
				return fmt.Errorf("gpunic: target %q: %w", tg.Session, err)
			}
			t.list = append(t.list, nicTarget{session: tg.Session, addr: tg.Addr, len: tg.Len, base: base})
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(err, t.Close())
	}
	sort.Slice(t.list, func(i, j int) bool { return t.list[i].session < t.list[j].session })
	return t, nil
}

// Translate returns the device address, in this process, of n bytes at dst
// of session.
func (t *Targets) Translate(session string, dst, n uint64) (cuda.DevicePtr, error) {
	hint := 0
	return t.translate(session, dst, n, &hint)
}

// translate is Translate starting from the target at *hint, where a run of
// ops to one session finds it without a search; it leaves the target found
// in *hint.
func (t *Targets) translate(session string, dst, n uint64, hint *int) (cuda.DevicePtr, error) {
	i := *hint
	if i >= len(t.list) || t.list[i].session != session {
		i = sort.Search(len(t.list), func(i int) bool { return t.list[i].session >= session })
		if i == len(t.list) || t.list[i].session != session {
			return 0, fmt.Errorf("gpunic: unknown target session %q", session)
		}
		*hint = i
	}
	tg := &t.list[i]
	if dst < tg.addr || dst+n < dst || dst+n > tg.addr+tg.len {
		return 0, fmt.Errorf("gpunic: %#x+%d is outside %q's range %#x+%d", dst, n, session, tg.addr, tg.len)
	}
	return tg.base + cuda.DevicePtr(dst-tg.addr), nil
}

// Close unmaps the targets. Work enqueued into them must have completed.
func (t *Targets) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.open {
		return nil
	}
	t.open = false
	return t.g.Do(func() error {
		var errs []error
		for _, tg := range t.list {
			errs = append(errs, t.g.Driver().IPCCloseMemHandle(tg.base))
		}
		return errors.Join(errs...)
	})
}
