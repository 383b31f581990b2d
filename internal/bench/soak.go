// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// The soak runs all-to-all rounds on the host path for a fixed time while
// it kills, restarts and stalls ranks at random, and checks every round:
// no task lost (every task of a finished round is final), none completed
// twice (the engine's piece counters add up, no task moved more than its
// bytes), and every completed task's bytes right at the target; and every
// graceful close (a restart, the end) returns no error, so no sender kept
// a closing relay's lane past its drain; and every failed task's
// destination holds its own bytes or none. Each rank writes each round into
// its own slot of every target, cleared before the round, so a failed
// task's late bytes never land where a later round is checked.
//
//	pxn-bench soak --ranks 8 --duration 10m --json soak.json

// soakTargetBase is where rail k's target buffer starts: soakTargetBase + k<<36.
const soakTargetBase = 0x100000000000

func soakBase(k int) uint64 { return soakTargetBase + uint64(k)<<36 }

// SoakOptions are soak's flags.
type SoakOptions struct {
	Ranks      int
	Duration   time.Duration
	Block      uint64
	PerTarget  int
	Slots      int
	FaultEvery time.Duration
	Faults     []string
	Seed       uint64
	JSON       string
	// RegistryRoot is the folder the ranks' registry folder is made in
	// ("": /dev/shm, else the temporary folder).
	RegistryRoot string
}

// SoakSummary is the soak's result.
type SoakSummary struct {
	Ranks         int     `json:"ranks"`
	Seconds       float64 `json:"seconds"`
	Rounds        int     `json:"rounds"`
	Abandoned     int     `json:"abandoned_rounds"`
	Tasks         int     `json:"tasks"`
	Completed     int     `json:"completed"`
	Failed        int     `json:"failed"`
	ViaPXN        int     `json:"via_pxn"`
	VerifiedBytes uint64  `json:"verified_bytes"`
	// FailedBytesChecked are the destination bytes of failed tasks found
	// holding their own bytes or none.
	FailedBytesChecked uint64         `json:"failed_bytes_checked"`
	Relayed            uint64         `json:"relayed_pieces"`
	Fallback           uint64         `json:"fallback_pieces"`
	FailedPieces       uint64         `json:"failed_pieces"`
	Faults             map[string]int `json:"faults"`
	FailReasons        map[string]int `json:"fail_reasons,omitempty"`
	Violations         []string       `json:"violations"`
	LeftFiles          []string       `json:"left_files,omitempty"`
}

// ParseFaults reads soak's --faults: a comma list of kill, restart and
// stall.
func ParseFaults(s string) ([]string, error) {
	var faults []string
	for _, f := range strings.Split(s, ",") {
		switch f {
		case "kill", "restart", "stall":
			faults = append(faults, f)
		case "":
		default:
			return nil, fmt.Errorf("unknown fault %q (want kill, restart, stall)", f)
		}
	}
	return faults, nil
}

// SoakMain runs the soak, prints its summary as JSON (and writes it to
// o.JSON) and returns the command's exit status: 1 on an error or a
// violation. When ctx ends (a signal) the soak kills its ranks, removes
// their registry folder and returns 1.
func SoakMain(ctx context.Context, o SoakOptions) int {
	sum, err := soak(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pxn-bench soak: %v\n", err)
		return 1
	}
	b, _ := json.MarshalIndent(sum, "", "  ")
	fmt.Println(string(b))
	if o.JSON != "" {
		if err := writeJSON(o.JSON, sum); err != nil {
			fmt.Fprintf(os.Stderr, "pxn-bench soak: %v\n", err)
			return 1
		}
	}
	if len(sum.Violations) > 0 {
		return 1
	}
	return 0
}

// soaker is the soak's parent: the targets, the registry and the ranks.
type soaker struct {
	o       SoakOptions
	exe     string
	env     []string
	dirPath string
	tgt     [][]byte
	stop    chan struct{}

	mu      sync.Mutex
	sum     SoakSummary
	procs   []*soakChild
	killed  map[int]bool
	restart []bool
	nextSd  uint64
}

