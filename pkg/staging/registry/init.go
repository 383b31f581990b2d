// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// InitStep is one step of Register, in order. Close undoes them in reverse.
type InitStep int

// The steps of Register. The control file comes first and goes last: every
// other file of the registration is judged by the PID namespace its header
// names (see judge).
const (
	// StepOpenRegistry opens (or creates) the group directory and its lock,
	// checks ownership and modes, and removes stale entries.
	StepOpenRegistry InitStep = iota + 1
	// StepCreateControl creates and maps the control file under its
	// temporary name and fills the header.
	StepCreateControl
	StepAllocateArena
	// StepRegisterMemory hands each lane of the arena to Options.Memory.
	StepRegisterMemory
	// StepExportHandle puts the arena's export handle into the header.
	StepExportHandle
	// StepServeArena opens the arena socket, where senders claim lanes.
	StepServeArena
	// StepPublish marks the rank READY and renames the control file to its
	// published name.
	StepPublish
)

func (s InitStep) String() string {
	switch s {
	case StepOpenRegistry:
		return "open registry"
	case StepAllocateArena:
		return "allocate arena"
	case StepRegisterMemory:
		return "register arena memory"
	case StepCreateControl:
		return "create control file"
	case StepExportHandle:
		return "export arena handle"
	case StepServeArena:
		return "serve lane claims"
	case StepPublish:
		return "publish READY"
	}
	return fmt.Sprintf("step(%d)", int(s))
}

// InitError is the failure of one step of Register. Everything done before
// it has been undone, except an arena that had to be quarantined.
type InitError struct {
	Step InitStep
	Err  error
}

func (e *InitError) Error() string { return "pxn registry: " + e.Step.String() + ": " + e.Err.Error() }

func (e *InitError) Unwrap() error { return e.Err }

// Register joins the group: it runs the steps of InitStep in order and
// returns a rank published READY. On failure every step done is undone in
// reverse order and no file of this rank remains, except a quarantined
// arena (see MemoryRegistrar). The arena provider, directory and memory
// registrar must outlive the Rank.
func Register(ctx context.Context, opts Options) (*Rank, error) {
	return register(ctx, opts, nil)
}

// register is Register with the package's test hooks, nil in production.
func register(ctx context.Context, opts Options, h *hooks) (*Rank, error) {
	if err := opts.fill(); err != nil {
		return nil, fmt.Errorf("pxn registry: %w", err)
	}
	id, err := folder.NewIdentity()
	if err != nil {
		return nil, fmt.Errorf("pxn registry: %w", err)
	}
	ns, err := staging.SelfPidNS()
	if err != nil {
		return nil, fmt.Errorf("pxn registry: %w", err)
	}
	r := &Rank{
		id:           id,
		ns:           ns,
		opts:         opts,
		links:        make(map[*PeerLink]struct{}),
		refused:      make(map[string]bool),
		shareSaid:    make(map[string]bool),
		importFailed: make(map[string]error),
		pending:      make(map[staging.Identity]*pendingAttach),
		hooks:        h,
		liveFd:       -1,
		ctlFd:        -1,
	}
	r.scan.self = ns
	r.scan.host = machineScanHost()
	if err := r.init(ctx); err != nil {
		if uerr := r.unwind(); uerr != nil {
			err = errors.Join(err, fmt.Errorf("pxn registry: roll back: %w", uerr))
		}
		return nil, err
	}
	r.opts.Logger.Info("pxn rank published", "registry", r.d.path, "rank", r.Name(), "rail", opts.Rail, "hca", opts.HCA)
	return r, nil
}

