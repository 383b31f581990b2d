// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/internal/sim/hostfault"
	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/internal/testhooks"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// The test binary doubles as a rank process of the fault tests: with
// faultRoleEnv set, TestMain runs that role instead of the tests. A rank
// registers in the real shared-memory registry, runs a real engine over a
// TCP hop to the parent's target server, and obeys one JSON command per
// line of stdin with one JSON answer per line of stdout.
const (
	faultRoleEnv    = "PXN_FAULT_ROLE"
	faultIndexEnv   = "PXN_FAULT_INDEX"
	faultDirEnv     = "PXN_FAULT_DIRECTORY"
	faultSrcEnv     = "PXN_FAULT_SRC_BYTES"
	faultLastSeqEnv = "PXN_FAULT_LAST_SEQ"
	// faultJoinEnv=1 lets the sender join queued Pieces into one slot.
	faultJoinEnv   = "PXN_FAULT_JOIN"
	faultTicketEnv = "PXN_FAULT_TICKET_TIMEOUT_MS"
	// faultPartsEnv replaces how long the relay waits for a Piece's later
	// parts, in milliseconds.
	faultPartsEnv = "PXN_FAULT_PARTS_WAIT_MS"
	// faultLockEnv names the file the "lock" role holds an flock on.
	faultLockEnv = "PXN_FAULT_LOCK"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(faultRoleEnv); role != "" {
		os.Exit(runFaultRole(role))
	}
	os.Exit(m.Run())
}

func runFaultRole(role string) int {
	if role == "lock" {
		if err := faultLockHolder(os.Getenv(faultLockEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "lock holder:", err)
			return 1
		}
		return 0
	}
	if role != "rank" {
		fmt.Fprintf(os.Stderr, "unknown fault role %q\n", role)
		return 2
	}
	if err := faultRank(); err != nil {
		fmt.Fprintln(os.Stderr, "fault rank:", err)
		return 1
	}
	return 0
}

// faultWrite is one write request of a rank: Len bytes from offset Src of
// its source buffer to Dst of Session.
type faultWrite struct {
	Session string `json:"session"`
	Src     uint64 `json:"src"`
	Dst     uint64 `json:"dst"`
	Len     uint64 `json:"len"`
}

type faultReq struct {
	Op string `json:"op"`
	// Reqs are the writes of a submit; Separate submits each alone (one
	// task, one Piece per write).
	Reqs      []faultWrite `json:"reqs,omitempty"`
	Separate  bool         `json:"separate,omitempty"`
	Rail      string       `json:"rail,omitempty"`
	Want      bool         `json:"want,omitempty"`
	On        bool         `json:"on,omitempty"`
	TimeoutMS int          `json:"timeout_ms,omitempty"`
}

// faultTask is one task as its rank sees it.
type faultTask struct {
	Batch       int        `json:"batch"`
	Write       faultWrite `json:"write"`
	State       string     `json:"state"`
	Route       string     `json:"route"`
	Transferred uint64     `json:"transferred"`
	Err         string     `json:"err,omitempty"`
}

type faultResp struct {
	OK        bool                  `json:"ok"`
	Err       string                `json:"err,omitempty"`
	Pid       int                   `json:"pid,omitempty"`
	Rank      string                `json:"rank,omitempty"`
	Batches   []int                 `json:"batches,omitempty"`
	Tasks     []faultTask           `json:"tasks,omitempty"`
	Done      bool                  `json:"done,omitempty"`
	Reached   bool                  `json:"reached,omitempty"`
	Counters  relay.CounterSnapshot `json:"counters"`
	PXN       bool                  `json:"pxn,omitempty"`
	CloseErr  string                `json:"close_err,omitempty"`
	ElapsedMS float64               `json:"elapsed_ms,omitempty"`
	Released  int                   `json:"released,omitempty"`
	// LockBusy and LockWaited are the rank's registry.LockContention.
	LockBusy   uint64 `json:"lock_busy,omitempty"`
	LockWaited uint64 `json:"lock_waited,omitempty"`
	// Asleep: the pump thread is in its sleep on the wake word.
	Asleep bool `json:"asleep,omitempty"`
	// Held and Reports: the writes the gate holds and its timeout
	// reports not yet polled.
	Held    int `json:"held,omitempty"`
	Reports int `json:"reports,omitempty"`
}

// gateHop is the rank's hop with a gate: while held, writes are accepted but
// not sent, so a relay's second hop stays in flight as long as a test wants.
// It can also report a timeout for the writes it holds, as a transport
// whose NIC still holds them does (relay.ErrWriteHeld): their final
// completion comes when they are sent.
type gateHop struct {
	inner   relay.Hop
	mu      sync.Mutex
	hold    bool
	held    []relay.WriteOp
	reports []relay.HopCompletion
}

// errHeldTimeout is the timeout the gate reports for a write it holds.
var errHeldTimeout = fmt.Errorf("write held past its timeout: %w: %w", relay.ErrTimedOut, relay.ErrWriteHeld)

