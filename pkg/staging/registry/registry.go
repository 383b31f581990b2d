// SPDX-License-Identifier: Apache-2.0

// Package registry is how the ranks of one job on one node find each other:
// a private directory per group, a control file per rank (the shared-memory
// ABI of package staging) and a staging arena, published READY once whole.
// A Rank lists its peers, claims a lane on a peer (PeerLink, which hands out
// the lane's staging.SenderLane) and hands out the staging.RelayLane of each
// of its own inbound lanes. See docs/registry.md.
package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/staging"
)

const (
	// heartbeatPeriod is how often Heartbeat stamps the control file.
	heartbeatPeriod = 100 * time.Millisecond
	// registryHeartbeatTimeout and registryDrainTimeout are the defaults of
	// Options.HeartbeatTimeout and Options.DrainTimeout.
	registryHeartbeatTimeout = 3000 * time.Millisecond
	registryDrainTimeout     = 10 * time.Second
	// leasePoll is how often Close looks at its inbound lanes while it
	// waits for their leases to end.
	leasePoll = 10 * time.Millisecond
)

var (
	// ErrTooManyPeers: the group holds more valid ranks than a relay has
	// lanes. PXN is off for the process that sees it; it sends direct.
	ErrTooManyPeers = errors.New("more valid peers than a relay has lanes")
	// ErrNoFreeLane: every lane of the peer is held by a live sender.
	ErrNoFreeLane = errors.New("no free lane on the peer")
	// ErrPeerGone: the peer revoked READY, restarted or disappeared.
	ErrPeerGone = errors.New("peer is closing or gone")
	// ErrLeaseHeld: Close gave up waiting for live senders to release
	// their lanes; the arena stays allocated until the process exits.
	ErrLeaseHeld = errors.New("inbound lanes are still leased")
	// ErrRankClosed: the Rank was closed.
	ErrRankClosed = errors.New("rank is closed")
	// ErrLockBusy: a no-wait call (TryAppendPeers, TryAttach) found the
	// registry lock held by someone else and did nothing that needs it;
	// the caller tries again later.
	ErrLockBusy = errors.New("registry lock is busy")
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
	// StepRegisterMemory hands the arena to Options.Memory.
	StepRegisterMemory
	// StepExportHandle puts the arena's export handle into the header.
	StepExportHandle
	// StepServeArena opens the arena socket, when the arena can hand out
	// descriptors (staging.FDArena).
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
		return "serve arena descriptors"
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

// Options configures Register.
type Options struct {
	// Root holds the group directories (MC_PXN_REGISTRY_ROOT).
	Root string
	// Group names the job (MC_PXN_GROUP_ID).
	Group string
	// UID must be the process's effective uid: the directory is named after
	// it, and everything in it must be owned by it.
	UID int
	// Rail is this rank's canonical rail, 1..48 bytes; HCA its NIC, up to
	// 56 bytes.
	Rail string
	HCA  string
	// HeartbeatTimeout makes a peer (and a lane owner) stale when its
	// heartbeat is older; default 3 s, at least 200 ms.
	HeartbeatTimeout time.Duration
	// DrainTimeout bounds how long Close waits for senders to release the
	// lanes they hold on this rank; default 10 s.
	DrainTimeout time.Duration
	// Arenas allocates this rank's arena and maps peers'; default
	// HostArenas.
	Arenas staging.ArenaProvider
	// Memory, when set, registers the arena with the NIC after allocation.
	Memory staging.MemoryRegistrar
	// NoArenaSocket keeps the rank from serving descriptors of its arena
	// even when the arena can hand them out: peers then map it by its
	// handle only.
	NoArenaSocket bool
	// Device names the memory the arena lives in, up to 48 bytes (a GPU's
	// PCI bus id or UUID), for the rank's counters block. Empty: the
	// provider's name for it (DeviceNamer), else "host" for host memory.
	Device string
	// Logger receives the registry's few log lines (one per event: a rank
	// published, PXN turned off, a peer refused, a lane reclaimed); the
	// zero Logger discards them.
	Logger klog.Logger
}

func (o *Options) fill() error {
	switch {
	case o.Root == "":
		return errors.New("registry root is empty")
	case o.UID != os.Geteuid():
		return fmt.Errorf("uid %d is not the effective uid %d", o.UID, os.Geteuid())
	case o.Rail == "" || len(o.Rail) > len(staging.Header{}.Rail) || strings.IndexByte(o.Rail, 0) >= 0:
		return fmt.Errorf("rail %q: want 1..%d bytes, no NUL", o.Rail, len(staging.Header{}.Rail))
	case len(o.HCA) > len(staging.Header{}.HCA) || strings.IndexByte(o.HCA, 0) >= 0:
		return fmt.Errorf("HCA %q: want at most %d bytes, no NUL", o.HCA, len(staging.Header{}.HCA))
	case o.HeartbeatTimeout < 0 || o.HeartbeatTimeout > 0 && o.HeartbeatTimeout < 2*heartbeatPeriod:
		return fmt.Errorf("heartbeat timeout %v: want at least %v", o.HeartbeatTimeout, 2*heartbeatPeriod)
	case o.DrainTimeout < 0:
		return fmt.Errorf("drain timeout %v is negative", o.DrainTimeout)
	case len(o.Device) > len(staging.RankStats{}.Device) || strings.IndexByte(o.Device, 0) >= 0:
		return fmt.Errorf("device %q: want at most %d bytes, no NUL", o.Device, len(staging.RankStats{}.Device))
	}
	if err := checkGroupName(o.Group); err != nil {
		return err
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = registryHeartbeatTimeout
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = registryDrainTimeout
	}
	if o.Arenas == nil {
		o.Arenas = HostArenas{}
	}
	return nil
}

// Rank is this process's registration in its group: the registry
// directory, the staging arena and the control file that peers map.
type Rank struct {
	id staging.Identity
	// ns is the PID namespace id's pid and start time belong to.
	ns    staging.PidNS
	opts  Options
	d     *registryDir
	arena staging.Arena
	// ctl points into the shared mapping ctlMem; the header's State and
	// Heartbeat and every lane word are read by other processes.
	ctlMem []byte
	ctl    *staging.ControlBlock
	// inbound are the relay endpoints of ctl's lanes; their user (the
	// pump) owns them.
	inbound [staging.LaneCount]*staging.RelayLane
	// undo holds the teardown of each completed init step, in order.
	// Register and Close run it backwards from one goroutine.
	undo        []func() error
	quarantined bool
	lastBeat    atomic.Int64
	// server hands out descriptors of the arena; nil when it does not.
	server *arenaServer

	mu      sync.Mutex
	closed  bool
	off     error
	links   map[*PeerLink]struct{}
	refused map[string]bool
	// shareSaid names the peers whose arena mapping was logged;
	// importFailed holds, per peer, why its arena could not be mapped
	// the way it should be: that peer is not attached to again.
	shareSaid    map[string]bool
	importFailed map[string]error
	// pending are attaches waiting for a peer's descriptor.
	pending map[staging.Identity]*pendingAttach
	// unreleased are closed links whose lane release found the lock busy:
	// their control mapping stays until a later call releases the lane.
	unreleased []*PeerLink

	// scanMu serializes Peers calls and guards what they keep in scan.
	scanMu sync.Mutex
	scan   peerScan

	// hooks is nil in production.
	hooks *hooks
}

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
	id, err := newIdentity()
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
		removed, why, err := d.cleanStale(r.id, judge{self: r.ns, timeout: r.opts.HeartbeatTimeout})
		if len(removed) > 0 {
			r.opts.Logger.Info("pxn removed stale registry entries", "registry", d.path, "entries", removed, "reasons", why)
		}
		return err
	})
}