func (r *Rank) init(ctx context.Context) error {
	for _, s := range [...]struct {
		step InitStep
		run  func() error
	}{
		{StepOpenRegistry, func() error { return r.openRegistry(ctx) }},
		{StepCreateControl, r.createControl},
		{StepAllocateArena, r.allocateArena},
		{StepRegisterMemory, r.registerMemory},
		{StepExportHandle, r.exportHandle},
		{StepServeArena, r.serveArena},
		{StepPublish, func() error { return r.publish(ctx) }},
	} {
		if h := r.hooks; h != nil && h.beforeStep != nil {
			if err := h.beforeStep(s.step); err != nil {
				return &InitError{Step: s.step, Err: err}
			}
		}
		if err := s.run(); err != nil {
			return &InitError{Step: s.step, Err: err}
		}
		// An initializing rank beats too: a rank of another PID namespace
		// judges it by its heartbeat alone.
		if r.ctl != nil {
			r.beat(staging.MonoNanos())
		}
	}
	return nil
}

func (r *Rank) pushUndo(f func() error) { r.undo = append(r.undo, f) }

// unwind runs the teardown of every completed step, newest first.
func (r *Rank) unwind() error {
	var errs []error
	for i := len(r.undo) - 1; i >= 0; i-- {
		if err := r.undo[i](); err != nil {
			errs = append(errs, err)
		}
	}
	r.undo = nil
	return errors.Join(errs...)
}

func (r *Rank) openRegistry(ctx context.Context) error {
	d, err := openRegistryDir(r.opts.Root, r.opts.UID, r.opts.Group)
	if err != nil {
		return err
	}
	r.d = d
	r.pushUndo(d.close)
	return d.withLock(ctx, func() error {
		removed, why, err := d.cleanStale(r.id, judge{self: r.ns, timeout: r.opts.HeartbeatTimeout, d: d})
		if len(removed) > 0 {
			r.opts.Logger.Info("pxn removed stale registry entries", "registry", d.path, "entries", removed, "reasons", why)
		}
		return err
	})
}

func (r *Rank) allocateArena() error {
	a, err := r.opts.Arenas.Allocate(r.d.dir, folder.ArenaFileName(r.id))
	if err != nil {
		return err
	}
	if a.Size() < staging.ArenaSize || a.Kind() != r.opts.Arenas.Kind() {
		err := fmt.Errorf("arena of kind %d and %d bytes, want kind %d and %d bytes", a.Kind(), a.Size(), r.opts.Arenas.Kind(), uint64(staging.ArenaSize))
		return errors.Join(err, a.Close())
	}
	r.arena = a
	r.pushUndo(func() error {
		if r.quarantined.Load() {
			return nil
		}
		return a.Close()
	})
	return nil
}

// quarantine keeps the arena allocated (and its file, for a host arena)
// until the process exits: a NIC may still hold part of it.
func (r *Rank) quarantine(why error) {
	r.quarantined.Store(true)
	r.opts.Logger.Error(why, "pxn arena quarantined until the process exits", "registry", r.d.path, "base", r.arena.Base())
}

// laneBase is where lane i of the arena starts in this process.
func (r *Rank) laneBase(i int) uintptr { return r.arena.Base() + uintptr(staging.LaneOffset(i)) }

// registerMemory registers each lane of the arena on its own, so that a
// lane given new memory is registered again alone (renewLane). A failure
// quarantines the arena; the lanes registered before it are deregistered.
func (r *Rank) registerMemory() error {
	m := r.opts.Memory
	if m == nil {
		return nil
	}
	for i := range staging.LaneCount {
		if err := r.registerLane(i); err != nil {
			return errors.Join(fmt.Errorf("lane %d: %w (arena quarantined)", i, err), r.deregisterLanes())
		}
	}
	r.pushUndo(func() error {
		if err := r.deregisterLanes(); err != nil {
			return fmt.Errorf("deregister arena: %w (arena quarantined)", err)
		}
		return nil
	})
	return nil
}

