// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

var (
	// ErrClosed is returned by Copy after Close.
	ErrClosed = errors.New("gpu: copier closed")
	// ErrLaneFull is returned by Copy on the CPU-doorbell path when a lane
	// stream already holds PendingDepth doorbells that Poll has not rung.
	ErrLaneFull = errors.New("gpu: lane doorbell queue full")
	// ErrNotDrained is returned by Close when work it gave the GPU did not
	// finish within CopierOptions.DrainTimeout.
	ErrNotDrained = errors.New("gpu: copier work did not finish")
)

// DefaultDrainTimeout is how long Close waits for the GPU to finish the
// work the copier gave it.
const DefaultDrainTimeout = 5 * time.Second

// StreamsPerLane is the number of streams each lane alternates its Pieces
// over: a doorbell's memory barrier serializes one stream, so two keep the
// copy engines busy (see docs/cuda.md).
const StreamsPerLane = 2

// PendingDepth is the most CPU doorbells one lane stream holds: twice the
// ring depth, so an engine that respects credit never sees ErrLaneFull.
const PendingDepth = 2 * staging.SlotsPerLane

// initialReadyEvents is the size of the source-ready event pool at start.
const initialReadyEvents = 256

// DoorbellMode chooses how a Piece's doorbell is rung.
type DoorbellMode int

const (
	// DoorbellAuto probes cuStreamWriteValue64 at start and uses it when a
	// test write lands, the CPU path otherwise.
	DoorbellAuto DoorbellMode = iota
	// DoorbellGPU requires the GPU path: cuStreamWriteValue64 on the lane
	// stream, after the copies, into the host-mapped ready word.
	DoorbellGPU
	// DoorbellCPU records an event after the copies; Poll stores the seq
	// once the event has completed.
	DoorbellCPU
)

// CopyPolicy chooses how a Piece's entries are submitted.
type CopyPolicy int

const (
	// CopyAuto uses the driver's batch copy (the 13.0 form on 13.x drivers,
	// the 12.8 form on 12.8–12.x) when a start-up copy through it works, and
	// one cuMemcpyAsync per entry otherwise.
	CopyAuto CopyPolicy = iota
	// CopyPerEntry forces one cuMemcpyAsync per entry.
	CopyPerEntry
	// CopyBatch13 forces the 8-argument cuMemcpyBatchAsync of CUDA 13.0.
	CopyBatch13
	// CopyBatch12 forces the 9-argument cuMemcpyBatchAsync of CUDA 12.8.
	CopyBatch12
)

// CopierOptions configures a Copier. The zero value probes everything.
type CopierOptions struct {
	Doorbell DoorbellMode
	Copy     CopyPolicy
	// Gather chooses between copy engines and the SM gather kernel
	// (ParseGatherMode of engineconfig.Config.CopyMode). GatherAuto with a forced
	// Copy form means the copy engines.
	Gather GatherMode
	// GatherPTX replaces the embedded kernel (kernel development only).
	GatherPTX []byte
	// NoInlinePlan uploads every gather plan, small ones too, instead of
	// passing a plan of up to cuda.InlineEntries entries as the kernel's
	// parameter (measurements).
	NoInlinePlan bool
	// GatherThreshold replaces GatherThreshold for GatherAuto.
	GatherThreshold uint64
	// GatherStreams is 1 (every SM Piece of a lane on one stream, up to
	// GatherMaxBlocks blocks a launch) or 2 (SM Pieces alternate over the
	// lane's two streams like copy-engine Pieces, at most
	// GatherMaxBlocks/2 blocks a launch, so two launches in flight still
	// hold at most GatherMaxBlocks SMs); zero means DefaultGatherStreams.
	GatherStreams int
	// GatherBlocks and GatherThreads replace the launch shape; zero keeps
	// the default.
	GatherBlocks, GatherThreads int
	// PollSpin and PollNap replace the fields of relay.DefaultPollPolicy
	// for the pump (relay.PollTuner); zero keeps the default, negative
	// means none.
	PollSpin, PollNap time.Duration
	// DrainTimeout bounds how long Close waits for the GPU to finish what
	// the copier gave it; zero means DefaultDrainTimeout.
	DrainTimeout time.Duration
	// Logger receives the copier's one start-up line; klog by default.
	Logger klog.Logger
}

