// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/sim/gpunic"
)

// cudaRank is a rank on a GPU: its source in device memory, the GPU
// copier and arenas for the first hop, and an emulated NIC for the second.
type cudaRank struct {
	d    *cuda.Driver
	g    *gpu.GPU
	maps *gpunic.Targets
	nic  *gpunic.NIC
	src  cuda.DevicePtr
	ptx  []byte
	// noInline uploads every gather plan (RankOptions.NoInlinePlan).
	noInline bool
	// pollSpin and pollNap are the pump's poll policy (zero: the copier's
	// default).
	pollSpin, pollNap time.Duration
	share             gpu.ArenaShare
	arenas            *gpu.Arenas
}

func newCUDARank(o RankOptions) (_ *cudaRank, err error) {
	// The main goroutine keeps one OS thread with the GPU's context
	// current for set-up calls; the engine's own calls manage theirs.
	runtime.LockOSThread()
	targets, err := readNICTargets(o.NIC)
	if err != nil {
		return nil, err
	}
	r := &cudaRank{pollSpin: o.PollSpin, pollNap: o.PollNap, noInline: o.NoInlinePlan}
	if r.share, err = gpu.ParseArenaShare(o.ArenaShare); err != nil {
		return nil, err
	}
	if o.GatherPTX != "" {
		if r.ptx, err = os.ReadFile(o.GatherPTX); err != nil {
			return nil, err
		}
	}
	if r.d, err = cuda.Load(); err != nil {
		return nil, err
	}
	if r.g, err = gpu.Open(r.d, o.GPU); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.close())
		}
	}()
	if err := r.d.CtxSetCurrent(r.g.Context()); err != nil {
		return nil, err
	}
	if r.maps, err = gpunic.OpenTargets(r.g, targets); err != nil {
		return nil, err
	}
	if r.nic, err = gpunic.New(r.g, r.maps, gpunic.Options{RateGBps: o.Rate}); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *cudaRank) source(n, seed uint64) (uintptr, error) {
	n = max(n, 1<<20)
	src, err := r.d.MemAlloc(n)
	if err != nil {
		return 0, err
	}
	r.src = src
	if err := fillDevice(r.d, src, n, seed); err != nil {
		return 0, err
	}
	return uintptr(src), nil
}

func (r *cudaRank) hop() relay.Hop { return r.nic }

func (r *cudaRank) newHop() (relay.Hop, error) { return gpunic.New(r.g, r.maps, gpunic.Options{}) }

func (r *cudaRank) firstHop(deps *engineopen.HostDeps, _ uintptr, _ uint64) (string, error) {
	log := klog.Background()
	gather, err := gpu.ParseGatherMode(engineconfig.Load(nil, nil).CopyMode)
	if err != nil {
		return "", err
	}
	c, err := gpu.NewCopier(r.g, gpu.CopierOptions{Gather: gather, GatherPTX: r.ptx, NoInlinePlan: r.noInline, PollSpin: r.pollSpin, PollNap: r.pollNap})
	if err != nil {
		return "", err
	}
	r.arenas = gpu.NewArenasWith(r.g, gpu.ArenaOptions{Share: r.share, Logger: log})
	deps.Copier, deps.Arenas = c, r.arenas
	gi := c.Gather()
	share, why := r.arenas.Share()
	return fmt.Sprintf("copy %v, doorbell %s, gather %v (%d×%d, threshold %s): %s; arena shared by %v (%s)", c.CopyMode(), c.Doorbell(),
		gi.Mode, gi.Grid, gi.Block, sizeString(gi.Threshold), gi.Reason, share, why), nil
}

func (r *cudaRank) arenaShares() *shareCounts {
	if r.arenas == nil {
		return nil
	}
	c := r.arenas.Counts()
	share, _ := r.arenas.Share()
	return &shareCounts{Own: share.String(), FD: c.FD, IPC: c.IPC, FailedFD: c.FailedFD, FailedIPC: c.FailedIPC}
}

func (r *cudaRank) freeMemory() (uint64, bool) {
	free, _, err := r.d.MemGetInfo()
	return free, err == nil
}

func (r *cudaRank) spin() bool { return true }

