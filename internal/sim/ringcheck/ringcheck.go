// SPDX-License-Identifier: Apache-2.0

// Package ringcheck runs PXN's GPU first hop through a real two-process
// ring: a relay process owns a gpu arena and a control block in shared
// memory, and a sender process opens both and pushes Pieces into one lane
// with gpu.Copier through the lane's endpoints (staging.SenderLane and
// staging.RelayLane), so the ring runs the engine's lane protocol.
// The relay checks every Piece's bytes once its doorbell shows the Piece's
// seq, so a doorbell that lands before its data fails the run. pkg/gpu's
// tests and cmd/pxn-gpucheck use it; it needs a CUDA driver.
package ringcheck

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// RoleEnv names the variable that makes a re-executed binary the relay.
const RoleEnv = "PXN_RINGCHECK_ROLE"

// Config describes one ring run; the relay gets it through its environment.
type Config struct {
	// RelayDevice and SenderDevice are device ordinals.
	RelayDevice  int
	SenderDevice int
	// ControlPath is the file of the ring's lane words (its sender and
	// relay blocks side by side); it must not exist. Use a tmpfs
	// (/dev/shm): pinning file pages elsewhere can fail.
	ControlPath string
	Lane        int
	Pieces      int
	// PieceLen bytes per Piece (at most staging.SlotSize), cut into
	// Entries entries of equal length.
	PieceLen int
	Entries  int
	// Verify makes the sender write a per-seq pattern on a source stream
	// gated by a ready event, and the relay check it: every Piece, or,
	// with VerifyPeriod set, the first VerifyCount of every VerifyPeriod
	// (so a benchmark can check its warm-up Pieces and time the rest).
	Verify       bool
	VerifyPeriod int
	VerifyCount  int
	Timeout      time.Duration
}

// verifies reports whether Piece seq is checked.
func (c Config) verifies(seq uint64) bool {
	if !c.Verify {
		return false
	}
	if c.VerifyPeriod <= 0 {
		return true
	}
	return int((seq-1)%uint64(c.VerifyPeriod)) < c.VerifyCount
}

func (c Config) env() []string {
	return []string{
		RoleEnv + "=relay",
		"PXN_RINGCHECK_DEVICE=" + strconv.Itoa(c.RelayDevice),
		"PXN_RINGCHECK_CONTROL=" + c.ControlPath,
		"PXN_RINGCHECK_LANE=" + strconv.Itoa(c.Lane),
		"PXN_RINGCHECK_PIECES=" + strconv.Itoa(c.Pieces),
		"PXN_RINGCHECK_LEN=" + strconv.Itoa(c.PieceLen),
		"PXN_RINGCHECK_ENTRIES=" + strconv.Itoa(c.Entries),
		"PXN_RINGCHECK_VERIFY=" + strconv.FormatBool(c.Verify),
		"PXN_RINGCHECK_VERIFY_PERIOD=" + strconv.Itoa(c.VerifyPeriod),
		"PXN_RINGCHECK_VERIFY_COUNT=" + strconv.Itoa(c.VerifyCount),
		"PXN_RINGCHECK_TIMEOUT=" + c.Timeout.String(),
	}
}

func configFromEnv() (Config, error) {
	var c Config
	var errs []error
	num := func(k string) int {
		v, err := strconv.Atoi(os.Getenv(k))
		errs = append(errs, err)
		return v
	}
	c.RelayDevice = num("PXN_RINGCHECK_DEVICE")
	c.ControlPath = os.Getenv("PXN_RINGCHECK_CONTROL")
	c.Lane = num("PXN_RINGCHECK_LANE")
	c.Pieces = num("PXN_RINGCHECK_PIECES")
	c.PieceLen = num("PXN_RINGCHECK_LEN")
	c.Entries = num("PXN_RINGCHECK_ENTRIES")
	c.Verify = os.Getenv("PXN_RINGCHECK_VERIFY") == "true"
	c.VerifyPeriod = num("PXN_RINGCHECK_VERIFY_PERIOD")
	c.VerifyCount = num("PXN_RINGCHECK_VERIFY_COUNT")
	t, err := time.ParseDuration(os.Getenv("PXN_RINGCHECK_TIMEOUT"))
	c.Timeout = t
	errs = append(errs, err)
	return c, errors.Join(errs...)
}

