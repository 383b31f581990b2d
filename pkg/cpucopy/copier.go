// SPDX-License-Identifier: Apache-2.0

package cpucopy

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/memrange"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

var (
	// ErrLaneFull is returned by HostCopier.Copy when a lane already holds
	// LaneQueueDepth copies that have not rung their doorbell.
	ErrLaneFull = errors.New("cpucopy: lane copy queue full")
	// ErrUnknownEvent is returned for an event that the copier did not
	// record or that has been released.
	ErrUnknownEvent = errors.New("cpucopy: unknown event")
)

// LaneQueueDepth is the most copies one lane holds: twice the ring depth, so
// an engine that respects credit never sees ErrLaneFull.
const LaneQueueDepth = 2 * staging.SlotsPerLane

// HostCopierStats are a HostCopier's counters.
type HostCopierStats struct {
	// Copies is the number of Copy calls whose doorbell has been rung.
	Copies uint64
	// Bytes is the number of bytes those copies moved.
	Bytes uint64
	// Abandoned counts copies dropped by Close because their ready event
	// was still held.
	Abandoned uint64
	// Parts counts the part words stored by CopyParts (every part but
	// the last of each Piece).
	Parts uint64
	// LiveEvents is the number of recorded events not yet released.
	LiveEvents int
	// Lanes is the number of lane workers started.
	Lanes int
}

// HostCopier is a relay.Copier over host memory. Each lane is a worker
// goroutine, started on the lane's first Copy, that behaves like a CUDA
// stream: copies run one after another in submission order, each after its
// ready event, and each ends with the doorbell store. Memory registered with
// RegisterDevice classifies as relay.Device; all other memory is relay.Host.
type HostCopier struct {
	// hooks is nil in production.
	hooks *hooks

	devMu sync.RWMutex
	dev   memrange.Spans

	evMu   sync.Mutex
	lastEv relay.Event
	// events maps each live event to its gate, nil for an event complete
	// at birth; held maps the events that a test's hooks hold. gates
	// are the gates that nothing refers to any more, for reuse.
	events map[relay.Event]*readyGate
	held   map[relay.Event]*readyGate
	gates  []*readyGate

	laneMu  sync.Mutex
	closed  bool
	closing chan struct{}
	lanes   [staging.LaneCount]*hostLane
	workers sync.WaitGroup
	// handed and finished count each lane's copies: handed when enqueued,
	// finished once the lane's worker has made its last write or dropped
	// it (Drained).
	handed, finished [staging.LaneCount]atomic.Uint64

	copies    atomic.Uint64
	bytes     atomic.Uint64
	abandoned atomic.Uint64
	parts     atomic.Uint64
}

type hostLane struct {
	jobs chan copyJob
	// free holds one entry buffer per job the lane may hold; an empty free
	// list is a full lane.
	free chan []relay.CopyEntry
	// wake is nudged whenever a gate opens, so that the lane, if it waits
	// on that gate, looks again.
	wake chan struct{}
}

type copyJob struct {
	// ready is the gate to wait on, or nil.
	ready    *readyGate
	entries  []relay.CopyEntry
	doorbell *uint64
	seq      uint64
	// partEnds are the entry ends of every part but the last, nparts-1 of
	// them; words the part words their ends are signalled in (CopyParts).
	partEnds [staging.MaxParts - 1]uint32
	nparts   int
	words    *[staging.MaxParts - 1]uint64
}

// readyGate is what the copies behind a held event wait on. A closed channel
// cannot be reopened, so gates, unlike channels, are reused: recording a held
// event allocates nothing once the copier has as many gates as events in
// use. A gate is reused when nothing refers to it: not the events table, not
// the held table, not a copy still waiting on it.
type readyGate struct {
	open atomic.Bool
	// refs is guarded by HostCopier.evMu.
	refs int
}

var (
	_ relay.Copier          = (*HostCopier)(nil)
	_ relay.RangeClassifier = (*HostCopier)(nil)
	_ relay.CopyDrainer     = (*HostCopier)(nil)
)

// NewHostCopier returns a copier whose source-ready events are complete at
// once. It starts no goroutine until the first Copy.
func NewHostCopier() *HostCopier { return newHostCopier(nil) }

