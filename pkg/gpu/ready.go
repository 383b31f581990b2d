// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"errors"
	"fmt"
	"sync"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/relay"
)

// ErrUnknownEvent is returned for an event the copier did not hand out or
// that was released.
var ErrUnknownEvent = errors.New("gpu: unknown event")

// readyGrow is how many events the pool adds when it runs dry.
const readyGrow = 64

// readyPool hands out source-ready events. A relay.Event is the slot index
// plus one in its low 32 bits and the slot's generation above, so an event
// released and handed out again is not mistaken for its earlier life.
type readyPool struct {
	g *GPU

	mu    sync.Mutex
	slots []readySlot
	free  []uint32
}

type readySlot struct {
	ev   cuda.Event
	gen  uint32
	live bool
}

func (p *readyPool) grow(n int) error {
	evs := make([]cuda.Event, 0, n)
	err := p.g.Do(func() error {
		for range n {
			ev, err := p.g.d.EventCreate(cuda.EventDisableTiming)
			if err != nil {
				return err
			}
			evs = append(evs, ev)
		}
		return nil
	})
	for _, ev := range evs {
		p.free = append(p.free, uint32(len(p.slots)))
		p.slots = append(p.slots, readySlot{ev: ev})
	}
	return err
}

// get takes a free event; the pool grows (allocating) only when every event
// is in use.
func (p *readyPool) get() (relay.Event, cuda.Event, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		if err := p.grow(readyGrow); err != nil && len(p.free) == 0 {
			return 0, 0, fmt.Errorf("gpu: growing the ready-event pool past %d: %w", len(p.slots), err)
		}
	}
	i := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	s := &p.slots[i]
	s.live = true
	return relay.Event(uint64(s.gen)<<32 | uint64(i+1)), s.ev, nil
}

// lookup returns the CUDA event behind a live relay.Event.
func (p *readyPool) lookup(ev relay.Event) (cuda.Event, bool) {
	i, gen := uint32(ev)-1, uint32(ev>>32)
	p.mu.Lock()
	defer p.mu.Unlock()
	if uint32(ev) == 0 || int(i) >= len(p.slots) || !p.slots[i].live || p.slots[i].gen != gen {
		return 0, false
	}
	return p.slots[i].ev, true
}

// put returns ev to the pool. A wait already enqueued on it keeps waiting
// for the record it saw: cuStreamWaitEvent captures the event's state at the
// time of the call, so the event may be recorded again at once.
func (p *readyPool) put(ev relay.Event) bool {
	i, gen := uint32(ev)-1, uint32(ev>>32)
	p.mu.Lock()
	defer p.mu.Unlock()
	if uint32(ev) == 0 || int(i) >= len(p.slots) || !p.slots[i].live || p.slots[i].gen != gen {
		return false
	}
	p.slots[i].live = false
	p.slots[i].gen++
	p.free = append(p.free, i)
	return true
}

// live counts events handed out and not released.
func (p *readyPool) live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.slots) - len(p.free)
}

// destroy destroys every event; the caller holds the context.
func (p *readyPool) destroy() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, s := range p.slots {
		if err := p.g.d.EventDestroy(s.ev); err != nil {
			errs = append(errs, err)
		}
	}
	p.slots, p.free = nil, nil
	return errors.Join(errs...)
}
