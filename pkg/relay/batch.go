// SPDX-License-Identifier: Apache-2.0

package relay

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Op is the direction of a request.
type Op uint8

const (
	// Write moves Len bytes from local Src to Dst in Target.
	Write Op = iota
	// Read moves Len bytes from Dst in Target to local Src.
	Read
)

func (o Op) String() string {
	if o == Read {
		return "read"
	}
	return "write"
}

// Request is one transfer of a batch.
type Request struct {
	Op     Op
	Src    uintptr
	Len    uint64
	Target string
	Dst    uint64
	// Stream is the caller's stream on which Src becomes ready; 0 is the
	// calling thread's default stream. The source-ready event is recorded on
	// it at Submit.
	Stream uintptr
}

// State is a task's state.
type State int32

const (
	Pending State = iota
	Completed
	Failed
)

func (s State) String() string {
	switch s {
	case Completed:
		return "completed"
	case Failed:
		return "failed"
	}
	return "pending"
}

// TaskStatus is what Status reports of one task.
type TaskStatus struct {
	State       State
	Transferred uint64
	// Err is the first failure of a failed task.
	Err error
}

// Route says how a task travels.
type Route uint8

const (
	RouteDirect Route = iota
	RoutePXN
)

// task is one request of a batch: its length and route, set in Submit, and
// what its slices moved and whether one failed. The count of its slices not
// yet finished is apart, in the batch's dense remaining array: finishing a
// slice that is its whole request (most KV blocks) writes only that count,
// so a Piece of 256 blocks finishes its tasks in 16 cache lines rather than
// in 256 tasks the caller wrote in Submit and reads when it polls.
type task struct {
	length      uint64
	transferred atomic.Uint64
	failed      atomic.Bool
	route       Route
	err         atomic.Pointer[error]
}

// finishSlice counts one slice of task i, n bytes, as finished with err.
// whole says the slice is its whole request: it then records no bytes, as
// a task that completes moved its length. The count of slices left is
// decremented last, after the failure or the bytes.
func (b *Batch) finishSlice(i int, n uint64, whole bool, err error) {
	t := &b.tasks[i]
	if err != nil {
		t.fail(err)
	} else if !whole {
		t.transferred.Add(n)
	}
	atomic.AddInt32(&b.remaining[i], -1)
}

// fail records err as the task's failure if it is the first. Apart from
// finishSlice so that only failures move an error to the heap.
func (t *task) fail(err error) {
	t.err.CompareAndSwap(nil, &err)
	t.failed.Store(true)
}

// Batch is a submitted set of requests. Its status is read from local
// counters only.
type Batch struct {
	tasks []task
	// remaining[i] counts the slices of task i not yet finished. Submit
	// sets it with plain stores before the task's chunk is queued (the
	// queue's lock orders them before any reader), so a task never looks
	// complete while slices of it are still to come; it is read and
	// decremented atomically after.
	remaining []int32
	pool      *batchPool
	released  atomic.Bool
}

// Len is the number of tasks in the batch.
func (b *Batch) Len() int { return len(b.tasks) }

// Status returns the status of task i.
func (b *Batch) Status(i int) (TaskStatus, error) {
	if i < 0 || i >= len(b.tasks) {
		return TaskStatus{}, fmt.Errorf("task %d out of range [0,%d)", i, len(b.tasks))
	}
	t := &b.tasks[i]
	if atomic.LoadInt32(&b.remaining[i]) > 0 {
		return TaskStatus{State: Pending, Transferred: t.transferred.Load()}, nil
	}
	if t.failed.Load() {
		var err error
		if p := t.err.Load(); p != nil {
			err = *p
		}
		return TaskStatus{State: Failed, Transferred: t.transferred.Load(), Err: err}, nil
	}
	return TaskStatus{State: Completed, Transferred: t.length}, nil
}

// Route reports how task i was sent.
func (b *Batch) Route(i int) Route { return b.tasks[i].route }

// ErrBatchBusy is returned by Release while a task of the batch is pending.
var ErrBatchBusy = errors.New("relay: batch has pending tasks")

// Release hands a finished batch back to its engine for reuse by a later
// Submit. It fails with ErrBatchBusy while a task is pending; after it
// returns nil the batch must not be used again. A batch that is never
// released is reclaimed by the garbage collector.
func (b *Batch) Release() error {
	if !b.Done() {
		return ErrBatchBusy
	}
	if !b.released.CompareAndSwap(false, true) {
		return errReleasedTwice
	}
	if b.pool != nil {
		b.pool.put(b)
	}
	return nil
}

var errReleasedTwice = errors.New("relay: batch released twice")

// Done reports whether every task of the batch has reached a final state.
func (b *Batch) Done() bool {
	for i := range b.remaining {
		if atomic.LoadInt32(&b.remaining[i]) > 0 {
			return false
		}
	}
	return true
}

// taskSlice is one logical slice: the part of a task that one Piece or one
// direct write carries. It is kept by value, in token entries among others.
type taskSlice struct {
	batch *Batch
	task  int32
	len   uint64
}

func (s taskSlice) finish(err error) { s.batch.finishSlice(int(s.task), s.len, false, err) }