// rawCopy copies a rank's traffic with one cuMemcpyAsync per request on one
// stream into the targets' buffers, once to warm up and reps times timed:
// the copy engine's own rate for the same bytes.
func (r *cudaRank) rawCopy(reqs []relay.Request, total uint64, reps int) (*rawResult, error) {
	if len(reqs) == 0 {
		return &rawResult{}, nil
	}
	d := r.d
	type cp struct {
		dst cuda.DevicePtr
		req relay.Request
	}
	cps := make([]cp, len(reqs))
	for i, q := range reqs {
		dst, err := r.maps.Translate(q.Target, q.Dst, q.Len)
		if err != nil {
			return nil, err
		}
		cps[i] = cp{dst: dst, req: q}
	}
	st, err := d.StreamCreate(cuda.StreamNonBlocking)
	if err != nil {
		return nil, err
	}
	defer d.StreamDestroy(st)
	once := func(reps int) (time.Duration, error) {
		start := time.Now()
		for range reps {
			for _, c := range cps {
				if err := d.MemcpyAsync(c.dst, cuda.DevicePtr(c.req.Src), c.req.Len, st); err != nil {
					return 0, err
				}
			}
		}
		if err := d.StreamSynchronize(st); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	if _, err := once(1); err != nil {
		return nil, err
	}
	t, err := once(reps)
	if err != nil {
		return nil, err
	}
	return &rawResult{Bytes: total * uint64(reps), Seconds: t.Seconds()}, nil
}

func (r *cudaRank) close() error {
	var errs []error
	if r.nic != nil {
		errs = append(errs, r.nic.Close())
	}
	if r.maps != nil {
		errs = append(errs, r.maps.Close())
	}
	if r.src != 0 {
		errs = append(errs, r.d.MemFree(r.src))
	}
	if r.g != nil {
		errs = append(errs, r.g.Close())
	}
	if r.d != nil {
		r.d.Close()
	}
	return errors.Join(errs...)
}

func readNICTargets(path string) ([]gpunic.Target, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list []nicTargetJSON
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []gpunic.Target
	for _, t := range list {
		h, err := decodeHandle(t.Handle)
		if err != nil {
			return nil, fmt.Errorf("%s: target %q: %w", path, t.Session, err)
		}
		out = append(out, gpunic.Target{Session: t.Session, Addr: t.Addr, Len: t.Len, Handle: h})
	}
	return out, nil
}

func decodeHandle(s string) (cuda.IPCMemHandle, error) {
	var h cuda.IPCMemHandle
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(h) {
		return h, fmt.Errorf("IPC handle %q: want %d hex bytes", s, len(h))
	}
	copy(h[:], b)
	return h, nil
}

// fillDevice writes the pattern of seed into n bytes at p, through a host
// buffer filled in parallel.
func fillDevice(d *cuda.Driver, p cuda.DevicePtr, n, seed uint64) error {
	const chunk = 256 << 20
	buf := make([]byte, min(n, chunk))
	for off := uint64(0); off < n; off += chunk {
		b := buf[:min(chunk, n-off)]
		parallel(uint64(len(b)), 8<<20, func(a, e uint64) error {
			fillPattern(b[a:e], seed, off+a)
			return nil
		})
		if err := d.MemcpyHtoD(p+cuda.DevicePtr(off), b); err != nil {
			return err
		}
	}
	return nil
}

// cudaTarget is a remote node's registered buffer on one rail, in device
// memory: it exports the buffer's IPC handle for the ranks' emulated NICs
// and copies what they wrote back to the host to be checked.
type cudaTarget struct {
	d    *cuda.Driver
	g    *gpu.GPU
	buf  cuda.DevicePtr
	n    uint64
	want uint64
	host []byte
}

func newCUDATarget(ordinal int, want uint64) (_ *cudaTarget, handle string, err error) {
	runtime.LockOSThread()
	t := &cudaTarget{want: want, n: (max(want, 1<<20) + 4095) &^ 4095}
	if t.d, err = cuda.Load(); err != nil {
		return nil, "", err
	}
	if t.g, err = gpu.Open(t.d, ordinal); err != nil {
		return nil, "", err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.close())
		}
	}()
	if err := t.d.CtxSetCurrent(t.g.Context()); err != nil {
		return nil, "", err
	}
	if t.buf, err = t.d.MemAlloc(t.n); err != nil {
		return nil, "", err
	}
	if err := t.reset(); err != nil {
		return nil, "", err
	}
	h, err := t.d.IPCGetMemHandle(t.buf)
	if err != nil {
		return nil, "", err
	}
	return t, hex.EncodeToString(h[:]), nil
}

func (t *cudaTarget) received() ([]byte, error) {
	if t.host == nil {
		t.host = make([]byte, t.want)
	}
	return t.host, t.d.MemcpyDtoH(t.host, t.buf)
}

func (t *cudaTarget) reset() error {
	if err := t.d.MemsetD32Async(t.buf, 0, t.n/4, 0); err != nil {
		return err
	}
	return t.d.StreamSynchronize(0)
}

func (t *cudaTarget) close() error {
	var errs []error
	if t.buf != 0 {
		errs = append(errs, t.d.MemFree(t.buf))
	}
	if t.g != nil {
		errs = append(errs, t.g.Close())
	}
	if t.d != nil {
		t.d.Close()
	}
	return errors.Join(errs...)
}