// reportTimeouts queues a timeout report for every write held now, and
// returns how many.
func (h *gateHop) reportTimeouts() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, op := range h.held {
		h.reports = append(h.reports, relay.HopCompletion{Token: op.Token, Err: errHeldTimeout})
	}
	return len(h.held)
}

// pending counts the writes held and the reports not yet polled.
func (h *gateHop) pending() (held, reports int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held), len(h.reports)
}

func (h *gateHop) Submit(ops []relay.WriteOp) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hold || len(h.held) > 0 {
		h.held = append(h.held, ops...)
		return nil
	}
	return h.inner.Submit(ops)
}

func (h *gateHop) Poll(out []relay.HopCompletion) int {
	h.mu.Lock()
	if len(h.reports) > 0 {
		n := copy(out, h.reports)
		h.reports = h.reports[n:]
		h.mu.Unlock()
		return n
	}
	for !h.hold && len(h.held) > 0 {
		n := min(len(h.held), 16)
		if h.inner.Submit(h.held[:n]) != nil {
			break
		}
		h.held = h.held[n:]
	}
	h.mu.Unlock()
	return h.inner.Poll(out)
}

func (h *gateHop) setHold(on bool) {
	h.mu.Lock()
	h.hold = on
	h.mu.Unlock()
}

// holdCopier holds the source-ready events recorded while hold is on, so a
// test can prove that nothing reads a source before its event.
type holdCopier struct {
	*cpucopy.HostCopier
	holder *hostfault.Holder
	hold   atomic.Bool
}

func newHoldCopier() *holdCopier {
	h := hostfault.NewHolder()
	c := testhooks.NewHostCopier(testhooks.HostCopier{Ready: h}).(*cpucopy.HostCopier)
	return &holdCopier{HostCopier: c, holder: h}
}

func (c *holdCopier) RecordReady(stream uintptr) (relay.Event, error) {
	ev, err := c.HostCopier.RecordReady(stream)
	if err == nil && !c.hold.Load() {
		err = c.holder.ReleaseReady(ev)
	}
	return ev, err
}

// stallRegistry is the real registry with a heartbeat that a test can stop
// while the rank keeps running.
type stallRegistry struct {
	*engineopen.StagingRegistry
	paused atomic.Bool
}

func (s *stallRegistry) Heartbeat(now time.Time) {
	if !s.paused.Load() {
		s.StagingRegistry.Heartbeat(now)
	}
}

type roleBatch struct {
	b      *relay.Batch
	writes []faultWrite
}

