// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/sim/fabric"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// The soak runs all-to-all rounds on the host path for a fixed time while
// it kills, restarts and stalls ranks at random, and checks every round:
// no task lost (every task of a finished round is final), none completed
// twice (the engine's piece counters add up, no task moved more than its
// bytes), and every completed task's bytes right at the target; and every
// graceful close (a restart, the end) returns no error, so no sender kept
// a closing relay's lane past its drain. Each rank
// writes each round into its own slot of every target, so a failed task's
// bytes never land where a later round is checked.
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
}

// SoakSummary is the soak's result.
type SoakSummary struct {
	Ranks         int            `json:"ranks"`
	Seconds       float64        `json:"seconds"`
	Rounds        int            `json:"rounds"`
	Abandoned     int            `json:"abandoned_rounds"`
	Tasks         int            `json:"tasks"`
	Completed     int            `json:"completed"`
	Failed        int            `json:"failed"`
	ViaPXN        int            `json:"via_pxn"`
	VerifiedBytes uint64         `json:"verified_bytes"`
	Relayed       uint64         `json:"relayed_pieces"`
	Fallback      uint64         `json:"fallback_pieces"`
	FailedPieces  uint64         `json:"failed_pieces"`
	Faults        map[string]int `json:"faults"`
	FailReasons   map[string]int `json:"fail_reasons,omitempty"`
	Violations    []string       `json:"violations"`
	LeftFiles     []string       `json:"left_files,omitempty"`
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
// violation.
func SoakMain(o SoakOptions) int {
	sum, err := soak(o)
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

func soak(o SoakOptions) (*SoakSummary, error) {
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
	shm := "/dev/shm"
	if st, err := os.Stat(shm); err != nil || !st.IsDir() {
		shm = work
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
	time.Sleep(o.Duration)
	close(s.stop)
	<-injected
	wg.Wait()
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

// check verifies one finished round of rank r.
func (s *soaker) check(r, round int, seed uint64, res *soakMsg) {
	if res.Pending > 0 {
		s.violation("rank %d round %d: %d tasks still pending after the round's bound (lost or hung)", r, round, res.Pending)
	}
	viaPXN := 0
	var verified uint64
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

// soakTask is one task of a round as its rank reports it.
type soakTask struct {
	Target      int    `json:"target"`
	Src         uint64 `json:"src"`
	Dst         uint64 `json:"dst"`
	Len         uint64 `json:"len"`
	State       string `json:"state"`
	Route       string `json:"route"`
	Transferred uint64 `json:"transferred"`
	Err         string `json:"err,omitempty"`
}

// soakMsg is one line a soak rank prints.
type soakMsg struct {
	Event    string                `json:"event"`
	Pid      int                   `json:"pid,omitempty"`
	Error    string                `json:"error,omitempty"`
	Tasks    []soakTask            `json:"tasks,omitempty"`
	Pending  int                   `json:"pending,omitempty"`
	Counters relay.CounterSnapshot `json:"counters"`
}

type soakChild struct {
	cmd    *exec.Cmd
	pid    int
	in     io.WriteCloser
	lines  chan []byte
	exited chan struct{}
	stderr *strings.Builder
}

func startSoakChild(exe string, env []string, args ...string) (*soakChild, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c := &soakChild{cmd: cmd, lines: make(chan []byte, 4), exited: make(chan struct{}), stderr: &strings.Builder{}}
	cmd.Stderr = limitWriter{c.stderr}
	var err error
	if c.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c.pid = cmd.Process.Pid
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			c.lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

func (c *soakChild) alive() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

func (c *soakChild) read(timeout time.Duration) (*soakMsg, error) {
	select {
	case line, ok := <-c.lines:
		if !ok {
			<-c.exited
			return nil, fmt.Errorf("exited (%v): %s", c.cmd.ProcessState, lastLines(problems(c.stderr.String()), 10))
		}
		var m soakMsg
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("unparsable output %q", line)
		}
		if m.Event == "error" {
			return nil, errors.New(m.Error)
		}
		return &m, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("no answer within %v (hung)", timeout)
	}
}

func (c *soakChild) round(n int, seed uint64, timeout time.Duration) (*soakMsg, error) {
	if _, err := fmt.Fprintf(c.in, "round %d %d\n", n, seed); err != nil {
		return nil, err
	}
	return c.read(timeout)
}

// exit closes the rank's engine and waits for the process.
func (c *soakChild) exit(timeout time.Duration) error {
	if !c.alive() {
		return nil
	}
	if _, err := fmt.Fprintln(c.in, "exit"); err != nil {
		return err
	}
	m, err := c.read(timeout)
	if err != nil {
		c.kill()
		return err
	}
	// A graceful close completes or fails everything and gets every lane
	// back within the drain: any error from it is a violation.
	if m.Error != "" {
		c.kill()
		return fmt.Errorf("close: %s", m.Error)
	}
	select {
	case <-c.exited:
	case <-time.After(timeout):
		c.kill()
		return fmt.Errorf("did not exit within %v", timeout)
	}
	if !c.cmd.ProcessState.Success() {
		return fmt.Errorf("exited with %v after %q", c.cmd.ProcessState, m.Event)
	}
	return nil
}

func (c *soakChild) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

// problems drops klog's info lines from a rank's stderr.
func problems(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "I1") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// SoakRankOptions are a soak rank's flags, set by the soak.
type SoakRankOptions struct {
	Index     int
	Ranks     int
	Directory string
	Block     uint64
	PerTarget int
	Slots     int
}

// SoakRankMain is one rank of a soak: "round <n> <seed>" writes the round's
// all-to-all requests with the pattern of seed and reports every task;
// "exit" closes the engine.
func SoakRankMain(o SoakRankOptions) int {
	out := json.NewEncoder(os.Stdout)
	if err := runSoakRank(out, o.Index, o.Ranks, o.Directory, o.Block, o.PerTarget, o.Slots); err != nil {
		_ = out.Encode(soakMsg{Event: "error", Error: err.Error()})
		return 1
	}
	return 0
}

// soakHopDepth is a soak rank's TCP hop queue depth: a round's requests
// and the Pieces it relays for others at once.
const soakHopDepth = 256

func runSoakRank(out *json.Encoder, r, ranks int, dirPath string, block uint64, perTarget, slots int) error {
	f, err := os.Open(dirPath)
	if err != nil {
		return err
	}
	dir, err := fabric.LoadStaticDirectory(f)
	f.Close()
	if err != nil {
		return err
	}
	dev := newHostRank(dir, soakHopDepth)
	defer dev.close()
	n := uint64((ranks-1)*perTarget) * block
	base, err := dev.source(n, 0)
	if err != nil {
		return err
	}
	deps := engineopen.HostDeps{Hop: dev.hop(), Directory: dir, LocalHCA: rankHCA(r)}
	if _, err := dev.firstHop(&deps, base, n); err != nil {
		return err
	}
	eng, err := engineopen.OpenFromEnv(context.Background(), nil, deps)
	if err != nil {
		return err
	}
	src := dev.src
	// Give the relays a moment to appear; a rank whose relay is down sends
	// direct, which the soak allows.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		all := true
		for k := 0; k < ranks; k++ {
			if k != r && !eng.HasRelay(railName(k)) {
				all = false
			}
		}
		if all {
			break
		}
	}
	if err := out.Encode(soakMsg{Event: "ready", Pid: os.Getpid()}); err != nil {
		return err
	}
	for cmd := range commands() {
		fields := strings.Fields(cmd)
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "round":
			if len(fields) != 3 {
				return fmt.Errorf("command %q", cmd)
			}
			n, _ := strconv.Atoi(fields[1])
			seed, _ := strconv.ParseUint(fields[2], 10, 64)
			msg := soakRound(eng, src, base, r, ranks, n, seed, block, perTarget, slots)
			if err := out.Encode(msg); err != nil {
				return err
			}
		case "exit":
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := eng.Close(ctx)
			cancel()
			msg := soakMsg{Event: "closed"}
			if err != nil {
				msg.Error = err.Error()
			}
			return out.Encode(msg)
		}
	}
	return errors.New("parent went away")
}

type soakReq struct {
	target int
	req    relay.Request
	src    uint64
}

func soakRound(eng *relay.Engine, src []byte, base uintptr, r, ranks, n int, seed, block uint64, perTarget, slots int) soakMsg {
	fillPatternFast(src, seed)
	slot := uint64(n % slots)
	var reqs []soakReq
	t := 0
	for k := 0; k < ranks; k++ {
		if k == r {
			continue
		}
		for j := 0; j < perTarget; j++ {
			off := uint64(t*perTarget+j) * block
			dst := soakBase(k) + ((uint64(r)*uint64(slots)+slot)*uint64(perTarget)+uint64(j))*block
			reqs = append(reqs, soakReq{target: k, src: off,
				req: relay.Request{Op: relay.Write, Src: base + uintptr(off), Len: block, Target: sessionName(k), Dst: dst}})
		}
		t++
	}
	// One Submit per request: one task, one Piece, so the piece counters
	// can be checked against the tasks.
	before := eng.Counters()
	batches := make([]*relay.Batch, len(reqs))
	msg := soakMsg{Event: "round"}
	for i, q := range reqs {
		b, err := eng.Submit([]relay.Request{q.req})
		if err != nil {
			msg.Event, msg.Error = "error", err.Error()
			return msg
		}
		batches[i] = b
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		done := true
		for _, b := range batches {
			done = done && b.Done()
		}
		if done {
			break
		}
		time.Sleep(200 * time.Microsecond)
	}
	for i, b := range batches {
		st, _ := b.Status(0)
		task := soakTask{Target: reqs[i].target, Src: reqs[i].src, Dst: reqs[i].req.Dst, Len: block,
			State: st.State.String(), Transferred: st.Transferred, Route: "direct"}
		if b.Route(0) == relay.RoutePXN {
			task.Route = "pxn"
		}
		if st.Err != nil {
			task.Err = st.Err.Error()
		}
		if st.State == relay.Pending {
			msg.Pending++
		}
		msg.Tasks = append(msg.Tasks, task)
	}
	msg.Counters = diffCounters(eng.Counters(), before)
	sort.Slice(msg.Tasks, func(i, j int) bool { return msg.Tasks[i].Dst < msg.Tasks[j].Dst })
	return msg
}
