// SPDX-License-Identifier: Apache-2.0

// Package gpunic is an emulated RDMA NIC on CUDA GPUs, for benchmarks and
// tests on machines without HCAs: a relay.Hop whose writes land in other
// processes' device buffers, batched into GPU operations, and complete on
// the schedule of a modelled wire. It is a simulation, not a transport;
// nothing PXN ships imports it.
package gpunic

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// Options configures an emulated NIC.
type Options struct {
	// RateGBps is the wire's rate R in GB/s (10^9 bytes a second); zero
	// models no wire: completions come when the GPU work is done.
	RateGBps float64
	// OpCost is the least wire time an op takes however few its bytes
	// (the NIC fetching and executing its WQE: its message rate), when
	// RateGBps is set. Zero means DefaultOpCost; a negative value models
	// none.
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

// DefaultOpCost is the default per-op wire cost. A NIC's message rate and
// its bandwidth are two ceilings, not one sum: it fetches and executes the
// next WQEs while the DMA of earlier writes streams, so an op holds the wire
// for the longer of OpCost and Len/R. 10 ns is 100 million writes a second,
// which a 400 Gb/s NIC posts on one queue pair (it must post at least 25
// million: 2 KiB writes at 50 GB/s are 24.4 million a second); at R = 50
// GB/s it bounds only ops shorter than 500 bytes.
const DefaultOpCost = 10 * time.Nanosecond

// batchOps bounds the ops of one GPU operation of the NIC, batchBytes the
// bytes of one of small ops (the scatter kernel's) and ceBatchBytes those
// of one of large ops (the copy engines'), so that the operation's time
// stays within the lead; nicBatches is how many operations it has open or
// in flight. With a wire, a batch is due once the wire is within startLead
// of its first op: ops submitted meanwhile join it, so a NIC with a
// backlog on its wire starts few large operations, each with startLead to
// finish before the wire reaches its bytes. Without a wire, while the GPU
// is busy with the NIC's last operation, a batch is due once flushOps ops
// wait.
//
// A relayed Piece (SubmitPiece) is a batch of its own, whole: up to
// staging.MaxPlans writes and staging.SlotSize bytes, so batchOps and
// batchBytes are those.
const (
	batchOps     = staging.MaxPlans
	batchBytes   = staging.SlotSize
	ceBatchBytes = 8 * staging.SlotSize
	startLead    = 100 * time.Microsecond
	flushOps     = 128
	nicBatches   = 64
	nicStreams   = 2
)

// engine moves the NIC's batches, each as one GPU operation followed by a
// completion it can be asked about. One caller at a time starts batches;
// done may be asked meanwhile. Batch b's slot (its plan, its event) is
// reused only after done(b) reported it complete or start(b) failed.
type engine interface {
	start(b int, entries []cuda.BatchEntry) error
	done(b int) (bool, error)
	close() error
}

// batchState is where a batch is: filling, closed and waiting for a
// starter, being started, started on the GPU, or seen complete (or
// failed).
type batchState uint8

const (
	batchOpen batchState = iota
	batchReady
	batchStarting
	batchStarted
	batchDone
)

// NIC is an emulated RDMA NIC for machines without HCAs: a relay.Hop whose
// writes land in targets' device buffers (Targets) and whose timing follows
// a model of a NIC's wire. The ops it accepts become batches (of at most
// batchOps ops, batchBytes bytes of small ops or ceBatchBytes of large
// ones), each one GPU operation: the SM scatter
// kernel of pkg/gpu for batches of small ops (its plan uploaded once a
// batch), one batch copy on the copy engines for large ones. Each op holds
// the wire for the longer of OpCost and Len/RateGBps from when the wire is
// free (a NIC sends its queue in order); its completion is reported, in
// submission order, no earlier than that and no earlier than its batch's
// GPU operation. Reads fail. It emulates a NIC's timing for benchmarks and
// tests; it is not a transport.
//
// A real NIC's processor, not the host, executes the posted writes, so the
// NIC has a goroutine of its own that starts batches on the GPU (a few µs
// of driver calls each): Submit and Poll only queue ops, book the wire and
// collect completions. A Poll that finds a batch due while nothing else of
// the NIC's is in flight starts it itself, which saves a lone write the
// goroutine's wake-up.
type NIC struct {
	eng       engine
	scatterOn bool
	why       string
	targets   *Targets
	rate      float64
	psPerByte float64
	opCostPs  int64
	lead      int64
	depth     int
	// clock is the time in ns since the NIC's epoch.
	clock func() int64
	// wake asks for ready batches to be started; not called under mu.
	wake func()
	kick chan struct{}
	stop chan struct{}
	quit chan struct{}

	mu     sync.Mutex
	closed bool
	hint   int
	// tg is the target the last good op wrote to.
	tg nicTarget
	// wirePs is when (ps since the epoch) the emulated wire is next free.
	wirePs int64
	// holdLen and holdPs are the last op length paced and its wire time.
	holdLen uint64
	holdPs  int64
	// starting is set while a caller of startReady is in the engine.
	starting bool

	ops     []nicOp
	errs    []error
	opHead  int
	opTail  int
	opN     int
	batches [nicBatches]nicBatch
	bHead   int
	bN      int
	// untaken counts the batches at the ring's tail no starter has taken.
	untaken int
	// cur is the open batch, or -1.
	cur int
	// last is the batch started last, or -1.
	last int
	// launches counts the batches started.
	launches uint64
}

// nicOp is a queued op (or Piece); it holds no pointer, so that queuing
// one is a plain store. A failed op's error is in NIC.errs at its slot.
type nicOp struct {
	token  uint64
	finish int64
	batch  int32
	failed bool
}

type nicBatch struct {
	state batchState
	// sealed is a Piece's batch, which no other op joins.
	sealed  bool
	err     error
	ops     int
	bytes   uint64
	entries []cuda.BatchEntry
	// start is when (ns) the wire starts the batch's first op.
	start int64
}

var (
	_ relay.Hop      = (*NIC)(nil)
	_ relay.PieceHop = (*NIC)(nil)
)

// New creates a NIC over targets on g: its streams, completion events,
// copy op and, unless opts.Copy is gpu.GatherCE, the scatter kernel and its
// plan memory, in g's primary context, and its goroutine. A kernel that
// does not load leaves gpu.GatherAuto on the copy engines and fails
// gpu.GatherSM.
func New(g *gpu.GPU, targets *Targets, opts Options) (*NIC, error) {
	if opts.RateGBps < 0 {
		return nil, fmt.Errorf("gpunic: rate %g GB/s", opts.RateGBps)
	}
	eng, err := newGPUEngine(g, opts)
	if err != nil {
		return nil, err
	}
	epoch := time.Now()
	n := newNIC(eng, targets, opts, func() int64 { return time.Since(epoch).Nanoseconds() })
	n.scatterOn, n.why = eng.scatter.fn != 0, eng.scatter.why
	n.kick, n.stop, n.quit = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	n.wake = func() {
		select {
		case n.kick <- struct{}{}:
		default:
		}
	}
	go n.run()
	return n, nil
}

// newNIC is a NIC over eng whose clock is clock; it starts ready batches
// in the caller of Submit and Poll until New gives it a goroutine.
func newNIC(eng engine, targets *Targets, opts Options, clock func() int64) *NIC {
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
	n := &NIC{eng: eng, targets: targets, rate: opts.RateGBps, opCostPs: cost.Nanoseconds() * 1000, lead: startLead.Nanoseconds(),
		depth: depth, clock: clock, ops: make([]nicOp, depth), errs: make([]error, depth), cur: -1, last: -1}
	n.wake = n.startReady
	if n.rate > 0 {
		n.psPerByte = 1000 / n.rate
	}
	for i := range n.batches {
		n.batches[i].entries = make([]cuda.BatchEntry, 0, batchOps)
	}
	return n
}

// run is the NIC's goroutine: it starts ready batches when woken.
func (n *NIC) run() {
	defer close(n.quit)
	for {
		select {
		case <-n.kick:
			n.startReady()
		case <-n.stop:
			return
		}
	}
}

// Scatter reports whether batches of small ops go to the SM kernel, and
// why not where they do not.
func (n *NIC) Scatter() (bool, string) { return n.scatterOn, n.why }

// pace books an op of n bytes on the wire, which sends in submission order:
// the op starts when the wire is free, not before now, and holds it for the
// longer of the op cost and its bytes at R. It returns when the op starts
// and when it is through, in ns (rounded down and up); the wire itself is
// kept in ps, so that 2 KiB at 50 GB/s is 40.96 ns, not 40 or 41.
func (n *NIC) pace(now int64, bytes uint64) (start, finish int64) {
	if n.rate == 0 {
		return now, 0
	}
	if bytes != n.holdLen || n.holdPs == 0 {
		n.holdLen, n.holdPs = bytes, max(int64(math.Ceil(float64(bytes)*n.psPerByte)), n.opCostPs, 1)
	}
	s := max(now*1000, n.wirePs)
	n.wirePs = s + n.holdPs
	return s / 1000, (n.wirePs + 999) / 1000
}

// open opens a batch whose first op starts on the wire at start.
func (n *NIC) open(start int64) {
	n.cur = (n.bHead + n.bN) % nicBatches
	b := &n.batches[n.cur]
	b.state, b.sealed, b.err, b.ops, b.bytes, b.entries, b.start = batchOpen, false, nil, 0, 0, b.entries[:0], start
	n.bN++
	n.untaken++
}

// due reports whether the open batch should start now: with a wire, once
// the wire is within the lead of its first op; without, once flushOps ops
// wait or the GPU is done with the NIC's last operation.
func (n *NIC) due(now int64) bool {
	if n.rate > 0 {
		return n.batches[n.cur].start-now <= n.lead
	}
	return len(n.batches[n.cur].entries) >= flushOps || !n.busy()
}

// take hands the oldest batch no starter has taken to the caller, if it is
// ready or it is the open batch and due, and returns it, or -1.
func (n *NIC) take(now int64) int {
	if n.untaken == 0 {
		return -1
	}
	i := (n.bHead + n.bN - n.untaken) % nicBatches
	b := &n.batches[i]
	switch {
	case b.state == batchReady:
	case i == n.cur && n.due(now):
		n.cur = -1
	default:
		return -1
	}
	b.state = batchStarting
	n.untaken--
	return i
}

// startReady starts batches on the GPU, oldest first, while one is ready
// or the open one is due. One caller at a time does; a caller that finds
// another at it returns, and the other goes on to what is left.
func (n *NIC) startReady() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for !n.closed && !n.starting {
		i := n.take(n.clock())
		if i < 0 {
			return
		}
		n.starting = true
		entries := n.batches[i].entries
		n.mu.Unlock()
		err := n.eng.start(i, entries)
		n.mu.Lock()
		n.starting = false
		b := &n.batches[i]
		b.state = batchStarted
		if err != nil {
			b.state, b.err = batchDone, fmt.Errorf("gpunic: %w", err)
		}
		n.last = i
		n.launches++
	}
}