// deregisterLanes deregisters every lane still registered; a failure
// quarantines the arena. The pump must have stopped.
func (r *Rank) deregisterLanes() error {
	var errs []error
	for i := range staging.LaneCount {
		r.laneMu.Lock()
		reg := r.registered[i]
		r.laneMu.Unlock()
		if !reg {
			continue
		}
		if err := r.deregisterLane(i); err != nil {
			errs = append(errs, fmt.Errorf("lane %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// registerLane registers lane's range of the arena with the NIC and
// records that it is; a failure quarantines the arena.
func (r *Rank) registerLane(lane int) error {
	if err := r.opts.Memory.Register(r.laneBase(lane), staging.LaneBytes); err != nil {
		r.quarantine(err)
		return err
	}
	r.laneMu.Lock()
	r.registered[lane] = true
	r.laneMu.Unlock()
	return nil
}

// deregisterLane drops lane's NIC registration and records that it is
// gone; a failure quarantines the arena.
func (r *Rank) deregisterLane(lane int) error {
	if err := r.opts.Memory.Deregister(r.laneBase(lane), staging.LaneBytes); err != nil {
		r.quarantine(err)
		return err
	}
	r.laneMu.Lock()
	r.registered[lane] = false
	r.laneMu.Unlock()
	return nil
}

func (r *Rank) createControl() error {
	name := folder.TmpFileName(r.id)
	fd, err := folder.CreatePrivate(r.d.fd(), r.d.path, name)
	if err != nil {
		return err
	}
	mem, err := allocateControl(fd, r.d.path, name, int(staging.ControlSize))
	if err == nil {
		err = padControl(fd, r.d.path, name)
	}
	// The lock is taken on an open file of its own: fd is the one the
	// rank writes its block through.
	live := -1
	if err == nil {
		live, err = unix.Openat(r.d.fd(), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			err = folder.HoldLiveness(live)
		}
		if err != nil {
			unix.Munmap(mem)
			if live >= 0 {
				unix.Close(live)
			}
			err = fmt.Errorf("liveness lock: %w", err)
		}
	}
	if err != nil {
		unix.Close(fd)
		unix.Unlinkat(r.d.fd(), name, 0)
		return err
	}
	r.liveFd = live
	r.ctlFd = fd
	r.ctlMem = mem
	r.ctl = (*staging.ControlBlock)(unsafe.Pointer(&mem[0]))
	for i := range r.inbound {
		r.inbound[i] = staging.NewRelayLane()
	}
	waiter, err := staging.NewEventWaiter(&r.inbound)
	if err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		unix.Close(live)
		unix.Unlinkat(r.d.fd(), name, 0)
		return err
	}
	r.waiter = waiter
	r.ctl.Header = folder.NewHeader(r.id, r.ns, r.opts.UID, r.opts.Rail, r.opts.HCA, r.opts.Arenas.Kind())
	if err := r.ctl.Stats.SetDevice(r.opts.deviceName()); err != nil {
		r.opts.Logger.Info("pxn rank names no device in its counters", "registry", r.d.path, "err", err.Error())
	}
	r.pushUndo(func() error {
		if r.quarantined.Load() {
			// The control file stays with the arena, so that others judge
			// the arena by the namespace it names until the process exits.
			return nil
		}
		for _, l := range r.inbound {
			l.Release()
		}
		err := errors.Join(unix.Munmap(mem), unix.Close(r.ctlFd), r.waiter.Close())
		r.ctl, r.ctlMem, r.ctlFd, r.inbound, r.waiter = nil, nil, -1, [staging.LaneCount]*staging.RelayLane{}, nil
		// Published, the file was renamed; revoked, renamed back.
		if uerr := unix.Unlinkat(r.d.fd(), name, 0); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
			err = errors.Join(err, uerr)
		}
		// The lock goes last: until here, nobody may take this rank for
		// gone.
		unix.Close(r.liveFd)
		r.liveFd = -1
		return err
	})
	return nil
}

// padControl makes a new control file as long as one of ABI version 5, a
// sparse tail past the control block that nothing maps: a rank of that
// version reads the header and refuses it by its version, rather than by
// its size.
func padControl(fd int, dirPath, name string) error {
	if err := unix.Ftruncate(fd, folder.LegacyControlSize); err != nil {
		return &os.PathError{Op: "truncate", Path: filepath.Join(dirPath, name), Err: err}
	}
	return nil
}

// allocateControl gives the new file name its size bytes of blocks and
// returns the memory the rank keeps its control block in: memory of its
// own, not a mapping of the file, which any process of the group's uid can
// shrink (a named tmpfs file takes no seals). flushControl writes the block
// into the file.
func allocateControl(fd int, dirPath, name string, size int) ([]byte, error) {
	if err := folder.Allocate(fd, dirPath, name, int64(size)); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: filepath.Join(dirPath, name), Err: err}
	}
	return mem, nil
}

// flushControl writes the rank's control block into its file, where peers
// and inspect read it (by pread): at every beat, state change and counters'
// publication. A file another process shrank or grew is written whole
// again; a write that fails (a full tmpfs after such a shrink) is said once
// and tried again at the next beat, and peers meanwhile read a short file
// and take this rank for gone.
func (r *Rank) flushControl() {
	n, err := unix.Pwrite(r.ctlFd, r.ctlMem, 0)
	if err == nil && n != len(r.ctlMem) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(r.ctlMem))
	}
	if err != nil && r.flushFailed.CompareAndSwap(false, true) {
		r.opts.Logger.Error(err, "pxn could not write its control file; peers take this rank for gone until a write succeeds", "registry", r.d.path, "rank", r.Name())
	} else if err == nil {
		r.flushFailed.Store(false)
	}
}

