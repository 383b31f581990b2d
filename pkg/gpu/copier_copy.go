// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// Copy enqueues, on the lane's next stream, a wait for ready, the copies
// and the doorbell, and returns without waiting. On error, nothing after
// the failing step was enqueued and the doorbell was not submitted.
func (c *Copier) Copy(laneIdx int, ready relay.Event, entries []relay.CopyEntry, doorbell *uint64, seq uint64) error {
	return c.copyIn(laneIdx, ready, entries, nil, doorbell, nil, seq)
}

// CopyParts is Copy for a Piece in parts (relay.PartCopier). On the SM
// path with GPU doorbells the kernel copies the parts one after the other
// and stores seq into words[p] once part p is in the slot; a Piece the
// copy engines move, or with CPU doorbells, signals only its doorbell,
// which covers every part.
func (c *Copier) CopyParts(laneIdx int, ready relay.Event, entries []relay.CopyEntry, partEnds []uint32, doorbell *uint64, words *[staging.MaxParts - 1]uint64, seq uint64) error {
	if words == nil {
		return fmt.Errorf("gpu: lane %d seq %d: nil part words", laneIdx, seq)
	}
	if len(partEnds) >= cuda.MaxParts {
		return fmt.Errorf("gpu: lane %d seq %d: %d part ends, at most %d", laneIdx, seq, len(partEnds), cuda.MaxParts-1)
	}
	return c.copyIn(laneIdx, ready, entries, partEnds, doorbell, words, seq)
}

// cutBytes turns part ends (entry indices) into the byte ends of the
// parts, the last being the Piece's length, in cuts; false when the ends do
// not increase inside entries or a part would be empty.
func cutBytes(entries []relay.CopyEntry, partEnds []uint32, cuts *[cuda.MaxParts]uint64) ([]uint64, bool) {
	var n uint64
	p := 0
	for i := range entries {
		if p < len(partEnds) && i == int(partEnds[p]) {
			if n == 0 || p > 0 && n <= cuts[p-1] {
				return nil, false
			}
			cuts[p] = n
			p++
		}
		n += entries[i].Len
	}
	if p != len(partEnds) || p > 0 && n <= cuts[p-1] {
		return nil, false
	}
	cuts[p] = n
	return cuts[:p+1], true
}

func (c *Copier) copyIn(laneIdx int, ready relay.Event, entries []relay.CopyEntry, partEnds []uint32, doorbell *uint64, words *[staging.MaxParts - 1]uint64, seq uint64) error {
	if laneIdx < 0 || laneIdx >= staging.LaneCount {
		return fmt.Errorf("gpu: lane %d out of range [0, %d)", laneIdx, staging.LaneCount)
	}
	if doorbell == nil {
		return fmt.Errorf("gpu: lane %d seq %d: nil doorbell", laneIdx, seq)
	}
	word := uintptr(unsafe.Pointer(doorbell))
	if word%8 != 0 {
		return fmt.Errorf("gpu: lane %d seq %d: doorbell %#x is not 8-byte aligned", laneIdx, seq, word)
	}
	if len(entries) > staging.MaxPlans {
		return fmt.Errorf("gpu: lane %d seq %d: %d entries, at most %d", laneIdx, seq, len(entries), staging.MaxPlans)
	}
	if c.closed.Load() {
		return ErrClosed
	}
	var wait cuda.Event
	if ready != 0 {
		var ok bool
		if wait, ok = c.ready.lookup(ready); !ok {
			return fmt.Errorf("gpu: lane %d seq %d: %w: %#x", laneIdx, seq, ErrUnknownEvent, uint64(ready))
		}
	}
	var bellDev cuda.DevicePtr
	if c.gpuBell {
		var ok bool
		if bellDev, ok = c.hosts.device(word, 8); !ok {
			return fmt.Errorf("gpu: lane %d seq %d: doorbell %#x is in no registered host range (RegisterHost)", laneIdx, seq, word)
		}
	}
	sm := c.gather.fn != 0 && useGather(c.gather.mode, c.gather.threshold, entries)
	l := &c.lanes[laneIdx]
	l.mu.Lock()
	defer l.mu.Unlock()
	// With one gather stream, SM Pieces of a lane all go on its first
	// stream: one launch at a time keeps the kernel on at most
	// GatherMaxBlocks SMs. With two, the grid is halved instead.
	si := l.next
	if sm && c.gather.streams == 1 {
		si = 0
	}
	st := &l.streams[si]
	if !c.gpuBell && st.n == PendingDepth {
		return fmt.Errorf("%w: lane %d seq %d: %d doorbells not yet rung", ErrLaneFull, laneIdx, seq, PendingDepth)
	}
	var n uint64
	for i := range entries {
		n += entries[i].Len
	}
	p := &st.piece
	p.Ctx = c.g.ctx
	p.Stream = st.s
	p.Wait = wait
	p.Mode = c.mode
	p.Gather = cuda.Gather{}
	if sm {
		ps := &c.gather.slots[laneIdx][staging.SlotOf(seq)]
		p.Mode = cuda.CopyGather
		p.Gather = cuda.Gather{Kernel: c.gather.fn, Grid: c.gather.grid, Block: c.gather.block,
			PlanHost: ps.host, PlanDev: ps.dev, PlanCap: staging.MaxPlans,
			Upload: c.gather.uploads[laneIdx], PlanUp: ps.up, PlanBusy: ps.busy,
			Inline: c.gather.inline, Arrived: ps.arrived}
		if len(partEnds) > 0 && c.gpuBell {
			cuts, ok := cutBytes(entries, partEnds, &st.cuts)
			if !ok {
				return fmt.Errorf("gpu: lane %d seq %d: part ends %v do not cut the %d entries into parts of at least a byte", laneIdx, seq, partEnds, len(entries))
			}
			wordsDev, ok := c.hosts.device(uintptr(unsafe.Pointer(words)), uint64(unsafe.Sizeof(*words)))
			if !ok {
				return fmt.Errorf("gpu: lane %d seq %d: part words %p are in no registered host range (RegisterHost)", laneIdx, seq, words)
			}
			p.Gather.Cuts, p.Gather.PartWords = cuts, wordsDev
		}
	}
	p.Entries = unsafe.Slice((*cuda.BatchEntry)(unsafe.Pointer(unsafe.SliceData(entries))), len(entries))
	p.Doorbell = bellDev
	p.Seq = seq
	p.Done = 0
	tail := (st.head + st.n) % PendingDepth
	if !c.gpuBell {
		p.Done = st.events[tail]
	}
	// A failed Enqueue may have enqueued part of the Piece.
	l.unfenced = true
	err := st.op.Enqueue(p)
	p.Entries = nil
	if err != nil {
		if sm && errors.Is(err, cuda.ErrorNotReady) {
			return fmt.Errorf("%w: lane %d seq %d: the gather plan of slot %d is still in use (seq %d not reaped?)", ErrLaneFull, laneIdx, seq, staging.SlotOf(seq), seq-staging.SlotsPerLane)
		}
		return fmt.Errorf("gpu: lane %d seq %d: %w", laneIdx, seq, err)
	}
	if sm {
		c.smPieces.Add(1)
		if len(p.Gather.Cuts) > 0 {
			c.partPieces.Add(1)
		}
	}
	if !c.gpuBell {
		st.bells[tail] = bell{word: doorbell, seq: seq}
		st.n++
		c.pending.Add(1)
	}
	if si == l.next {
		l.next = (l.next + 1) % StreamsPerLane
	}
	c.copies.Add(1)
	c.bytes.Add(n)
	return nil
}