func soak(ctx context.Context, o SoakOptions) (*SoakSummary, error) {
	s := &soaker{o: o, stop: make(chan struct{}), killed: map[int]bool{}, restart: make([]bool, o.Ranks),
		procs: make([]*soakChild, o.Ranks), nextSd: o.Seed << 20}
	s.sum = SoakSummary{Ranks: o.Ranks, Faults: map[string]int{}, FailReasons: map[string]int{}, Violations: []string{}}
	var err error
	if s.exe, err = os.Executable(); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "pxn-soak-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	shm := o.RegistryRoot
	if shm == "" {
		shm = "/dev/shm"
		if st, err := os.Stat(shm); err != nil || !st.IsDir() {
			shm = work
		}
	}
	regRoot, err := os.MkdirTemp(shm, "pxn-soak-registry-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(regRoot)

	srv := fabric.NewTargetServer(fabric.TargetServerOptions{})
	defer srv.Close()
	addr, err := srv.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	region := uint64(o.Ranks*o.Slots*o.PerTarget) * o.Block
	var list []fabric.StaticTarget
	for k := 0; k < o.Ranks; k++ {
		buf, err := mapBuffer(region)
		if err != nil {
			return nil, err
		}
		if err := srv.Register(soakBase(k), buf); err != nil {
			return nil, err
		}
		s.tgt = append(s.tgt, buf)
		list = append(list, fabric.StaticTarget{Session: sessionName(k), Addr: addr.String(), HCAs: []string{remoteHCA(k)},
			Ranges: []fabric.StaticRange{{Addr: soakBase(k), Len: region}}})
	}
	dir, err := fabric.NewStaticDirectory(list)
	if err != nil {
		return nil, err
	}
	s.dirPath = filepath.Join(work, "directory.json")
	if err := writeJSON(s.dirPath, dir); err != nil {
		return nil, err
	}
	rm, err := contract.EncodeRailMap(railMap(o.Ranks))
	if err != nil {
		return nil, err
	}
	s.env = []string{contract.EnvEnable + "=1", contract.EnvGroupID + "=soak", contract.EnvRegistryRoot + "=" + regRoot,
		contract.EnvRailMap + "=" + rm, contract.EnvHeartbeatTimeout + "=1000", contract.EnvCreditTimeout + "=300"}

	start := time.Now()
	var wg sync.WaitGroup
	for r := 0; r < o.Ranks; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.runRank(r)
		}()
	}
	injected := make(chan struct{})
	go func() {
		defer close(injected)
		s.inject()
	}()
	select {
	case <-time.After(o.Duration):
		close(s.stop)
	case <-ctx.Done():
		close(s.stop)
		s.killAll()
	}
	<-injected
	wg.Wait()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	s.sum.Seconds = time.Since(start).Seconds()
	gdir := filepath.Join(regRoot, registry.GroupDirPrefix+strconv.Itoa(os.Geteuid())+"-soak")
	if es, err := os.ReadDir(gdir); err == nil {
		for _, e := range es {
			if e.Name() != ".lock" {
				s.sum.LeftFiles = append(s.sum.LeftFiles, e.Name())
			}
		}
	}
	return &s.sum, nil
}

// killAll kills every rank as the kill fault does, so that an interrupted
// soak ends at once and counts no violation for it.
func (s *soaker) killAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.procs {
		if c != nil && c.alive() {
			s.killed[c.pid] = true
			_ = c.cmd.Process.Signal(syscall.SIGKILL)
		}
	}
}

func (s *soaker) stopping() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

func (s *soaker) violation(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintln(os.Stderr, "pxn-bench soak: VIOLATION:", msg)
	s.mu.Lock()
	s.sum.Violations = append(s.sum.Violations, msg)
	s.mu.Unlock()
}

// runRank drives rank r round after round, starting it again whenever it
// was killed or asked to restart, until the soak stops.
func (s *soaker) runRank(r int) {
	var c *soakChild
	defer func() {
		if c != nil {
			if err := c.exit(30 * time.Second); err != nil && !s.wasKilled(c.pid) {
				s.violation("rank %d at the end: %v", r, err)
			}
		}
	}()
	round := 0
	for !s.stopping() {
		if c == nil || !c.alive() {
			var err error
			if c, err = s.startRank(r); err != nil {
				if c != nil && s.wasKilled(c.pid) {
					c = nil
					continue
				}
				s.violation("rank %d did not start: %v", r, err)
				c = nil
				return
			}
		}
		s.mu.Lock()
		restart := s.restart[r]
		s.restart[r] = false
		s.mu.Unlock()
		if restart {
			// A kill may overtake the restart; that is no fault of the rank.
			if err := c.exit(30 * time.Second); err != nil && !s.wasKilled(c.pid) {
				s.violation("rank %d graceful restart: %v", r, err)
			}
			c = nil
			continue
		}
		s.mu.Lock()
		s.nextSd++
		seed := s.nextSd
		s.mu.Unlock()
		s.clearSlot(r, round)
		res, err := c.round(round, seed, 3*time.Minute)
		if err != nil {
			if !s.wasKilled(c.pid) {
				s.violation("rank %d round %d: %v", r, round, err)
				c.kill()
				return
			}
			s.mu.Lock()
			s.sum.Abandoned++
			s.mu.Unlock()
			c.kill()
			c = nil
			// The killed rank's Pieces may still land in this round's
			// slot: the next round takes the next one.
			round++
			continue
		}
		s.check(r, round, seed, res)
		round++
	}
}

func (s *soaker) startRank(r int) (*soakChild, error) {
	c, err := startSoakChild(s.exe, s.env, "soak-rank", "--index", strconv.Itoa(r), "--ranks", strconv.Itoa(s.o.Ranks),
		"--directory", s.dirPath, "--block", strconv.FormatUint(s.o.Block, 10), "--per-target", strconv.Itoa(s.o.PerTarget),
		"--slots", strconv.Itoa(s.o.Slots))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.procs[r] = c
	s.mu.Unlock()
	if _, err := c.read(time.Minute); err != nil {
		c.kill()
		return c, err
	}
	return c, nil
}

func (s *soaker) wasKilled(pid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killed[pid]
}

