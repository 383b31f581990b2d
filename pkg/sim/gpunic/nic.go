// SPDX-License-Identifier: Apache-2.0

// Package gpunic is an emulated RDMA NIC on CUDA GPUs, for benchmarks and
// tests on machines without HCAs: a relay.Hop whose writes land in other
// processes' device buffers, batched into GPU operations, and complete on
// the schedule of a modelled wire. It is a simulation, not a transport;
// nothing PXN ships imports it.
package gpunic

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
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
	i := sort.Search(len(t.list), func(i int) bool { return t.list[i].session >= session })
	if i == len(t.list) || t.list[i].session != session {
		return 0, fmt.Errorf("gpunic: unknown target session %q", session)
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

// Options configures an emulated NIC.
type Options struct {
	// RateGBps is the wire's rate R in GB/s (10^9 bytes a second); zero
	// models no wire: completions come when the GPU work is done.
	RateGBps float64
	// OpCost is the wire time each op takes besides its bytes (the NIC
	// fetching and executing its WQE), when RateGBps is set. Zero means
	// DefaultOpCost; a negative value models none.
	OpCost time.Duration
	// QueueDepth bounds the ops accepted and not yet polled; beyond it
	// Submit returns relay.ErrHopBusy. Zero means DefaultDepth.
	QueueDepth int
	// Copy chooses who moves a batch: gpu.GatherAuto (the SM scatter
	// kernel for batches of ops shorter on average than
	// gpu.GatherThreshold, the copy engines otherwise, as the first hop
	// chooses), gpu.GatherCE or gpu.GatherSM.
	Copy gpu.GatherMode
	// GatherPTX replaces the embedded kernel (kernel development only).
	GatherPTX []byte
}

// DefaultDepth is an emulated NIC's default send-queue depth: four
// Pieces of MaxPlans entries, what the default in-flight cap can submit.
const DefaultDepth = 4 * staging.MaxPlans

// DefaultOpCost is the default per-op wire cost: a 400 Gb/s NIC executes on
// the order of 100 million RDMA writes a second on one queue pair, 10 ns
// each; a 16 KiB write at 50 GB/s holds the wire 328 ns, so the cost is
// 3 % of it, and 11 % of a 4 KiB write's.
const DefaultOpCost = 10 * time.Nanosecond

// batchOps is the most ops one GPU operation of the NIC carries, and
// nicBatches how many such operations it has in flight. While the GPU is
// still busy with the NIC's last operation, Poll starts the waiting ops only
// once there are flushOps of them: each operation costs a few µs of driver
// calls, so a NIC polled after every few ops would otherwise cap itself at
// that cost per batch.
const (
	batchOps   = 512
	flushOps   = 128
	nicBatches = 64
	nicStreams = 2
)

// NIC is an emulated RDMA NIC for machines without HCAs: a relay.Hop whose
// writes land in targets' device buffers (Targets) and whose timing follows
// a model of a NIC's wire. The ops it accepts between two Polls (at most
// batchOps) become one GPU operation: the SM scatter kernel of pkg/gpu for
// batches of small ops, one batch copy on the copy engines for large ones.
// Each op holds the wire for OpCost + Len/RateGBps from when the wire is
// free (a NIC sends its queue in order); its completion is reported, in
// submission order, no earlier than that and no earlier than the GPU
// operation's event. Reads fail. It emulates a NIC's timing for benchmarks
// and tests; it is not a transport.
type NIC struct {
	g       *gpu.GPU
	targets *Targets
	rate    float64
	opCost  int64
	depth   int
	epoch   time.Time

	mu      sync.Mutex
	closed  bool
	streams [nicStreams]cuda.Stream
	next    int
	op      *cuda.CopyOp
	ceMode  cuda.CopyMode
	scatter scatter
	piece   cuda.Piece
	entries []cuda.CopyEntry
	// wire is when (ns since epoch) the emulated wire is next free.
	wire int64

	ops      []nicOp
	opHead   int
	opN      int
	batches  [nicBatches]nicBatch
	bHead    int
	bN       int
	curBatch int
	// lastBatch is the batch enqueued last, or -1.
	lastBatch int
}

type nicOp struct {
	token  uint64
	finish int64
	batch  int
	err    error
}

type nicBatch struct {
	ev   cuda.Event
	done bool
	err  error
	ops  int
	// plan is the batch's gather plan, used when the kernel moves it.
	plan planSlot
}

var _ relay.Hop = (*NIC)(nil)

// New creates a NIC over targets on g: its streams, completion events,
// copy op and, unless opts.Copy is gpu.GatherCE, the scatter kernel and its
// plan memory, in g's primary context. A kernel that does not load leaves
// gpu.GatherAuto on the copy engines and fails gpu.GatherSM.
func New(g *gpu.GPU, targets *Targets, opts Options) (*NIC, error) {
	if opts.RateGBps < 0 {
		return nil, fmt.Errorf("gpunic: rate %g GB/s", opts.RateGBps)
	}
	depth := opts.QueueDepth
	if depth <= 0 {
		depth = DefaultDepth
	}
	cost := opts.OpCost
	switch {
	case cost == 0:
		cost = DefaultOpCost
	case cost < 0:
		cost = 0
	}
	n := &NIC{g: g, targets: targets, rate: opts.RateGBps, opCost: cost.Nanoseconds(), depth: depth, epoch: time.Now(),
		ops: make([]nicOp, depth), entries: make([]cuda.CopyEntry, 0, batchOps), ceMode: g.Driver().BestCopyMode(), curBatch: -1, lastBatch: -1}
	err := g.Do(func() error {
		var err error
		for i := range n.streams {
			if n.streams[i], err = g.Driver().StreamCreate(cuda.StreamNonBlocking); err != nil {
				return err
			}
		}
		if n.op, err = g.Driver().NewCopyOp(batchOps); err != nil {
			return err
		}
		for i := range n.batches {
			if n.batches[i].ev, err = g.Driver().EventCreate(cuda.EventDisableTiming); err != nil {
				return err
			}
		}
		return n.scatter.setup(g, opts.Copy, opts.GatherPTX, n.batches[:])
	})
	if err != nil {
		return nil, errors.Join(err, n.destroy())
	}
	return n, nil
}

// Scatter reports whether batches of small ops go to the SM kernel, and
// why not where they do not.
func (n *NIC) Scatter() (bool, string) { return n.scatter.fn != 0, n.scatter.why }

// errNICRead fails read ops: the emulated NIC only writes.
var errNICRead = errors.New("gpunic: the emulated NIC cannot read")

// Submit accepts every op or, when the queue has no room for all of them,
// none and returns relay.ErrHopBusy. An op that cannot be performed
// (unknown session, range outside the target, a read) is accepted and
// completes with an error. The ops start on the GPU at the next Poll, or
// once batchOps of them are waiting.
func (n *NIC) Submit(ops []relay.WriteOp) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return errors.New("gpunic: closed")
	}
	if len(ops) > n.depth {
		return fmt.Errorf("gpunic: batch of %d ops, more than the queue depth %d", len(ops), n.depth)
	}
	if n.opN+len(ops) > n.depth || n.bN+(len(ops)+batchOps-1)/batchOps+1 > nicBatches {
		return relay.ErrHopBusy
	}
	now := time.Since(n.epoch).Nanoseconds()
	for i := range ops {
		op := &ops[i]
		o := nicOp{token: op.Token, batch: -1}
		var dst cuda.DevicePtr
		switch {
		case op.Read:
			o.err = fmt.Errorf("token %d: %w", op.Token, errNICRead)
		default:
			if dst, o.err = n.targets.Translate(op.Target, op.Dst, op.Len); o.err == nil && op.Len > 0 && op.Src == 0 {
				o.err = fmt.Errorf("gpunic: token %d has no source", op.Token)
			}
		}
		if o.err == nil {
			o.finish = n.pace(now, op.Len)
			if op.Len > 0 {
				if len(n.entries) == batchOps {
					n.flush()
				}
				n.entries = append(n.entries, cuda.CopyEntry{Src: uint64(op.Src), Dst: uint64(dst), Len: op.Len})
				o.batch = n.openBatch()
				n.batches[o.batch].ops++
			}
		}
		n.ops[(n.opHead+n.opN)%n.depth] = o
		n.opN++
	}
	return nil
}