func (r *Rank) exportHandle() error {
	h, err := r.arena.Export()
	if _, byLane := r.arena.(staging.LaneFDArena); byLane && !r.opts.NoArenaSocket && errors.Is(err, staging.ErrNoHandle) {
		// Shared by descriptor alone; serveArena must then succeed.
		r.ctl.Header.ArenaShares &^= staging.ShareIPCHandle
		return nil
	}
	if err != nil {
		if r.opts.NoArenaSocket {
			return fmt.Errorf("%w, and NoArenaSocket leaves no other way to share it", err)
		}
		return err
	}
	r.ctl.Header.IPCHandle = h
	return nil
}

// serveArena opens the arena socket, where senders claim lanes; when the
// arena can hand out its lanes' descriptors the claims carry them, and
// the header says so (staging.ShareLaneFD). Without the socket no sender
// can claim a lane of this rank.
func (r *Rank) serveArena() error {
	if la, ok := r.arena.(staging.LaneFDArena); ok && !r.opts.NoArenaSocket {
		r.laneArena = la
		r.renewer, _ = la.(staging.LaneRenewer)
	}
	srv, err := startArenaServer(r.d, folder.SockFileName(r.id), r, r.opts.Logger)
	if err != nil {
		r.laneArena, r.renewer = nil, nil
		return err
	}
	r.server = srv
	if r.laneArena != nil {
		r.ctl.Header.ArenaShares |= staging.ShareLaneFD
	}
	r.pushUndo(srv.close)
	return nil
}

// publish makes the rank visible: READY is stored while the file still has
// its temporary name, and the rename is the only step peers can observe.
func (r *Rank) publish(ctx context.Context) error {
	return r.d.withLock(ctx, func() error {
		r.ctl.Header.StoreState(staging.StateReady)
		r.beat(staging.MonoNanos())
		tmp, name := folder.TmpFileName(r.id), r.Name()
		if err := unix.Renameat2(r.d.fd(), tmp, r.d.fd(), name, unix.RENAME_NOREPLACE); err != nil {
			r.ctl.Header.StoreState(staging.StateInit)
			r.flushControl()
			return &os.LinkError{Op: "renameat2", Old: tmp, New: name, Err: err}
		}
		r.laneMu.Lock()
		r.accepting = true
		r.laneMu.Unlock()
		return nil
	})
}