// Poll rings the CPU doorbells whose copies have completed, each with an
// atomic store of its seq (the relay loads it atomically), and returns how
// many it rang. The pump calls it every round; on the GPU-doorbell path, or
// with nothing pending, it returns at once. An error is a failed event
// query: the lane's Pieces will never ring, and the engine should treat it
// like a failed Copy.
func (c *Copier) Poll() (int, error) {
	if c.pending.Load() == 0 {
		return 0, nil
	}
	rung := 0
	for i := range c.lanes {
		n, err := c.pollLane(i)
		rung += n
		if err != nil {
			return rung, err
		}
	}
	return rung, nil
}

func (c *Copier) pollLane(i int) (int, error) {
	l := &c.lanes[i]
	l.mu.Lock()
	defer l.mu.Unlock()
	rung := 0
	for si := range l.streams {
		st := &l.streams[si]
		for st.n > 0 {
			done, err := c.g.d.QueryEvent(c.g.ctx, st.events[st.head])
			if err != nil {
				return rung, fmt.Errorf("gpu: lane %d doorbell seq %d: %w", i, st.bells[st.head].seq, err)
			}
			if !done {
				break
			}
			b := st.bells[st.head]
			staging.RingDoorbell(b.word, b.seq)
			st.bells[st.head] = bell{}
			st.head = (st.head + 1) % PendingDepth
			st.n--
			c.pending.Add(-1)
			rung++
		}
	}
	return rung, nil
}

// Drained reports whether every Piece enqueued on the lane before the call
// has finished on the GPU, its doorbell and part words written
// (relay.CopyDrainer). On the CPU-doorbell path that is when Poll has rung
// every doorbell of the lane. On the GPU path the GPU writes them itself:
// a call after new Pieces records an event behind them on each of the
// lane's streams and reports false, and later calls query those events.
// The answer comes from the copier's own streams, never from the words in
// the relay's memory. A failed query reports false: the lane is kept.
func (c *Copier) Drained(laneIdx int) bool {
	if laneIdx < 0 || laneIdx >= staging.LaneCount {
		return true
	}
	if !c.closeMu.TryLock() {
		// Close is waiting for the streams.
		return false
	}
	defer c.closeMu.Unlock()
	if c.closed.Load() {
		// Close saw every stream finish before it freed them, or gave up
		// on the lane's and freed nothing.
		return !c.wedged[laneIdx]
	}
	l := &c.lanes[laneIdx]
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.gpuBell {
		for si := range l.streams {
			if l.streams[si].n > 0 {
				return false
			}
		}
		return true
	}
	if l.unfenced {
		for si := range l.streams {
			if err := c.g.d.RecordEvent(c.g.ctx, l.fences[si], l.streams[si].s); err != nil {
				l.fenced = false
				return false
			}
		}
		l.unfenced, l.fenced = false, true
		return false
	}
	if !l.fenced {
		// Nothing was ever enqueued on the lane.
		return true
	}
	for si := range l.streams {
		if done, err := c.g.d.QueryEvent(c.g.ctx, l.fences[si]); err != nil || !done {
			return false
		}
	}
	return true
}