// Poll has a batch that is due started, and moves up to len(out)
// completions into out, in submission order.
func (n *NIC) Poll(out []relay.HopCompletion) int {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return 0
	}
	now := n.clock()
	if n.untaken > 0 && !n.starting {
		i := (n.bHead + n.bN - n.untaken) % nicBatches
		if n.batches[i].state == batchReady || (i == n.cur && n.due(now)) {
			// Nothing of this NIC's is on the GPU or waiting: a lone
			// write, which the goroutine's wake-up would only delay.
			inline := n.bN == n.untaken
			n.mu.Unlock()
			if inline {
				n.startReady()
			} else {
				n.wake()
			}
			n.mu.Lock()
		}
	}
	k := n.collect(out, now)
	n.mu.Unlock()
	return k
}

// collect moves the completions due at now into out.
func (n *NIC) collect(out []relay.HopCompletion, now int64) int {
	k := 0
	for k < len(out) && n.opN > 0 {
		o := &n.ops[n.opHead]
		if o.finish > now {
			break
		}
		var err error
		if o.failed {
			err, n.errs[n.opHead] = n.errs[n.opHead], nil
		}
		if o.batch >= 0 {
			b := &n.batches[o.batch]
			if b.state < batchStarted {
				break
			}
			if b.state == batchStarted {
				done, qerr := n.eng.done(int(o.batch))
				if qerr != nil {
					b.err = fmt.Errorf("gpunic: completion: %w", qerr)
				} else if !done {
					break
				}
				b.state = batchDone
			}
			if b.err != nil {
				err = b.err
			}
			if b.ops--; b.ops == 0 {
				n.bHead = (n.bHead + 1) % nicBatches
				n.bN--
			}
		}
		out[k] = relay.HopCompletion{Token: o.token, Err: err}
		k++
		*o = nicOp{}
		if n.opHead++; n.opHead == n.depth {
			n.opHead = 0
		}
		n.opN--
	}
	return k
}

// busy reports whether the GPU may still work on the NIC's batches: one is
// being started, or the last one started is not seen complete.
func (n *NIC) busy() bool {
	if n.starting {
		return true
	}
	if n.last < 0 {
		return false
	}
	b := &n.batches[n.last]
	if b.state != batchStarted {
		return false
	}
	done, err := n.eng.done(n.last)
	return err == nil && !done
}

// Close waits for the NIC's goroutine and GPU work and frees its streams,
// events and kernel. Ops not yet polled are dropped. It does not close the
// targets.
func (n *NIC) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	if n.stop != nil {
		close(n.stop)
		<-n.quit
	}
	// A Poll's own start may still be in the engine.
	n.mu.Lock()
	for n.starting {
		n.mu.Unlock()
		runtime.Gosched()
		n.mu.Lock()
	}
	n.mu.Unlock()
	return n.eng.close()
}