func newHostCopier(h *hooks) *HostCopier {
	c := &HostCopier{
		hooks:   h,
		events:  make(map[relay.Event]*readyGate),
		held:    make(map[relay.Event]*readyGate),
		closing: make(chan struct{}),
	}
	if h != nil && h.ready != nil {
		h.ready.Attach(c.releaseReady)
	}
	return c
}

// RegisterDevice marks [addr, addr+n) as simulated device memory.
func (c *HostCopier) RegisterDevice(addr uintptr, n uint64) error {
	if !memrange.ValidRange(uint64(addr), n) {
		return fmt.Errorf("cpucopy: invalid device range %#x+%d", addr, n)
	}
	c.devMu.Lock()
	defer c.devMu.Unlock()
	if c.dev.Overlaps(uint64(addr), n) {
		return fmt.Errorf("cpucopy: device range %#x+%d overlaps a registered range", addr, n)
	}
	c.dev = c.dev.Insert(memrange.Span{Start: uint64(addr), Size: n})
	return nil
}

// Classify reports relay.Device when [addr, addr+n) lies entirely in one
// registered device range, and relay.Host otherwise.
func (c *HostCopier) Classify(addr uintptr, n uint64) relay.Kind {
	c.devMu.RLock()
	i := c.dev.Find(uint64(addr), n)
	c.devMu.RUnlock()
	if i < 0 {
		return relay.Host
	}
	return relay.Device
}

// ClassifyRange is Classify and, for Device, the registered range holding
// addr..addr+n (relay.RangeClassifier), so that Submit asks once for the
// blocks of one registered pool.
func (c *HostCopier) ClassifyRange(addr uintptr, n uint64) (relay.Kind, uintptr, uint64) {
	c.devMu.RLock()
	defer c.devMu.RUnlock()
	i := c.dev.Find(uint64(addr), n)
	if i < 0 {
		return relay.Host, 0, 0
	}
	return relay.Device, uintptr(c.dev[i].Start), c.dev[i].Size
}

// RecordReady returns a new source-ready event. It is complete at once unless
// a test's hooks hold it. The stream is not interpreted.
func (c *HostCopier) RecordReady(stream uintptr) (relay.Event, error) {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	c.lastEv++
	ev := c.lastEv
	if h := c.hooks; h != nil && h.ready != nil && h.ready.Hold(ev) {
		g := c.newGate()
		c.events[ev] = g
		c.held[ev] = g
	} else {
		c.events[ev] = nil
	}
	return ev, nil
}

// newGate returns a gate, not open, referred to twice: by the events and the
// held tables. c.evMu is held.
func (c *HostCopier) newGate() *readyGate {
	var g *readyGate
	if n := len(c.gates); n > 0 {
		g = c.gates[n-1]
		c.gates[n-1] = nil
		c.gates = c.gates[:n-1]
	} else {
		g = new(readyGate)
	}
	g.open.Store(false)
	g.refs = 2
	return g
}

// unref drops a reference to g, keeping g for reuse once it has none.
// c.evMu is held.
func (c *HostCopier) unref(g *readyGate) {
	g.refs--
	if g.refs == 0 {
		c.gates = append(c.gates, g)
	}
}

// dropGate is unref for a caller that does not hold c.evMu.
func (c *HostCopier) dropGate(g *readyGate) {
	c.evMu.Lock()
	c.unref(g)
	c.evMu.Unlock()
}

// Query reports whether ev has completed. Event 0 is always complete.
func (c *HostCopier) Query(ev relay.Event) (bool, error) {
	if ev == 0 {
		return true, nil
	}
	c.evMu.Lock()
	g, ok := c.events[ev]
	done := g == nil || g.open.Load()
	c.evMu.Unlock()
	if !ok {
		return false, fmt.Errorf("%w: %d", ErrUnknownEvent, ev)
	}
	return done, nil
}

// Release forgets ev. A Copy already enqueued behind ev still waits for it,
// and a held event stays releasable by the hooks that hold it.
func (c *HostCopier) Release(ev relay.Event) {
	c.evMu.Lock()
	if g, ok := c.events[ev]; ok {
		delete(c.events, ev)
		if g != nil {
			c.unref(g)
		}
	}
	c.evMu.Unlock()
}