func (c Config) check() error {
	switch {
	case c.Lane < 0 || c.Lane >= staging.LaneCount:
		return fmt.Errorf("ringcheck: lane %d", c.Lane)
	case c.PieceLen <= 0 || c.PieceLen > staging.SlotSize || c.PieceLen%4 != 0:
		return fmt.Errorf("ringcheck: piece length %d", c.PieceLen)
	case c.Entries <= 0 || c.Entries > staging.MaxPlans || c.PieceLen%(4*c.Entries) != 0:
		return fmt.Errorf("ringcheck: %d entries of a %d-byte piece", c.Entries, c.PieceLen)
	case c.Pieces <= 0 || c.Timeout <= 0 || c.ControlPath == "":
		return fmt.Errorf("ringcheck: incomplete config %+v", c)
	}
	return nil
}

// pattern is the 32-bit word that fills entry chunk c of Piece seq. The
// sender writes chunk c of the source and copies it to chunk Entries-1-c of
// the slot, so a misplaced entry shows too.
func pattern(seq uint64, c int) uint32 {
	return 0xa5000000 ^ uint32(seq)<<8 ^ uint32(c)
}

// IsRelay reports whether this process was started as the relay.
func IsRelay() bool { return os.Getenv(RoleEnv) == "relay" }

// RelayMain runs the relay described by the environment, writing its
// protocol lines to stdout; a re-executed binary calls it and exits with 1
// on error.
func RelayMain() error {
	cfg, err := configFromEnv()
	if err != nil {
		return err
	}
	return runRelay(cfg, os.Stdout)
}

// ringWords are the words of the ring's one lane, both blocks of a claim
// side by side in the file the two processes map.
type ringWords struct {
	Sender staging.LaneSenderBlock
	Relay  staging.LaneRelayBlock
}