func (r *Rank) allocateArena() error {
	a, err := r.opts.Arenas.Allocate(r.d.dir, arenaFileName(r.id))
	if err != nil {
		return err
	}
	if a.Size() < staging.ArenaSize || a.Kind() != r.opts.Arenas.Kind() {
		err := fmt.Errorf("arena of kind %d and %d bytes, want kind %d and %d bytes", a.Kind(), a.Size(), r.opts.Arenas.Kind(), uint64(staging.ArenaSize))
		return errors.Join(err, a.Close())
	}
	r.arena = a
	r.pushUndo(func() error {
		if r.quarantined {
			return nil
		}
		return a.Close()
	})
	return nil
}

// quarantine keeps the arena allocated (and its file, for a host arena)
// until the process exits: a NIC may still hold part of it.
func (r *Rank) quarantine(why error) {
	r.quarantined = true
	r.opts.Logger.Error(why, "pxn arena quarantined until the process exits", "registry", r.d.path, "base", r.arena.Base())
}

func (r *Rank) registerMemory() error {
	m := r.opts.Memory
	if m == nil {
		return nil
	}
	base, size := r.arena.Base(), r.arena.Size()
	if err := m.Register(base, size); err != nil {
		r.quarantine(err)
		return fmt.Errorf("%w (arena quarantined)", err)
	}
	r.pushUndo(func() error {
		if err := m.Deregister(base, size); err != nil {
			r.quarantine(err)
			return fmt.Errorf("deregister arena: %w (arena quarantined)", err)
		}
		return nil
	})
	return nil
}