// DefaultPollPolicy is the pump's poll policy on GPUs (relay.PollTuner).
// A single Piece's next step (its doorbell, its second hop, its
// completion) comes within a few hundred microseconds, and a pump woken
// from a nap is up to a nap late: while at most one Piece moves the pump
// polls through Spin. A deeper pipeline naps for Nap. See docs/engine.md
// for the measured trade-off.
var DefaultPollPolicy = relay.PollPolicy{Spin: 250 * time.Microsecond, Nap: 50 * time.Microsecond}

// Copier is a relay.Copier over CUDA copy engines and, for Pieces of small
// entries, the SM gather kernel (GatherMode). Each lane has two non-blocking
// streams in the GPU's primary context, and its Pieces alternate between
// them. Everything a Piece needs (streams, batch arrays,
// doorbell events) is allocated in NewCopier; Copy and Poll allocate
// nothing.
//
// The engine must:
//   - call BindThread once on the pump's locked OS thread before the first
//     Copy (every call also makes the context current if it is not);
//   - call RegisterHost for each claimed lane's sender block before Copy
//     rings a doorbell in it, and its unregister function only once
//     Drained reports the copier lane drained (or after Close): a
//     doorbell in the word, which the relay can write too, is no proof;
//   - call Poll every pump round: on the CPU-doorbell path it is what rings
//     the doorbells (on the GPU path it returns at once).
type Copier struct {
	g        *GPU
	log      klog.Logger
	mode     cuda.CopyMode
	gpuBell  bool
	bellWhy  string
	memOpsV1 int

	ready  readyPool
	hosts  hostMap
	lanes  [staging.LaneCount]lane
	gather gatherState
	poll   relay.PollPolicy

	pending  atomic.Int64
	copies   atomic.Uint64
	bytes    atomic.Uint64
	smPieces atomic.Uint64
	// partPieces counts the SM Pieces copied in parts with their part
	// words signalled.
	partPieces atomic.Uint64

	drainTimeout time.Duration
	closeMu      sync.Mutex
	closed       atomic.Bool
	// wedged lists the lanes whose streams had not finished when Close
	// gave up on them, and notDrained is the error Close returned then;
	// both are written by Close, under closeMu. A wedged
	// copier keeps every stream, registration and plan buffer until the
	// process exits: the GPU may still write them.
	wedged     [staging.LaneCount]bool
	notDrained error
}

type lane struct {
	mu      sync.Mutex
	next    int
	streams [StreamsPerLane]laneStream
	// fences are recorded on the lane's streams by Drained, one a stream,
	// behind every Piece enqueued before; fenced says they are, and
	// unfenced that a Piece was enqueued since (GPU-doorbell path).
	fences   [StreamsPerLane]cuda.Event
	fenced   bool
	unfenced bool
}

type laneStream struct {
	s     cuda.Stream
	op    *cuda.CopyOp
	piece cuda.Piece
	// cuts holds the byte ends of a Piece's parts for piece.Gather.Cuts.
	cuts [cuda.MaxParts]uint64

	// The CPU-doorbell ring: events[i] completes when bells[i] may ring.
	events [PendingDepth]cuda.Event
	bells  [PendingDepth]bell
	head   int
	n      int
}

type bell struct {
	word *uint64
	seq  uint64
}