// clearSlot zeroes what rank r writes in round, in every other rank's
// target, so that a failed task's destination can be told untouched.
func (s *soaker) clearSlot(r, round int) {
	slot := uint64(round % s.o.Slots)
	n := uint64(s.o.PerTarget) * s.o.Block
	off := (uint64(r)*uint64(s.o.Slots) + slot) * n
	for k := range s.tgt {
		if k != r {
			clear(s.tgt[k][off : off+n])
		}
	}
}

// check verifies one finished round of rank r.
func (s *soaker) check(r, round int, seed uint64, res *soakMsg) {
	if res.Pending > 0 {
		s.violation("rank %d round %d: %d tasks still pending after the round's bound (lost or hung)", r, round, res.Pending)
	}
	viaPXN := 0
	var verified, failedChecked uint64
	for _, t := range res.Tasks {
		if t.Route == "pxn" {
			viaPXN++
		}
		switch t.State {
		case "completed":
			if t.Transferred != t.Len {
				s.violation("rank %d round %d task %+v: completed with %d of %d bytes", r, round, t, t.Transferred, t.Len)
			}
			off := t.Dst - soakBase(t.Target)
			if err := checkPattern(s.tgt[t.Target][off:off+t.Len], seed, t.Src); err != nil {
				s.violation("rank %d round %d task to rail %d at %#x (%s): completed but %v", r, round, t.Target, t.Dst, t.Route, err)
			}
			verified += t.Len
		case "failed":
			if t.Transferred > t.Len {
				s.violation("rank %d round %d task %+v: failed after moving %d of %d bytes (a slice finished twice)", r, round, t, t.Transferred, t.Len)
			}
			off := t.Dst - soakBase(t.Target)
			if err := checkOwnOrNone(s.tgt[t.Target][off:off+t.Len], seed, t.Src); err != nil {
				s.violation("rank %d round %d task to rail %d at %#x (%s): failed and its destination holds another write's bytes: %v", r, round, t.Target, t.Dst, t.Route, err)
			}
			failedChecked += t.Len
		default:
			s.violation("rank %d round %d task %+v: state %s after the round", r, round, t, t.State)
		}
	}
	k := res.Counters
	if got := k.RelayedPieces + k.FallbackPieces + k.FailedPieces; got != uint64(viaPXN) {
		s.violation("rank %d round %d: relayed %d + fallback %d + failed %d pieces = %d, but %d tasks took the PXN path (a completion lost or repeated)",
			r, round, k.RelayedPieces, k.FallbackPieces, k.FailedPieces, got, viaPXN)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sum.Rounds++
	s.sum.Tasks += len(res.Tasks)
	s.sum.ViaPXN += viaPXN
	s.sum.VerifiedBytes += verified
	s.sum.FailedBytesChecked += failedChecked
	s.sum.Relayed += k.RelayedPieces
	s.sum.Fallback += k.FallbackPieces
	s.sum.FailedPieces += k.FailedPieces
	for _, t := range res.Tasks {
		if t.State == "completed" {
			s.sum.Completed++
		} else {
			s.sum.Failed++
			reason := t.Err
			if i := strings.IndexAny(reason, ":("); i > 0 {
				reason = reason[:i]
			}
			s.sum.FailReasons[strings.TrimSpace(reason)]++
		}
	}
}

// inject picks a rank and a fault every faultEvery on average. The seed
// fixes the sequence of kinds whatever the timing: a fault whose rank is
// down (killed, restarting) goes to the next rank up.
func (s *soaker) inject() {
	if s.o.FaultEvery <= 0 || len(s.o.Faults) == 0 {
		<-s.stop
		return
	}
	rng := rand.New(rand.NewPCG(s.o.Seed, 0x50a1))
	for {
		wait := time.Duration(rng.Int64N(int64(2 * s.o.FaultEvery)))
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
		r := rng.IntN(s.o.Ranks)
		f := s.o.Faults[rng.IntN(len(s.o.Faults))]
		stall := time.Duration(200+rng.IntN(2300)) * time.Millisecond
		var c *soakChild
		s.mu.Lock()
		for i := range s.o.Ranks {
			if p := s.procs[(r+i)%s.o.Ranks]; p != nil && p.alive() {
				r, c = (r+i)%s.o.Ranks, p
				break
			}
		}
		s.mu.Unlock()
		if c == nil {
			continue
		}
		switch f {
		case "kill":
			s.mu.Lock()
			s.killed[c.pid] = true
			s.mu.Unlock()
			_ = c.cmd.Process.Signal(syscall.SIGKILL)
			s.count(f)
		case "restart":
			s.mu.Lock()
			s.restart[r] = true
			s.mu.Unlock()
			s.count(f)
		case "stall":
			// A rank that stops: no heartbeat, no pump, no progress, for
			// longer or shorter than the heartbeat timeout.
			if c.cmd.Process.Signal(syscall.SIGSTOP) == nil {
				time.Sleep(stall)
				_ = c.cmd.Process.Signal(syscall.SIGCONT)
				s.count(f)
			}
		}
	}
}

func (s *soaker) count(f string) {
	s.mu.Lock()
	s.sum.Faults[f]++
	s.mu.Unlock()
}
