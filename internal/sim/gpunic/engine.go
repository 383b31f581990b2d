// SPDX-License-Identifier: Apache-2.0

package gpunic

import (
	"errors"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
)

// gpuEngine is the NIC's engine on a GPU: a batch is one enqueue of a copy
// op (the scatter kernel with its plan uploaded once, or the copy engines)
// on one of two streams, alternating so that one batch's launch overlaps
// the previous one's tail, followed by the batch's event.
type gpuEngine struct {
	g       *gpu.GPU
	streams [nicStreams]cuda.Stream
	next    int
	op      *cuda.CopyOp
	ceMode  cuda.CopyMode
	scatter scatter
	piece   cuda.Piece
	events  [nicBatches]cuda.Event
	plans   [nicBatches]planSlot
}

func newGPUEngine(g *gpu.GPU, opts Options) (*gpuEngine, error) {
	e := &gpuEngine{g: g, ceMode: g.Driver().BestCopyMode()}
	err := g.Do(func() error {
		var err error
		for i := range e.streams {
			if e.streams[i], err = g.Driver().StreamCreate(cuda.StreamNonBlocking); err != nil {
				return err
			}
		}
		if e.op, err = g.Driver().NewCopyOp(batchOps); err != nil {
			return err
		}
		for i := range e.events {
			if e.events[i], err = g.Driver().EventCreate(cuda.EventDisableTiming); err != nil {
				return err
			}
		}
		return e.scatter.setup(g, opts, e.plans[:])
	})
	if err != nil {
		return nil, errors.Join(err, e.close())
	}
	return e, nil
}

func (e *gpuEngine) start(b int, entries []cuda.BatchEntry) error {
	p := &e.piece
	*p = cuda.Piece{Ctx: e.g.Context(), Stream: e.streams[e.next], Mode: e.ceMode, Entries: entries, Done: e.events[b]}
	e.next = (e.next + 1) % nicStreams
	if e.scatter.use(entries) {
		p.Mode = cuda.CopyGather
		p.Gather = e.scatter.launch(&e.plans[b])
	} else if len(entries) == 1 {
		p.Mode = cuda.CopyPerEntry
	}
	err := e.op.Enqueue(p)
	p.Entries = nil
	return err
}

func (e *gpuEngine) done(b int) (bool, error) {
	return e.g.Driver().QueryEvent(e.g.Context(), e.events[b])
}

// close waits for the engine's GPU work and frees what newGPUEngine made.
func (e *gpuEngine) close() error {
	return e.g.Do(func() error {
		d := e.g.Driver()
		var errs []error
		for i, s := range e.streams {
			if s != 0 {
				errs = append(errs, d.StreamSynchronize(s), d.StreamDestroy(s))
				e.streams[i] = 0
			}
		}
		errs = append(errs, e.scatter.free(d, e.plans[:]))
		for i, ev := range e.events {
			if ev != 0 {
				errs = append(errs, d.EventDestroy(ev))
				e.events[i] = 0
			}
		}
		if e.op != nil {
			e.op.Free()
			e.op = nil
		}
		return errors.Join(errs...)
	})
}