func (r *Rank) createControl() error {
	name := tmpFileName(r.id)
	fd, err := createPrivate(r.d.fd(), r.d.path, name)
	if err != nil {
		return err
	}
	mem, err := sizeAndMap(fd, int(staging.ControlSize))
	unix.Close(fd)
	if err != nil {
		unix.Unlinkat(r.d.fd(), name, 0)
		return fmt.Errorf("control file %s: %w", name, err)
	}
	r.ctlMem = mem
	r.ctl = (*staging.ControlBlock)(unsafe.Pointer(&mem[0]))
	for i := range r.inbound {
		r.inbound[i] = staging.NewRelayLane(&r.ctl.Lanes[i])
	}
	r.ctl.Header = newHeader(r.id, r.ns, r.opts.UID, r.opts.Rail, r.opts.HCA, r.opts.Arenas.Kind())
	if err := r.ctl.Stats.SetDevice(r.opts.deviceName()); err != nil {
		r.opts.Logger.Info("pxn rank names no device in its counters", "registry", r.d.path, "err", err.Error())
	}
	r.pushUndo(func() error {
		if r.quarantined {
			// The control file stays with the arena, so that others judge
			// the arena by the namespace it names until the process exits.
			return nil
		}
		err := unix.Munmap(mem)
		r.ctl, r.ctlMem, r.inbound = nil, nil, [staging.LaneCount]*staging.RelayLane{}
		// Published, the file was renamed; revoked, renamed back.
		if uerr := unix.Unlinkat(r.d.fd(), name, 0); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
			err = errors.Join(err, uerr)
		}
		return err
	})
	return nil
}