func mapControl(path string, create bool) ([]byte, *ringWords, error) {
	flags := unix.O_RDWR | unix.O_CLOEXEC | unix.O_NOFOLLOW
	if create {
		flags |= unix.O_CREAT | unix.O_EXCL
	}
	fd, err := unix.Open(path, flags, 0o600)
	if err != nil {
		return nil, nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if create {
		if err := unix.Ftruncate(fd, int64(unsafe.Sizeof(ringWords{}))); err != nil {
			return nil, nil, &os.PathError{Op: "ftruncate", Path: path, Err: err}
		}
	}
	mem, err := unix.Mmap(fd, 0, int(unsafe.Sizeof(ringWords{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	return mem, (*ringWords)(unsafe.Pointer(&mem[0])), nil
}

func runRelay(cfg Config, out io.Writer) error {
	if err := cfg.check(); err != nil {
		return err
	}
	runtime.LockOSThread()
	d, err := cuda.Load()
	if err != nil {
		return err
	}
	defer d.Close()
	g, err := gpu.Open(d, cfg.RelayDevice)
	if err != nil {
		return err
	}
	defer g.Close()
	if err := d.CtxSetCurrent(g.Context()); err != nil {
		return err
	}
	// The ring hands its sender the arena's handle, not a descriptor.
	a, err := gpu.NewArenasWith(g, gpu.ArenaOptions{Share: gpu.ShareLegacyIPC}).Allocate(nil, "")
	if err != nil {
		return err
	}
	defer a.Close()
	mem, ctl, err := mapControl(cfg.ControlPath, true)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	h, err := a.Export()
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(out, "handle %s\n", hex.EncodeToString(h[:])); err != nil {
		return err
	}
	// The ring has one sender and no registry: the relay offers the
	// claim to itself, under the ring's epoch.
	rx := staging.NewRelayLane()
	rx.Offer(&staging.LaneWords{Epoch: ringEpoch, Sender: &ctl.Sender, Relay: &ctl.Relay, WakeFD: -1, Free: func() {}})
	var vd staging.ValidDesc
	chunk := cfg.PieceLen / cfg.Entries
	got := make([]byte, cfg.PieceLen)
	deadline := time.Now().Add(cfg.Timeout)
	for seq := uint64(1); seq <= uint64(cfg.Pieces); seq++ {
		slot := staging.SlotOf(seq)
		epoch, next, st := uint64(0), uint64(0), staging.TicketNone
		for spins := 0; st != staging.TicketReady; spins++ {
			epoch, _ = rx.Sync()
			// The ring's relay reads its slots itself and sends nothing
			// on: no write of an earlier epoch can still read them.
			if err := rx.Open(); err != nil {
				return fmt.Errorf("relay: %w", err)
			}
			next, st = rx.Poll()
			if spins%4096 == 0 && time.Now().After(deadline) {
				return fmt.Errorf("relay: seq %d: slot %d not ready after %v (epoch %#x, next %d, state %d)", seq, slot, cfg.Timeout, epoch, next, st)
			}
		}
		taken, err := rx.Take(&vd)
		if err != nil {
			return fmt.Errorf("relay: seq %d: %w", taken, err)
		}
		if taken != seq || vd.PieceLen() != uint64(cfg.PieceLen) {
			return fmt.Errorf("relay: took seq %d of %d bytes, want seq %d of %d", taken, vd.PieceLen(), seq, cfg.PieceLen)
		}
		if cfg.verifies(seq) {
			base := cuda.DevicePtr(a.Base()) + cuda.DevicePtr(staging.SlotOffset(cfg.Lane, slot))
			if err := d.MemcpyDtoH(got, base); err != nil {
				return err
			}
			for c := 0; c < cfg.Entries; c++ {
				want := pattern(seq, cfg.Entries-1-c)
				for off := c * chunk; off < (c+1)*chunk; off += 4 {
					if v := *(*uint32)(unsafe.Pointer(&got[off])); v != want {
						return fmt.Errorf("relay: seq %d slot %d byte %d: %#x, want %#x (doorbell before data?)", seq, slot, off, v, want)
					}
				}
			}
		}
		if err := rx.Complete(epoch, seq, staging.CompletionOK); err != nil {
			return fmt.Errorf("relay: %w", err)
		}
	}
	if _, err := fmt.Fprintln(out, "done"); err != nil {
		return err
	}
	// The sender closes its mapping of the arena before it closes our
	// stdin: the owner frees last, as the registry's leases guarantee.
	_, err = io.Copy(io.Discard, os.Stdin)
	return err
}

// RelayProc is a started relay process.
type RelayProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	Handle [staging.ArenaHandleSize]byte
	lines  *bufio.Reader
	stderr *bytes.Buffer
}

// StartRelay re-executes exe (with args, such as -test.run=^$) as the relay
// of cfg and reads its arena handle.
func StartRelay(exe string, args []string, cfg Config) (*RelayProc, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), cfg.env()...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	p := &RelayProc{cmd: cmd, stdin: stdin, lines: bufio.NewReader(stdout), stderr: &bytes.Buffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := p.lines.ReadString('\n')
	if err != nil {
		return nil, p.fail(fmt.Errorf("relay sent no handle: %w", err))
	}
	raw, err := hex.DecodeString(strings.TrimPrefix(strings.TrimSpace(line), "handle "))
	if err != nil || len(raw) != staging.ArenaHandleSize {
		return nil, p.fail(fmt.Errorf("relay sent %q, not a handle", line))
	}
	copy(p.Handle[:], raw)
	return p, nil
}

func (p *RelayProc) fail(err error) error {
	p.cmd.Process.Kill()
	p.cmd.Wait()
	return fmt.Errorf("%w\nrelay stderr:\n%s", err, p.stderr)
}

// Wait waits for the relay to finish its Pieces, lets it free its arena
// and exit, and returns its error. Close the Sender first.
func (p *RelayProc) Wait() error {
	line, _ := p.lines.ReadString('\n')
	p.stdin.Close()
	err := p.cmd.Wait()
	if err != nil || strings.TrimSpace(line) != "done" {
		return fmt.Errorf("relay: %v, last line %q\nrelay stderr:\n%s", err, line, p.stderr)
	}
	return nil
}

// Kill stops the relay.
func (p *RelayProc) Kill() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// Sender is the sending side of a ring: a copier, the relay's arena opened
// through IPC and its control block mapped and registered.
type Sender struct {
	cfg    Config
	d      *cuda.Driver
	g      *gpu.GPU
	copier *gpu.Copier
	peer   staging.PeerArena
	mem    []byte
	tx     *staging.SenderLane
	unreg  func() error

	next    uint64
	plans   []staging.PlanEntry
	src     cuda.DevicePtr
	srcN    int
	fill    cuda.Stream
	entries []relay.CopyEntry
}

// NewSender opens the sender's side. The calling goroutine must stay locked
// to its OS thread (runtime.LockOSThread) while it uses the Sender.
func NewSender(d *cuda.Driver, cfg Config, handle [staging.ArenaHandleSize]byte, opts gpu.CopierOptions) (_ *Sender, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	g, err := gpu.Open(d, cfg.SenderDevice)
	if err != nil {
		return nil, err
	}
	s := &Sender{cfg: cfg, d: d, g: g, next: 1}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if err := d.CtxSetCurrent(g.Context()); err != nil {
		return nil, err
	}
	if s.copier, err = gpu.NewCopier(g, opts); err != nil {
		return nil, err
	}
	if err := s.copier.BindThread(); err != nil {
		return nil, err
	}
	if s.peer, err = gpu.NewArenas(g).Open(nil, handle); err != nil {
		return nil, err
	}
	var ctl *ringWords
	if s.mem, ctl, err = mapControl(cfg.ControlPath, false); err != nil {
		return nil, err
	}
	if s.tx, err = staging.NewSenderLane(&ctl.Sender, &ctl.Relay, ringEpoch); err != nil {
		return nil, err
	}
	if s.unreg, err = s.copier.RegisterHost(uintptr(unsafe.Pointer(&s.mem[0])), uint64(len(s.mem))); err != nil {
		return nil, err
	}
	s.srcN = staging.SlotsPerLane + 1
	if s.src, err = d.MemAlloc(uint64(s.srcN * cfg.PieceLen)); err != nil {
		return nil, err
	}
	if s.fill, err = d.StreamCreate(cuda.StreamNonBlocking); err != nil {
		return nil, err
	}
	s.entries = make([]relay.CopyEntry, cfg.Entries)
	chunk := uint64(cfg.PieceLen / cfg.Entries)
	for i := range cfg.Entries {
		s.plans = append(s.plans, staging.PlanEntry{Dst: ringTarget + uint64(i)*chunk, Len: chunk})
	}
	return s, nil
}

// ringEpoch is the lane epoch of a ring; ringTarget and ringSession are
// what its Descs name, which no second hop reads.
const (
	ringEpoch   = 1
	ringTarget  = 1 << 40
	ringSession = "ringcheck"
)

// reap consumes every completion the relay has written.
func (s *Sender) reap() error {
	for {
		seq, st, ok := s.tx.Reap()
		if !ok {
			return nil
		}
		if st != staging.CompletionOK {
			return fmt.Errorf("sender: seq %d completed with status %d", seq, st)
		}
	}
}

// Copier is the sender's copier.
func (s *Sender) Copier() *gpu.Copier { return s.copier }

// SwitchCopier replaces the sender's copier with one made with opts: the old
// one drains and closes, the control block is registered with the new one,
// and the ring goes on at the next seq.
func (s *Sender) SwitchCopier(opts gpu.CopierOptions) error {
	if err := errors.Join(s.unreg(), s.copier.Close()); err != nil {
		s.copier, s.unreg = nil, nil
		return err
	}
	s.copier, s.unreg = nil, nil
	c, err := gpu.NewCopier(s.g, opts)
	if err != nil {
		return err
	}
	s.copier = c
	if err := c.BindThread(); err != nil {
		return err
	}
	s.unreg, err = c.RegisterHost(uintptr(unsafe.Pointer(&s.mem[0])), uint64(len(s.mem)))
	return err
}

// slotAddr is the relay-arena address of slot in the configured lane.
func (s *Sender) slotAddr(slot int) uintptr {
	return s.peer.Base() + uintptr(staging.SlotOffset(s.cfg.Lane, slot))
}

func (s *Sender) srcAddr(seq uint64) uintptr {
	return uintptr(s.src) + uintptr(int(seq%uint64(s.srcN))*s.cfg.PieceLen)
}

// Run pushes the next n Pieces through the ring (the relay expects
// cfg.Pieces in all) and returns the time from the first Copy to the
// relay's completion of the last.
func (s *Sender) Run(n int) (time.Duration, error) {
	cfg := s.cfg
	last := s.next + uint64(n) - 1
	if n <= 0 || last > uint64(cfg.Pieces) {
		return 0, fmt.Errorf("sender: %d more Pieces after %d, the relay expects %d", n, s.next-1, cfg.Pieces)
	}
	chunk := cfg.PieceLen / cfg.Entries
	deadline := time.Now().Add(cfg.Timeout)
	start := time.Now()
	for seq := s.next; seq <= last; seq++ {
		// Credit: slot(seq) is free once seq-K was reaped; the source
		// buffer of seq was last used by seq-K-1.
		for spins := 0; ; spins++ {
			if err := s.reap(); err != nil {
				return 0, err
			}
			if t, ok := s.tx.Ticket(); ok {
				if t != seq {
					return 0, fmt.Errorf("sender: ticket %d, want seq %d", t, seq)
				}
				break
			}
			if _, err := s.copier.Poll(); err != nil {
				return 0, err
			}
			if spins%4096 == 0 && time.Now().After(deadline) {
				return 0, fmt.Errorf("sender: no credit for seq %d after %v (reaped %d)", seq, cfg.Timeout, s.tx.Reaped())
			}
		}
		if err := s.tx.Commit(seq, ringSession, s.plans, uint64(cfg.PieceLen), nil); err != nil {
			return 0, fmt.Errorf("sender: %w", err)
		}
		src := s.srcAddr(seq)
		var ready relay.Event
		if cfg.verifies(seq) {
			for c := 0; c < cfg.Entries; c++ {
				if err := s.d.MemsetD32Async(cuda.DevicePtr(src)+cuda.DevicePtr(c*chunk), pattern(seq, c), uint64(chunk/4), s.fill); err != nil {
					return 0, err
				}
			}
			var err error
			if ready, err = s.copier.RecordReady(uintptr(s.fill)); err != nil {
				return 0, err
			}
		}
		dst := s.slotAddr(staging.SlotOf(seq))
		for i := range s.entries {
			s.entries[i] = relay.CopyEntry{Src: src + uintptr((cfg.Entries-1-i)*chunk), Dst: dst + uintptr(i*chunk), Len: uint64(chunk)}
		}
		err := s.copier.Copy(cfg.Lane, ready, s.entries, s.tx.ReadyWord(seq), seq)
		if ready != 0 {
			s.copier.Release(ready)
		}
		if err != nil {
			return 0, err
		}
		if err := s.tx.Publish(seq); err != nil {
			return 0, fmt.Errorf("sender: %w", err)
		}
		if _, err := s.copier.Poll(); err != nil {
			return 0, err
		}
	}
	for spins := 0; s.tx.Reaped() != last; spins++ {
		if err := s.reap(); err != nil {
			return 0, err
		}
		if _, err := s.copier.Poll(); err != nil {
			return 0, err
		}
		if spins%4096 == 0 && time.Now().After(deadline) {
			return 0, fmt.Errorf("sender: relay completed %d of %d Pieces in %v", s.tx.Reaped(), last, cfg.Timeout)
		}
	}
	s.next = last + 1
	return time.Since(start), nil
}

// Raw copies pieces Pieces of cfg.PieceLen bytes into the relay's lane
// slots with one cuMemcpyAsync each on one stream, with no doorbell or
// credit, and returns the time until the stream has drained: the copy
// engine's own rate, the baseline of a ring run.
func (s *Sender) Raw(pieces int) (time.Duration, error) {
	st, err := s.d.StreamCreate(cuda.StreamNonBlocking)
	if err != nil {
		return 0, err
	}
	defer s.d.StreamDestroy(st)
	start := time.Now()
	for i := 0; i < pieces; i++ {
		seq := uint64(i + 1)
		if err := s.d.MemcpyAsync(cuda.DevicePtr(s.slotAddr(staging.SlotOf(seq))), cuda.DevicePtr(s.srcAddr(seq)), uint64(s.cfg.PieceLen), st); err != nil {
			return 0, err
		}
	}
	if err := s.d.StreamSynchronize(st); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// Close frees the sender's side.
func (s *Sender) Close() error {
	var errs []error
	if s.fill != 0 {
		errs = append(errs, s.d.StreamDestroy(s.fill))
	}
	if s.copier != nil {
		errs = append(errs, s.copier.Close())
	}
	if s.unreg != nil {
		errs = append(errs, s.unreg())
	}
	if s.src != 0 {
		errs = append(errs, s.d.MemFree(s.src))
	}
	if s.peer != nil {
		errs = append(errs, s.peer.Close())
	}
	if s.mem != nil {
		errs = append(errs, unix.Munmap(s.mem))
	}
	errs = append(errs, s.g.Close())
	return errors.Join(errs...)
}