func faultRank() error {
	ctx := context.Background()
	idx, err := strconv.Atoi(os.Getenv(faultIndexEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", faultIndexEnv, err)
	}
	dir, err := fabric.LoadStaticDirectory(strings.NewReader(os.Getenv(faultDirEnv)))
	if err != nil {
		return err
	}
	srcN, err := strconv.ParseUint(os.Getenv(faultSrcEnv), 10, 64)
	if err != nil {
		return fmt.Errorf("%s: %w", faultSrcEnv, err)
	}
	src, err := unix.Mmap(-1, 0, int(srcN), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	faultPattern(src, faultSeed(idx), 0)
	base := uintptr(unsafe.Pointer(&src[0]))

	// The fault matrix follows Pieces one slot each (rings filled Piece by
	// Piece, seqs counted); a case about joined slots asks for joining.
	hooks := relay.FaultHooks{SeparateSlots: os.Getenv(faultJoinEnv) != "1"}
	if v := os.Getenv(faultLastSeqEnv); v != "" {
		if hooks.LastSeq, err = strconv.ParseUint(v, 10, 64); err != nil {
			return err
		}
	}
	if v := os.Getenv(faultTicketEnv); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil {
			return err
		}
		hooks.TicketTimeout = time.Duration(ms) * time.Millisecond
	}
	if v := os.Getenv(faultPartsEnv); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil {
			return err
		}
		hooks.PartsWait = time.Duration(ms) * time.Millisecond
	}

	tcp := fabric.NewTCPHop(fabric.TCPHopOptions{Targets: dir.Addresses(), QueueDepth: 256})
	defer tcp.Close()
	hop := &gateHop{inner: tcp}
	cop := newHoldCopier()
	if err := cop.RegisterDevice(base, srcN); err != nil {
		return err
	}
	cfg := engineconfig.Load(nil, func(err error) { fmt.Fprintln(os.Stderr, "config:", err) })
	hca := fmt.Sprintf("mlx5_%d", idx)
	var reg relay.Registry
	var stall *stallRegistry
	rankName := ""
	if cfg.Enable {
		rank, err := registry.Register(ctx, registry.Options{
			Root: cfg.RegistryRoot, Group: cfg.GroupID, UID: os.Geteuid(),
			Rail: staging.CanonicalRail(cfg.RailMap, hca), HCA: hca,
			HeartbeatTimeout: cfg.HeartbeatTimeout,
		})
		if err != nil {
			return err
		}
		rankName = rank.Name()
		stall = &stallRegistry{StagingRegistry: engineopen.NewStagingRegistry(rank)}
		reg = stall
	}
	eng, err := relay.OpenWithFaultHooks(cfg, relay.Deps{Hop: hop, Directory: dir, Copier: cop, Registry: reg, LocalHCA: hca}, hooks)
	if err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(faultResp{OK: true, Pid: os.Getpid(), Rank: rankName, PXN: eng.PXNActive()}); err != nil {
		return err
	}

	var batches []roleBatch
	tasks := func() ([]faultTask, bool) {
		var ts []faultTask
		done := true
		for bi, rb := range batches {
			for i := 0; i < rb.b.Len(); i++ {
				st, _ := rb.b.Status(i)
				ft := faultTask{Batch: bi, Write: rb.writes[i], State: st.State.String(), Transferred: st.Transferred, Route: "direct"}
				if rb.b.Route(i) == relay.RoutePXN {
					ft.Route = "pxn"
				}
				if st.Err != nil {
					ft.Err = st.Err.Error()
				}
				if st.State == relay.Pending {
					done = false
				}
				ts = append(ts, ft)
			}
		}
		return ts, done
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		var req faultReq
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			return fmt.Errorf("command %q: %w", in.Text(), err)
		}
		resp := faultResp{OK: true}
		timeout := time.Duration(req.TimeoutMS) * time.Millisecond
		switch req.Op {
		case "info":
			resp.Pid, resp.Rank, resp.PXN = os.Getpid(), rankName, eng.PXNActive()
		case "submit":
			groups := [][]faultWrite{req.Reqs}
			if req.Separate {
				groups = groups[:0]
				for _, w := range req.Reqs {
					groups = append(groups, []faultWrite{w})
				}
			}
			for _, ws := range groups {
				rs := make([]relay.Request, len(ws))
				for i, w := range ws {
					rs[i] = relay.Request{Op: relay.Write, Src: base + uintptr(w.Src), Len: w.Len, Target: w.Session, Dst: w.Dst}
				}
				b, err := eng.Submit(rs)
				if err != nil {
					resp.OK, resp.Err = false, err.Error()
					break
				}
				resp.Batches = append(resp.Batches, len(batches))
				batches = append(batches, roleBatch{b: b, writes: ws})
			}
		case "tasks":
			resp.Tasks, resp.Done = tasks()
		case "forget":
			// Later answers list only batches submitted from now on.
			batches = nil
		case "wait":
			deadline := time.Now().Add(timeout)
			for {
				resp.Tasks, resp.Done = tasks()
				if resp.Done || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Millisecond)
			}
		case "counters":
			resp.Counters, resp.PXN = eng.Counters(), eng.PXNActive()
			if stall != nil {
				resp.LockBusy, resp.LockWaited = stall.Rank().LockContention()
			}
		case "asleep":
			if stall == nil {
				resp.OK, resp.Err = false, "no registry"
				break
			}
			resp.Asleep = pumpAsleep(eng, stall.Wake())
		case "route":
			deadline := time.Now().Add(timeout)
			for {
				if resp.Reached = eng.HasRelay(req.Rail) == req.Want; resp.Reached || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Millisecond)
			}
		case "hold":
			hop.setHold(req.On)
		case "held":
			resp.Held, resp.Reports = hop.pending()
		case "timeouts":
			resp.Held = hop.reportTimeouts()
		case "holdready":
			cop.hold.Store(req.On)
		case "releaseready":
			resp.Released = cop.holder.ReleaseAllReady()
		case "pausebeat":
			if stall == nil {
				resp.OK, resp.Err = false, "no registry"
				break
			}
			stall.paused.Store(req.On)
		case "close":
			cctx, cancel := context.WithTimeout(ctx, timeout)
			start := time.Now()
			if err := eng.Close(cctx); err != nil {
				resp.CloseErr = err.Error()
			}
			cancel()
			resp.ElapsedMS = float64(time.Since(start).Microseconds()) / 1000
			resp.Tasks, resp.Done = tasks()
			resp.Counters = eng.Counters()
		case "exit":
			return out.Encode(resp)
		default:
			resp.OK, resp.Err = false, "unknown op "+req.Op
		}
		if err := out.Encode(resp); err != nil {
			return err
		}
	}
	if err := in.Err(); err != nil {
		return err
	}
	return errors.New("parent went away")
}

func faultSeed(idx int) uint64 { return uint64(idx) + 1 }

// faultPattern fills b with the bytes at offsets [off, off+len(b)) of the
// source buffer of a rank seeded with seed. Every byte depends on its
// offset, so data staged in the wrong slot or at the wrong place shows.
func faultPattern(b []byte, seed, off uint64) {
	for i := range b {
		pos := off + uint64(i)
		z := seed*0x9e3779b97f4a7c15 + (pos/8)*0xbf58476d1ce4e5b9 + 1
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		b[i] = byte(z >> (8 * (pos % 8)))
	}
}