func sizeAndMap(fd, size int) ([]byte, error) {
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, fmt.Errorf("ftruncate: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return mem, nil
}

func (r *Rank) exportHandle() error {
	h, err := r.arena.Export()
	if _, fd := r.arena.(staging.FDArena); fd && !r.opts.NoArenaSocket && errors.Is(err, staging.ErrNoHandle) {
		// Shared by descriptor alone; serveArena must then succeed.
		r.ctl.Header.ArenaShares &^= staging.ShareIPCHandle
		return nil
	}
	if err != nil {
		return err
	}
	r.ctl.Header.IPCHandle = h
	return nil
}

// serveArena opens the arena socket when the arena can hand out
// descriptors, and says so in the header (staging.ShareFD). A socket that
// cannot be opened leaves the handle as the only way, when there is one.
func (r *Rank) serveArena() error {
	fa, ok := r.arena.(staging.FDArena)
	if !ok || r.opts.NoArenaSocket {
		return nil
	}
	srv, err := startArenaServer(r.d, sockFileName(r.id), r.ctl, r.ns, fa, r.arena.Size(), r.opts.Logger)
	if err != nil {
		if r.ctl.Header.ArenaShares&staging.ShareIPCHandle == 0 {
			return err
		}
		r.opts.Logger.Error(err, "pxn arena socket not served; peers map the arena by its handle", "registry", r.d.path)
		return nil
	}
	r.server = srv
	r.ctl.Header.ArenaShares |= staging.ShareFD
	r.pushUndo(srv.close)
	return nil
}

// ServeStats counts what this rank's arena socket did; zero when it
// serves none.
func (r *Rank) ServeStats() ServeStats {
	if r.server == nil {
		return ServeStats{}
	}
	return r.server.stats()
}

// publish makes the rank visible: READY is stored while the file still has
// its temporary name, and the rename is the only step peers can observe.
func (r *Rank) publish(ctx context.Context) error {
	return r.d.withLock(ctx, func() error {
		r.beat(staging.MonoNanos())
		r.ctl.Header.StoreState(staging.StateReady)
		tmp, name := tmpFileName(r.id), r.Name()
		if err := unix.Renameat2(r.d.fd(), tmp, r.d.fd(), name, unix.RENAME_NOREPLACE); err != nil {
			r.ctl.Header.StoreState(staging.StateInit)
			return &os.LinkError{Op: "renameat2", Old: tmp, New: name, Err: err}
		}
		return nil
	})
}

// Identity is this registration's identity.
func (r *Rank) Identity() staging.Identity { return r.id }

// Name is the published name of this rank's control file.
func (r *Rank) Name() string { return rankFileName(r.id) }

// Dir is the path of the group's registry directory.
func (r *Rank) Dir() string { return r.d.path }

// Inbound is the relay endpoint of this rank's inbound lane i, valid until
// Close. One goroutine (the pump) uses it.
func (r *Rank) Inbound(i int) *staging.RelayLane { return r.inbound[i] }

// Header is this rank's header inside Control.
func (r *Rank) Header() *staging.Header { return &r.ctl.Header }

// Wake is this rank's wake word, in its control file's header.
func (r *Rank) Wake() *staging.WakeWord { return &r.ctl.Header.Wake }

// Arena is this rank's staging arena, freed by Close.
func (r *Rank) Arena() staging.Arena { return r.arena }

// Heartbeat stamps the header with now, a MonoNanos reading, unless the last
// stamp is younger than 100 ms; it reports whether it wrote. The pump calls
// it every round, never concurrently with or after Close.
func (r *Rank) Heartbeat(now int64) bool {
	if now-r.lastBeat.Load() < int64(heartbeatPeriod) {
		return false
	}
	r.beat(now)
	return true
}

func (r *Rank) beat(now int64) {
	r.lastBeat.Store(now)
	r.ctl.Header.StoreHeartbeat(uint64(now))
}

// Off returns why PXN is off for this process (an unsafe registry, more
// valid peers than lanes), or nil while it is on.
func (r *Rank) Off() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.off
}

// turnOff records the first reason PXN goes off, says so once, and returns
// that first reason.
func (r *Rank) turnOff(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.off == nil {
		r.off = err
		r.opts.Logger.Error(err, "PXN off for this process, sending direct", "registry", r.d.path, "rank", r.Name())
	}
	return r.off
}

func (r *Rank) usable() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrRankClosed
	}
	return r.off
}

// PeerInfo is a validated copy of another rank's header.
type PeerInfo struct {
	// Name is the peer's control file in the registry directory.
	Name string
	staging.Identity
	Rail      string
	HCA       string
	State     uint32
	ArenaKind uint32
	// PidNS is the PID namespace the peer's pid and start time belong to.
	PidNS staging.PidNS
	// ArenaShares says how the peer's arena may be mapped
	// (staging.ShareIPCHandle, staging.ShareFD).
	ArenaShares uint32
	// HeartbeatAge is how old the peer's heartbeat was when read.
	HeartbeatAge time.Duration
	// Refused is non-nil for a peer that must not be used, and says why:
	// a *MismatchError for other engine numbers, ErrCorruptEntry for
	// garbage. Traffic to its rail goes direct.
	Refused error
}

// Peers lists the other published ranks of the group. Stale ones (exited,
// pid reused) are left out and their files removed; ranks whose heartbeat is
// older than the timeout are left out but keep their files. Inbound lanes
// of this rank whose sender exited are freed.
// More than LaneCount usable peers, or an unsafe registry, turn PXN off for
// the process: Peers then returns that error, now and later.
func (r *Rank) Peers(ctx context.Context) ([]PeerInfo, error) {
	return r.AppendPeers(ctx, nil)
}

// AppendPeers is Peers appending to dst; on error dst comes back as it was.
// While the group does not change it allocates nothing once dst has room:
// it stats the directory, reads each peer's header through a descriptor
// kept open and polls the peers' processes, and lists the directory again
// only when its stat moved, or at least every second. Calls are
// serialized.
func (r *Rank) AppendPeers(ctx context.Context, dst []PeerInfo) ([]PeerInfo, error) {
	return r.appendPeers(ctx, dst, true)
}