var (
	_ relay.Copier        = (*Copier)(nil)
	_ relay.ThreadBinder  = (*Copier)(nil)
	_ relay.HostRegistrar = (*Copier)(nil)
	_ relay.CopyPoller    = (*Copier)(nil)
	_ relay.PollTuner     = (*Copier)(nil)
	_ relay.CopyDrainer   = (*Copier)(nil)
)

// relay.CopyEntry and cuda.BatchEntry share a layout, so Copy passes the
// engine's entries to the driver without copying them.
var (
	_ [unsafe.Sizeof(relay.CopyEntry{}) - unsafe.Sizeof(cuda.BatchEntry{})]struct{}
	_ [unsafe.Sizeof(cuda.BatchEntry{}) - unsafe.Sizeof(relay.CopyEntry{})]struct{}
	_ [unsafe.Offsetof(relay.CopyEntry{}.Dst) - unsafe.Offsetof(cuda.BatchEntry{}.Dst)]struct{}
	_ [unsafe.Offsetof(cuda.BatchEntry{}.Dst) - unsafe.Offsetof(relay.CopyEntry{}.Dst)]struct{}
	_ [unsafe.Offsetof(relay.CopyEntry{}.Len) - unsafe.Offsetof(cuda.BatchEntry{}.Len)]struct{}
	_ [unsafe.Offsetof(cuda.BatchEntry{}.Len) - unsafe.Offsetof(relay.CopyEntry{}.Len)]struct{}
)