// releaseReady completes a held source-ready event; the hooks' ReadyHolder
// calls it.
func (c *HostCopier) releaseReady(ev relay.Event) error {
	c.evMu.Lock()
	g, ok := c.held[ev]
	if ok {
		delete(c.held, ev)
		g.open.Store(true)
		c.unref(g)
	}
	c.evMu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %d is not held", ErrUnknownEvent, ev)
	}
	c.wakeLanes()
	return nil
}

// wakeLanes nudges every lane after a gate opened.
func (c *HostCopier) wakeLanes() {
	c.laneMu.Lock()
	for _, l := range c.lanes {
		if l == nil {
			continue
		}
		select {
		case l.wake <- struct{}{}:
		default:
			// A nudge is already pending.
		}
	}
	c.laneMu.Unlock()
}

// Copy enqueues, on lane, a wait for ready, the copies of entries in order,
// and the store of seq at doorbell. It never blocks. The entries are copied
// before Copy returns; the memory they name must stay mapped until the
// doorbell shows seq.
func (c *HostCopier) Copy(lane int, ready relay.Event, entries []relay.CopyEntry, doorbell *uint64, seq uint64) error {
	return c.copyIn(lane, ready, entries, nil, doorbell, nil, seq)
}

// CopyParts is Copy for a Piece in parts (relay.PartCopier): once the
// entries before partEnds[p] are copied, seq is release-stored into
// words[p], while the lane goes on with the next part.
func (c *HostCopier) CopyParts(lane int, ready relay.Event, entries []relay.CopyEntry, partEnds []uint32, doorbell *uint64, words *[staging.MaxParts - 1]uint64, seq uint64) error {
	if words == nil {
		return fmt.Errorf("cpucopy: lane %d seq %d: nil part words", lane, seq)
	}
	if err := staging.CheckPartEnds(partEnds, len(entries)); err != nil {
		return fmt.Errorf("cpucopy: lane %d seq %d: %d entries: %w", lane, seq, len(entries), err)
	}
	return c.copyIn(lane, ready, entries, partEnds, doorbell, words, seq)
}

func (c *HostCopier) copyIn(lane int, ready relay.Event, entries []relay.CopyEntry, partEnds []uint32, doorbell *uint64, words *[staging.MaxParts - 1]uint64, seq uint64) error {
	if lane < 0 || lane >= staging.LaneCount {
		return fmt.Errorf("cpucopy: lane %d out of range [0, %d)", lane, staging.LaneCount)
	}
	if doorbell == nil {
		return fmt.Errorf("cpucopy: lane %d seq %d: nil doorbell", lane, seq)
	}
	if a := uintptr(unsafe.Pointer(doorbell)); a%8 != 0 {
		return fmt.Errorf("cpucopy: lane %d seq %d: doorbell %#x is not 8-byte aligned", lane, seq, a)
	}
	for i, e := range entries {
		if e.Len == 0 {
			continue
		}
		if e.Src == 0 || e.Dst == 0 || !memrange.ValidRange(uint64(e.Src), e.Len) || !memrange.ValidRange(uint64(e.Dst), e.Len) {
			return fmt.Errorf("cpucopy: lane %d seq %d: entry %d (src %#x dst %#x len %d) is not addressable", lane, seq, i, e.Src, e.Dst, e.Len)
		}
	}
	var wait *readyGate
	if ready != 0 {
		c.evMu.Lock()
		g, ok := c.events[ready]
		if ok && g != nil && !g.open.Load() {
			// The job's reference, dropped by the lane after the wait.
			g.refs++
			wait = g
		}
		c.evMu.Unlock()
		if !ok {
			return fmt.Errorf("cpucopy: lane %d seq %d: %w: %d", lane, seq, ErrUnknownEvent, ready)
		}
	}
	job := copyJob{ready: wait, doorbell: doorbell, seq: seq, nparts: len(partEnds) + 1, words: words}
	copy(job.partEnds[:], partEnds)
	if err := c.enqueue(lane, job, entries); err != nil {
		if wait != nil {
			c.dropGate(wait)
		}
		return err
	}
	return nil
}