// TryAppendPeers is AppendPeers for a caller that must never wait on
// another process (the pump): the stale cleanup and the lane releases left
// over from CloseNoWait run only when the registry lock is free at once,
// and are otherwise left for a later call; the list itself needs no lock.
func (r *Rank) TryAppendPeers(dst []PeerInfo) ([]PeerInfo, error) {
	if err := r.expirePending(false, false); err != nil {
		r.opts.Logger.Error(err, "pxn lane release of an abandoned attach failed", "registry", r.d.path)
	}
	if err := r.flushReleases(context.Background(), false); err != nil {
		r.opts.Logger.Error(err, "pxn lane release of a closed link failed", "registry", r.d.path)
	}
	return r.appendPeers(context.Background(), dst, false)
}

func (r *Rank) appendPeers(ctx context.Context, dst []PeerInfo, wait bool) ([]PeerInfo, error) {
	r.scanMu.Lock()
	defer r.scanMu.Unlock()
	s := &r.scan
	start := len(dst)
	if err := r.usable(); err != nil {
		s.release()
		return dst, err
	}
	if err := s.refresh(r.d, r.id); err != nil {
		s.release()
		return dst, r.turnOff(err)
	}
	deadOwner := s.checkProcs(r.d, r.ctl, r.opts.HeartbeatTimeout)
	now := staging.MonoNanos()
	sawStale := false
	for _, e := range s.entries {
		if e.proc == nil {
			// This rank's own entries, the lock, other names.
			continue
		}
		if e.proc.gone != "" {
			// A control file, an arena or a .tmp left by an exited process
			// (a relay whose close gave up on a lease, a rank killed
			// during init).
			sawStale = true
			continue
		}
		if e.kind != entryRank {
			continue
		}
		p, late, ok := r.readEntry(e, now)
		switch {
		case !ok || late:
		case p.Refused != nil || p.State == staging.StateReady:
			dst = append(dst, p)
		}
	}
	if sawStale || deadOwner {
		j := judge{self: r.ns, timeout: r.opts.HeartbeatTimeout, obs: s}
		err := r.d.lockFor(ctx, wait, func() error {
			r.freeDeadLanes(j)
			removed, why, err := r.d.cleanStale(r.id, j)
			if len(removed) > 0 {
				r.opts.Logger.Info("pxn removed stale registry entries", "registry", r.d.path, "entries", removed, "reasons", why)
			}
			return err
		})
		s.trusted = false
		var unsafeErr *UnsafeError
		if errors.As(err, &unsafeErr) {
			s.release()
			return dst[:start], r.turnOff(err)
		}
		if err != nil && err != ErrLockBusy {
			r.opts.Logger.V(2).Info("pxn stale cleanup deferred", "registry", r.d.path, "err", err)
		}
	}
	usable := 0
	for _, p := range dst[start:] {
		if p.Refused == nil {
			usable++
		} else {
			r.sayRefused(p)
		}
	}
	if usable > staging.LaneCount {
		s.release()
		return dst[:start], r.turnOff(fmt.Errorf("%w: %d valid peers in %s, at most %d", ErrTooManyPeers, usable, r.d.path, staging.LaneCount))
	}
	return dst, nil
}

func (r *Rank) sayRefused(p PeerInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.refused[p.Name] {
		r.refused[p.Name] = true
		r.opts.Logger.Error(p.Refused, "pxn refusing peer; its rail goes direct", "registry", r.d.path, "peer", p.Name)
	}
}