// NewCopier creates the lanes' streams and pools on g, chooses the copy
// form and the doorbell path (probing both unless forced), and logs the
// choice once.
func NewCopier(g *GPU, opts CopierOptions) (*Copier, error) {
	c := &Copier{g: g, log: opts.Logger, poll: DefaultPollPolicy, drainTimeout: opts.DrainTimeout}
	if c.drainTimeout <= 0 {
		c.drainTimeout = DefaultDrainTimeout
	}
	if c.log.GetSink() == nil {
		c.log = klog.Background()
	}
	for _, o := range []struct {
		set time.Duration
		to  *time.Duration
	}{{opts.PollSpin, &c.poll.Spin}, {opts.PollNap, &c.poll.Nap}} {
		if o.set != 0 {
			*o.to = max(o.set, 0)
		}
	}
	c.ready.g = g
	d := g.d
	err := g.Do(func() error {
		for i := range c.lanes {
			for si := range c.lanes[i].streams {
				st := &c.lanes[i].streams[si]
				var err error
				if st.s, err = d.StreamCreate(cuda.StreamNonBlocking); err != nil {
					return err
				}
				if st.op, err = d.NewCopyOp(staging.MaxPlans); err != nil {
					return err
				}
				if c.lanes[i].fences[si], err = d.EventCreate(cuda.EventDisableTiming); err != nil {
					return err
				}
			}
		}
		if err := c.ready.grow(initialReadyEvents); err != nil {
			return err
		}
		if err := c.chooseCopy(opts.Copy); err != nil {
			return err
		}
		if err := c.chooseDoorbell(opts.Doorbell); err != nil {
			return err
		}
		if err := c.setupGather(opts); err != nil {
			return err
		}
		if c.gpuBell {
			return nil
		}
		for i := range c.lanes {
			for si := range c.lanes[i].streams {
				st := &c.lanes[i].streams[si]
				for k := range st.events {
					var err error
					if st.events[k], err = d.EventCreate(cuda.EventDisableTiming); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		c.g.Do(c.destroy)
		return nil, fmt.Errorf("gpu copier on device %d: %w", g.ordinal, err)
	}
	c.log.Info("pxn gpu copier ready", "device", g.ordinal, "driver", d.Version(),
		"copy", c.mode.String(), "doorbell", c.Doorbell(), "reason", c.bellWhy,
		"canUseStreamMemOpsV1", c.memOpsV1, "lanes", staging.LaneCount, "streamsPerLane", StreamsPerLane,
		"gather", c.gather.mode.String(), "gatherThreshold", c.gather.threshold, "gatherGrid", c.gather.grid,
		"gatherBlock", c.gather.block, "gatherStreams", c.gather.streams, "gatherReason", c.gather.why)
	return c, nil
}

// RegisterHost registers [ptr, ptr+n) (widened to whole pages) with
// cuMemHostRegister(DEVICEMAP|PORTABLE), so that the lane streams can ring
// doorbells in it. The engine calls it once per lane it attaches, for the
// lane's sender block (staging.SenderLane.Words), the only memory of the
// relay's that holds doorbells; unregister must wait until no doorbell
// into the range is pending. On the CPU-doorbell path nothing is registered.
func (c *Copier) RegisterHost(ptr uintptr, n uint64) (unregister func() error, err error) {
	if !c.gpuBell {
		return func() error { return nil }, nil
	}
	if ptr == 0 || n == 0 {
		return nil, fmt.Errorf("gpu: register host range %#x+%d", ptr, n)
	}
	page := uintptr(unix.Getpagesize())
	start := ptr &^ (page - 1)
	end := (ptr + uintptr(n) + page - 1) &^ (page - 1)
	size := uint64(end - start)
	d := c.g.d
	var dp cuda.DevicePtr
	err = c.g.Do(func() error {
		if err := d.MemHostRegister(start, size, cuda.HostRegisterDeviceMap|cuda.HostRegisterPortable); err != nil {
			return err
		}
		var err error
		if dp, err = d.MemHostGetDevicePointer(start); err != nil {
			return errors.Join(err, d.MemHostUnregister(start))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gpu: register host range %#x+%d: %w", ptr, n, err)
	}
	if err := c.hosts.add(hostRange{host: start, size: size, dev: dp}); err != nil {
		return nil, errors.Join(err, c.g.Do(func() error { return d.MemHostUnregister(start) }))
	}
	var once sync.Once
	return func() error {
		if err := c.keepWedged(); err != nil {
			return fmt.Errorf("gpu: host range %#x+%d stays registered: %w", start, size, err)
		}
		var err error
		once.Do(func() {
			if c.hosts.remove(start) {
				err = c.g.Do(func() error { return d.MemHostUnregister(start) })
			}
		})
		return err
	}, nil
}

// Classify reports relay.Device when [addr, addr+n) lies in one device
// allocation (cuPointerGetAttribute MEMORY_TYPE and range); host memory,
// registered or not, is relay.Host. It runs on the caller's thread and
// leaves that thread's context as it found it.
func (c *Copier) Classify(addr uintptr, n uint64) relay.Kind {
	if c.g.d.Classify(c.g.ctx, cuda.DevicePtr(addr), n) == cuda.MemoryDevice {
		return relay.Device
	}
	return relay.Host
}

var _ relay.RangeClassifier = (*Copier)(nil)

// ClassifyRange is Classify and, for device memory, the allocation holding
// addr..addr+n (relay.RangeClassifier).
func (c *Copier) ClassifyRange(addr uintptr, n uint64) (relay.Kind, uintptr, uint64) {
	if t, start, size := c.g.d.ClassifyRange(c.g.ctx, cuda.DevicePtr(addr), n); t == cuda.MemoryDevice {
		return relay.Device, uintptr(start), size
	}
	return relay.Host, 0, 0
}

// RecordReady records a pooled event on the caller's stream. Stream 0 is
// the legacy default stream (CU_STREAM_LEGACY), which waits for all prior
// work of every blocking stream of the context, the per-thread default
// streams included; a caller working on a non-blocking stream passes it.
// The stream must belong to the GPU's primary context.
func (c *Copier) RecordReady(stream uintptr) (relay.Event, error) {
	ev, cev, err := c.ready.get()
	if err != nil {
		return 0, err
	}
	if err := c.g.d.RecordEvent(c.g.ctx, cev, cuda.Stream(stream)); err != nil {
		c.ready.put(ev)
		return 0, fmt.Errorf("gpu: source-ready event on stream %#x: %w", stream, err)
	}
	return ev, nil
}

// Query reports whether ev has completed (cuEventQuery). Event 0 is always
// complete.
func (c *Copier) Query(ev relay.Event) (bool, error) {
	if ev == 0 {
		return true, nil
	}
	cev, ok := c.ready.lookup(ev)
	if !ok {
		return false, fmt.Errorf("%w: %#x", ErrUnknownEvent, uint64(ev))
	}
	return c.g.d.QueryEvent(c.g.ctx, cev)
}

// Release returns ev to the pool.
func (c *Copier) Release(ev relay.Event) { c.ready.put(ev) }

// CopierStats are a Copier's counters.
type CopierStats struct {
	// Copies and Bytes count Pieces whose Copy succeeded; SMPieces those
	// of them the gather kernel moved, PartPieces those of them it moved
	// in parts with part words (CopyParts).
	Copies     uint64
	Bytes      uint64
	SMPieces   uint64
	PartPieces uint64
	// PendingDoorbells are CPU doorbells Poll has not rung yet.
	PendingDoorbells int
	// LiveReadyEvents are source-ready events not yet released.
	LiveReadyEvents int
	// HostRanges are registered host ranges.
	HostRanges int
}

// Stats returns the copier's counters.
func (c *Copier) Stats() CopierStats {
	return CopierStats{
		Copies:           c.copies.Load(),
		Bytes:            c.bytes.Load(),
		SMPieces:         c.smPieces.Load(),
		PartPieces:       c.partPieces.Load(),
		PendingDoorbells: int(c.pending.Load()),
		LiveReadyEvents:  c.ready.live(),
		HostRanges:       len(c.hosts.all()),
	}
}

// Close waits, up to the drain timeout, for every enqueued Piece and plan
// upload (an event recorded behind each lane and upload stream, polled:
// this is the one place the copier blocks on the GPU), rings the CPU
// doorbells that are left, and frees the streams, events and host
// registrations. A stream that does not finish in time (a source-ready
// event that never completes, a kernel that never ends) may still write
// everything the copier was given, so Close then frees nothing: it logs
// once, keeps the streams, the registrations and the plan memory until the
// process exits, reports its lanes undrained (Drained) and returns an
// error wrapping ErrNotDrained that names them.
func (c *Copier) Close() error {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.closed.Swap(true) {
		return c.notDrained
	}
	return c.g.Do(func() error {
		stuck, err := c.awaitStreams()
		if err != nil || len(stuck) > 0 {
			names := make([]string, len(stuck))
			for i, s := range stuck {
				names[i] = s.String()
				c.wedged[s.lane] = true
			}
			c.notDrained = fmt.Errorf("%w within %v on device %d: %s", ErrNotDrained, c.drainTimeout, c.g.ordinal, strings.Join(names, ", "))
			if err != nil {
				c.notDrained = errors.Join(c.notDrained, err)
				for i := range c.wedged {
					c.wedged[i] = true
				}
			}
			c.log.Error(c.notDrained, "pxn gpu copier: leaving its streams, host registrations and plan memory in place until the process exits; the GPU may still write them",
				"device", c.g.ordinal, "streams", names, "hostRanges", len(c.hosts.all()))
			return c.notDrained
		}
		var errs []error
		for i := range c.lanes {
			for si := range c.lanes[i].streams {
				if s := c.lanes[i].streams[si].s; s != 0 {
					if err := c.g.d.StreamSynchronize(s); err != nil {
						errs = append(errs, err)
					}
				}
			}
		}
		if _, err := c.Poll(); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, c.destroy())
		return errors.Join(errs...)
	})
}

// copierStream names one of the copier's streams in Close's error.
type copierStream struct {
	lane   int
	stream int
	upload bool
}

func (s copierStream) String() string {
	if s.upload {
		return fmt.Sprintf("lane %d plan upload stream", s.lane)
	}
	return fmt.Sprintf("lane %d stream %d", s.lane, s.stream)
}

// awaitStreams records an event behind the work of every lane and upload
// stream and polls them until all have completed or the drain timeout
// passes; it returns the streams that had not finished. An error (an event
// that could not be made, recorded or queried) leaves nothing proven
// drained. The context is current and closeMu held.
func (c *Copier) awaitStreams() ([]copierStream, error) {
	d := c.g.d
	type waiting struct {
		s  copierStream
		ev cuda.Event
	}
	var ws []waiting
	var made []cuda.Event
	defer func() {
		for _, ev := range made {
			d.EventDestroy(ev)
		}
	}()
	for i := range c.lanes {
		for si := range c.lanes[i].streams {
			st, ev := c.lanes[i].streams[si].s, c.lanes[i].fences[si]
			if st == 0 || ev == 0 {
				continue
			}
			if err := d.EventRecord(ev, st); err != nil {
				return nil, fmt.Errorf("fence on lane %d stream %d: %w", i, si, err)
			}
			ws = append(ws, waiting{copierStream{lane: i, stream: si}, ev})
		}
		if up := c.gather.uploads[i]; up != 0 {
			ev, err := d.EventCreate(cuda.EventDisableTiming)
			if err != nil {
				return nil, fmt.Errorf("fence for lane %d plan uploads: %w", i, err)
			}
			made = append(made, ev)
			if err := d.EventRecord(ev, up); err != nil {
				return nil, fmt.Errorf("fence on lane %d plan upload stream: %w", i, err)
			}
			ws = append(ws, waiting{copierStream{lane: i, upload: true}, ev})
		}
	}
	deadline := time.Now().Add(c.drainTimeout)
	nap := 50 * time.Microsecond
	for {
		left := ws[:0]
		for _, w := range ws {
			done, err := d.EventQuery(w.ev)
			if err != nil {
				return nil, fmt.Errorf("fence on %s: %w", w.s, err)
			}
			if !done {
				left = append(left, w)
			}
		}
		ws = left
		if len(ws) == 0 {
			return nil, nil
		}
		if !time.Now().Before(deadline) {
			stuck := make([]copierStream, len(ws))
			for i, w := range ws {
				stuck[i] = w.s
			}
			return stuck, nil
		}
		time.Sleep(min(nap, time.Until(deadline)))
		nap = min(2*nap, 10*time.Millisecond)
	}
}

// keepWedged returns the error of a Close that gave up on the GPU: nothing
// the copier was given may be released then.
func (c *Copier) keepWedged() error {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	return c.notDrained
}

// destroy frees what NewCopier made; the context is current.
func (c *Copier) destroy() error {
	d := c.g.d
	var errs []error
	for i := range c.lanes {
		for si := range c.lanes[i].streams {
			st := &c.lanes[i].streams[si]
			if ev := c.lanes[i].fences[si]; ev != 0 {
				errs = append(errs, d.EventDestroy(ev))
				c.lanes[i].fences[si] = 0
			}
			for k, ev := range st.events {
				if ev != 0 {
					errs = append(errs, d.EventDestroy(ev))
					st.events[k] = 0
				}
			}
			if st.op != nil {
				st.op.Free()
				st.op = nil
			}
			if st.s != 0 {
				errs = append(errs, d.StreamDestroy(st.s))
				st.s = 0
			}
		}
	}
	errs = append(errs, c.ready.destroy())
	errs = append(errs, c.freeGather())
	if left := c.hosts.all(); len(left) > 0 {
		c.log.Info("pxn gpu copier: unregistering host ranges the engine left registered", "ranges", len(left))
		for _, r := range left {
			c.hosts.remove(r.host)
			errs = append(errs, d.MemHostUnregister(r.host))
		}
	}
	return errors.Join(errs...)
}