// enqueue hands a checked copy to its lane, starting the lane if need be.
func (c *HostCopier) enqueue(lane int, job copyJob, entries []relay.CopyEntry) error {
	seq := job.seq
	c.laneMu.Lock()
	defer c.laneMu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if h := c.hooks; h != nil && h.faults != nil {
		if err := h.faults.CopyFault(lane); err != nil {
			return err
		}
	}
	l := c.lanes[lane]
	if l == nil {
		l = &hostLane{
			jobs: make(chan copyJob, LaneQueueDepth),
			free: make(chan []relay.CopyEntry, LaneQueueDepth),
			wake: make(chan struct{}, 1),
		}
		for range LaneQueueDepth {
			l.free <- nil
		}
		c.lanes[lane] = l
		c.workers.Add(1)
		if h := c.hooks; h != nil && h.goStarted != nil {
			h.goStarted()
		}
		go c.runLane(l, &c.finished[lane])
	}
	var buf []relay.CopyEntry
	select {
	case buf = <-l.free:
	default:
		return fmt.Errorf("%w: lane %d seq %d: %d copies outstanding", ErrLaneFull, lane, seq, LaneQueueDepth)
	}
	job.entries = append(buf[:0], entries...)
	c.handed[lane].Add(1)
	l.jobs <- job
	return nil
}

// runLane is a lane's worker; finished counts the jobs it is done with.
func (c *HostCopier) runLane(l *hostLane, finished *atomic.Uint64) {
	defer c.workers.Done()
	abandon := false
	for job := range l.jobs {
		if job.ready != nil {
			if !abandon && !c.await(l, job.ready) {
				abandon = true
			}
			c.dropGate(job.ready)
		}
		if abandon {
			// A stream never runs past a wait that cannot end.
			c.abandoned.Add(1)
			l.free <- job.entries
			finished.Add(1)
			continue
		}
		var n uint64
		p := 0
		for i, e := range job.entries {
			if p < job.nparts-1 && i == int(job.partEnds[p]) {
				// Part p is in the slot: the atomic store orders its
				// copies first, as the doorbell's does for the whole.
				staging.RingDoorbell(&job.words[p], job.seq)
				c.parts.Add(1)
				p++
			}
			copy(memrange.Bytes(e.Dst, e.Len), memrange.Bytes(e.Src, e.Len))
			n += e.Len
		}
		// The lane has room again before the doorbell rings, so whoever
		// sees the doorbell may enqueue at once.
		l.free <- job.entries
		c.copies.Add(1)
		c.bytes.Add(n)
		// The atomic store orders the copies before the doorbell for a
		// reader that loads seq atomically.
		staging.RingDoorbell(job.doorbell, job.seq)
		finished.Add(1)
	}
}

// Drained reports whether every copy enqueued on lane so far has rung its
// doorbell or was dropped (relay.CopyDrainer): the lane's worker writes
// nothing more for them. A lane out of range has nothing enqueued.
func (c *HostCopier) Drained(lane int) bool {
	if lane < 0 || lane >= staging.LaneCount {
		return true
	}
	return c.finished[lane].Load() == c.handed[lane].Load()
}

// await waits until g opens and reports true, or reports whether g is open
// once the copier closes.
func (c *HostCopier) await(l *hostLane, g *readyGate) bool {
	for !g.open.Load() {
		select {
		case <-l.wake:
		case <-c.closing:
			return g.open.Load()
		}
	}
	return true
}

// Stats returns the copier's counters.
func (c *HostCopier) Stats() HostCopierStats {
	c.evMu.Lock()
	live := len(c.events)
	c.evMu.Unlock()
	c.laneMu.Lock()
	lanes := 0
	for _, l := range c.lanes {
		if l != nil {
			lanes++
		}
	}
	c.laneMu.Unlock()
	return HostCopierStats{
		Copies:     c.copies.Load(),
		Bytes:      c.bytes.Load(),
		Abandoned:  c.abandoned.Load(),
		Parts:      c.parts.Load(),
		LiveEvents: live,
		Lanes:      lanes,
	}
}

// Close runs every enqueued copy whose ready event completes, stops the lane
// workers and waits for them. Copies still waiting on a held ready event are
// dropped without reading their source or ringing their doorbell, and Close
// reports them.
func (c *HostCopier) Close() error {
	c.laneMu.Lock()
	if c.closed {
		c.laneMu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closing)
	for _, l := range c.lanes {
		if l != nil {
			close(l.jobs)
		}
	}
	c.laneMu.Unlock()
	c.workers.Wait()
	if n := c.abandoned.Load(); n > 0 {
		return fmt.Errorf("cpucopy: close dropped %d copies whose ready event was never released", n)
	}
	return nil
}