// readEntry reads the header of the control file of e through the
// descriptor kept for it, opened on first sight, and validates it again
// only when its bytes changed. late reports a peer whose heartbeat is older
// than the timeout; !ok one whose file is gone.
func (r *Rank) readEntry(e *scanEntry, now int64) (p PeerInfo, late, ok bool) {
	s := &r.scan
	if e.fd < 0 && !e.final {
		fd, st, err := openPrivate(r.d.fd(), r.d.path, e.name, unix.O_RDONLY, r.d.uid)
		if errors.Is(err, fs.ErrNotExist) {
			s.trusted = false
			return p, false, false
		}
		if err != nil {
			// Only another file under this name can end an unsafe type;
			// anything else is tried again next call.
			var unsafeErr *UnsafeError
			e.final = errors.As(err, &unsafeErr)
			e.info = PeerInfo{Name: e.name, Identity: e.id, Refused: fmt.Errorf("peer %s: %w", e.name, err)}
			return e.info, false, true
		}
		e.fd, e.ino, e.size, e.loaded = fd, st.Ino, st.Size, false
	}
	if e.fd < 0 {
		return e.info, false, true
	}
	s.hdr = staging.Header{}
	n, err := preadUpTo(e.fd, s.headerBytes())
	if err != nil {
		e.loaded = false
		err = fmt.Errorf("%w: %s: %v", ErrCorruptEntry, e.name, err)
		return PeerInfo{Name: e.name, Identity: e.id, Refused: fmt.Errorf("peer %s: %w", e.name, err)}, false, true
	}
	if !e.loaded || n != e.n || !sameHeader(&s.hdr, &e.hdr) {
		e.hdr, e.n, e.loaded = s.hdr, n, true
		e.info = r.peerInfo(e.name, e.id, e.size, s.headerBytes()[:n])
	}
	if e.info.Refused != nil {
		return e.info, false, true
	}
	hb := s.hdr.Heartbeat
	if heartbeatStale(hb, now, r.opts.HeartbeatTimeout) {
		return p, true, true
	}
	p = e.info
	p.HeartbeatAge = max(time.Duration(now-int64(hb)), 0)
	return p, false, true
}

// peerInfo validates the first bytes b of control file name, of size
// bytes, registered as id.
func (r *Rank) peerInfo(name string, id staging.Identity, size int64, b []byte) PeerInfo {
	p := PeerInfo{Name: name, Identity: id}
	var h staging.Header
	err := checkControlSize(name, size)
	if err == nil && len(b) < int(headerSize) {
		err = fmt.Errorf("%w: %s: short read", ErrCorruptEntry, name)
	}
	if err == nil {
		h, err = decodeHeader(b)
	}
	switch {
	case err != nil:
	case headerIdentity(&h) != id:
		err = fmt.Errorf("%w: header names %v", ErrCorruptEntry, headerIdentity(&h))
	case int(h.UID) != r.d.uid:
		err = fmt.Errorf("%w: header uid %d in a registry of uid %d", ErrCorruptEntry, h.UID, r.d.uid)
	case h.ArenaKind != r.opts.Arenas.Kind():
		err = &MismatchError{Field: "arena kind", Theirs: uint64(h.ArenaKind), Ours: uint64(r.opts.Arenas.Kind())}
	}
	if err != nil {
		p.Refused = fmt.Errorf("peer %s: %w", name, err)
		return p
	}
	p.Rail, p.HCA = headerRail(&h), headerHCA(&h)
	p.State, p.ArenaKind = h.State, h.ArenaKind
	p.PidNS, p.ArenaShares = headerNS(&h), h.ArenaShares
	return p
}

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

	var errs []error
	if err := r.expirePending(true, true); err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		if err := l.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.DrainTimeout)
	defer cancel()
	if err := r.flushReleases(ctx, true); err != nil {
		errs = append(errs, err)
	}
	if err := r.revoke(ctx); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if err := r.waitLeases(ctx); err != nil {
		r.quarantine(err)
		return errors.Join(append(errs, err)...)
	}
	if err := r.unwind(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// BeginClose marks the rank CLOSING ahead of Close, while its pump still
// runs: no sender attaches any more, attached senders publish no new
// tickets, wait for the ones they published and release their lanes, which
// Leases then shows.
func (r *Rank) BeginClose() { r.ctl.Header.StoreState(staging.StateClosing) }

// revoke withdraws READY. CLOSING is stored first so attached senders stop
// at once; the control file goes back to its temporary name under the lock
// that Attach holds while it checks READY and claims a lane, so a claim is
// either seen by waitLeases or never made. The file itself stays until the
// arena is gone, naming the namespace by which others judge the arena.
func (r *Rank) revoke(ctx context.Context) error {
	r.ctl.Header.StoreState(staging.StateClosing)
	return r.d.withLock(ctx, func() error {
		name, tmp := r.Name(), tmpFileName(r.id)
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
