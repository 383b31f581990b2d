// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// Close leaves the group, undoing Register in reverse: it closes the
// rank's own PeerLinks, revokes READY (state CLOSING, published name
// unlinked, under the lock, so no sender attaches afterwards), waits for
// every live sender to release its lane, then unmaps and removes the
// control file, deregisters and frees the arena and closes the directory.
// The wait ends with ctx or after Options.DrainTimeout; a lane still held
// then keeps the arena and the control mapping alive until the process
// exits, and Close returns ErrLeaseHeld. The pump must be stopped first.
func (r *Rank) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	links := make([]*PeerLink, 0, len(r.links))
	for l := range r.links {
		links = append(links, l)
	}
	r.mu.Unlock()
	r.scanMu.Lock()
	r.scan.release()
	r.scanMu.Unlock()
	for i := range r.beats {
		r.beats[i].drop()
	}

	var errs []error
	r.expirePending(true)
	for _, l := range links {
		if err := l.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.DrainTimeout)
	defer cancel()
	if err := r.revoke(ctx); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if err := r.waitLeases(ctx); err != nil {
		r.quarantine(err)
		return errors.Join(append(errs, err)...)
	}
	r.laneMu.Lock()
	r.lanesClosed = true
	r.laneMu.Unlock()
	if err := r.unwind(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// BeginClose marks the rank CLOSING ahead of Close, while its pump still
// runs: no sender attaches any more, attached senders publish no new
// tickets, wait for the ones they published and release their lanes, which
// Leases then shows.
func (r *Rank) BeginClose() {
	r.stopClaims()
	r.ctl.Header.StoreState(staging.StateClosing)
	r.flushControl()
}

// stopClaims makes the arena socket refuse every claim from here on.
func (r *Rank) stopClaims() {
	r.laneMu.Lock()
	r.accepting = false
	r.laneMu.Unlock()
}

// revoke withdraws READY. CLOSING is stored first so attached senders stop
// at once and the arena socket grants no claim: a claim checks READY
// under the lock under which Leases reads the claims, so it is either
// seen by waitLeases or never made. The file itself stays until the
// arena is gone, naming the namespace by which others judge the arena.
func (r *Rank) revoke(ctx context.Context) error {
	r.stopClaims()
	r.ctl.Header.StoreState(staging.StateClosing)
	r.flushControl()
	return r.d.withLock(ctx, func() error {
		name, tmp := r.Name(), folder.TmpFileName(r.id)
		err := unix.Renameat2(r.d.fd(), name, r.d.fd(), tmp, unix.RENAME_NOREPLACE)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.LinkError{Op: "renameat2", Old: name, New: tmp, Err: err}
		}
		return nil
	})
}

// waitLeases polls the inbound lanes until none has a live owner. It keeps
// beating meanwhile: the rank is alive, only closing.
func (r *Rank) waitLeases(ctx context.Context) error {
	var timer *time.Timer
	for {
		held := r.Leases()
		if len(held) == 0 {
			return nil
		}
		poll := leasePoll
		if h := r.hooks; h != nil && h.leaseWait != nil {
			poll = h.leaseWait(held)
		}
		r.Heartbeat(staging.MonoNanos())
		if timer == nil {
			timer = time.NewTimer(poll)
			defer timer.Stop()
		} else {
			timer.Reset(poll)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pxn registry: close %s: %w: lanes %v: %w", r.Name(), ErrLeaseHeld, held, ctx.Err())
		case <-timer.C:
		}
	}
}