// pace books an op of n bytes on the wire and returns when it is through.
func (n *NIC) pace(now int64, bytes uint64) int64 {
	if n.rate == 0 {
		return 0
	}
	start := max(now, n.wire)
	n.wire = start + n.opCost + int64(float64(bytes)/n.rate)
	return n.wire
}

// openBatch returns the batch being filled, opening one if needed.
func (n *NIC) openBatch() int {
	if n.curBatch < 0 {
		n.curBatch = (n.bHead + n.bN) % nicBatches
		b := &n.batches[n.curBatch]
		b.done, b.err, b.ops = false, nil, 0
		n.bN++
	}
	return n.curBatch
}

// flush enqueues the open batch as one GPU operation and its completion
// event, alternating the NIC's streams so that one batch's launch overlaps
// the previous one's tail. A failed enqueue fails the batch's ops (the
// batch is then done, with the error).
func (n *NIC) flush() {
	if n.curBatch < 0 {
		return
	}
	b := &n.batches[n.curBatch]
	p := &n.piece
	*p = cuda.Piece{Ctx: n.g.Context(), Stream: n.streams[n.next], Mode: n.ceMode, Entries: n.entries, Done: b.ev}
	n.next = (n.next + 1) % nicStreams
	if n.scatter.use(n.entries) {
		p.Mode = cuda.CopyGather
		p.Gather = n.scatter.launch(&b.plan)
	} else if len(n.entries) == 1 {
		p.Mode = cuda.CopyPerEntry
	}
	if err := n.op.Enqueue(p); err != nil {
		b.done, b.err = true, fmt.Errorf("gpunic: %w", err)
	}
	n.lastBatch = n.curBatch
	p.Entries = nil
	n.entries = n.entries[:0]
	n.curBatch = -1
}

// Poll starts the ops submitted since the last Poll (when the GPU is done
// with the NIC's previous operation, or flushOps of them wait) and moves up
// to len(out) completions into out, in submission order.
func (n *NIC) Poll(out []relay.HopCompletion) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return 0
	}
	if n.curBatch >= 0 && (len(n.entries) >= flushOps || !n.busy()) {
		n.flush()
	}
	now := time.Since(n.epoch).Nanoseconds()
	k := 0
	for k < len(out) && n.opN > 0 {
		o := &n.ops[n.opHead]
		var err error
		if o.batch >= 0 && o.batch == n.curBatch {
			// Not yet enqueued: its event still holds an earlier record.
			break
		}
		if o.batch >= 0 {
			b := &n.batches[o.batch]
			if !b.done {
				done, qerr := n.g.Driver().QueryEvent(n.g.Context(), b.ev)
				if qerr != nil {
					b.done, b.err = true, fmt.Errorf("gpunic: completion: %w", qerr)
				} else if !done {
					break
				}
				b.done = true
			}
			err = b.err
		}
		if o.finish > now {
			break
		}
		if err == nil {
			err = o.err
		}
		out[k] = relay.HopCompletion{Token: o.token, Err: err}
		k++
		if o.batch >= 0 {
			b := &n.batches[o.batch]
			b.ops--
			if b.ops == 0 {
				n.bHead = (n.bHead + 1) % nicBatches
				n.bN--
			}
		}
		*o = nicOp{}
		n.opHead = (n.opHead + 1) % n.depth
		n.opN--
	}
	return k
}

// busy reports whether the GPU has not finished the NIC's last operation.
func (n *NIC) busy() bool {
	if n.lastBatch < 0 {
		return false
	}
	b := &n.batches[n.lastBatch]
	if b.done || b.ops == 0 {
		return false
	}
	done, err := n.g.Driver().QueryEvent(n.g.Context(), b.ev)
	return err == nil && !done
}

// Close waits for the NIC's GPU work and frees its streams, events and
// kernel. Ops not yet polled are dropped. It does not close the targets.
func (n *NIC) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	return n.destroy()
}

func (n *NIC) destroy() error {
	return n.g.Do(func() error {
		d := n.g.Driver()
		var errs []error
		for i, s := range n.streams {
			if s != 0 {
				errs = append(errs, d.StreamSynchronize(s), d.StreamDestroy(s))
				n.streams[i] = 0
			}
		}
		errs = append(errs, n.scatter.free(d, n.batches[:]))
		for i := range n.batches {
			if ev := n.batches[i].ev; ev != 0 {
				errs = append(errs, d.EventDestroy(ev))
				n.batches[i].ev = 0
			}
		}
		if n.op != nil {
			n.op.Free()
			n.op = nil
		}
		return errors.Join(errs...)
	})
}
