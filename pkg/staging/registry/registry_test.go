// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

func TestRegistryRanksInOneGroupSeeEachOther(t *testing.T) {
	root := regTestRoot(t)
	const n = 4
	var children []*regChild
	var names []string
	for i := 0; i < n; i++ {
		c := startRegChild(t, childOpts{root: root, group: "job", rail: fmt.Sprintf("rail%d", i)})
		children = append(children, c)
	}
	for _, c := range children {
		names = append(names, c.expect("ready"))
	}
	for i, c := range children {
		c.send("peers")
		got := strings.Fields(c.expect("peers"))
		var want []string
		for j, name := range names {
			if j != i {
				want = append(want, name)
			}
		}
		slices.Sort(want)
		if got[0] != strconv.Itoa(n-1) || !slices.Equal(got[1:], want) {
			t.Errorf("rank %d sees %v, want %d peers %v", i, got, n-1, want)
		}
	}
	for _, c := range children {
		c.finish()
	}
	if got := listDir(t, groupDir(root, "job")); !slices.Equal(got, []string{folder.LockFileName}) {
		t.Errorf("after every rank closed the directory holds %v, want only %s", got, folder.LockFileName)
	}
}

func TestRegistryPeersReportRailAndHeartbeat(t *testing.T) {
	root := regTestRoot(t)
	a := mustRegister(t, regOptions(root, "g", "rail-a"))
	b := mustRegister(t, regOptions(root, "g", "rail-b"))
	ps, err := b.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		t.Fatalf("b sees %d peers, want 1: %+v", len(ps), ps)
	}
	p := ps[0]
	if p.Name != a.Name() || p.Identity != a.Identity() || p.Rail != "rail-a" || p.HCA != "hca-rail-a" ||
		p.State != staging.StateReady || p.ArenaKind != staging.ArenaHost || p.Refused != nil {
		t.Errorf("peer = %+v, want a (%s) READY on rail-a", p, a.Name())
	}
	if p.HeartbeatAge < 0 || p.HeartbeatAge > testHeartbeatTimeout {
		t.Errorf("heartbeat age %v out of range", p.HeartbeatAge)
	}
}

func TestRegistryKilledRankIsCleanedByNextRegistrant(t *testing.T) {
	root := regTestRoot(t)
	dir := groupDir(root, "g")
	c := startRegChild(t, childOpts{root: root, group: "g"})
	name := c.expect("ready")
	_, id := folder.ParseEntryName(name)
	c.kill()
	for _, f := range []string{name, folder.SockFileName(id)} {
		if !fileExists(filepath.Join(dir, f)) {
			t.Fatalf("%s vanished before anyone cleaned", f)
		}
	}
	r := mustRegister(t, regOptions(root, "g", "rail0"))
	if got, want := listDir(t, dir), rankFiles(r); !slices.Equal(got, want) {
		t.Errorf("after the next registrant the directory holds %v, want %v", got, want)
	}
	ps, err := r.Peers(context.Background())
	if err != nil || len(ps) != 0 {
		t.Errorf("Peers = %v, %v; want none", ps, err)
	}
}

func TestRegistryRankKilledDuringInitIsCleaned(t *testing.T) {
	root := regTestRoot(t)
	dir := groupDir(root, "g")
	c := startRegChild(t, childOpts{root: root, group: "g", env: []string{helperHangEnv + "=" + strconv.Itoa(int(StepPublish))}})
	c.expect("hanging")
	var tmp, sock string
	for _, n := range listDir(t, dir) {
		switch k, id := folder.ParseEntryName(n); {
		case k == folder.EntryTmp && id.Pid == c.pid():
			tmp = n
		case k == folder.EntrySock && id.Pid == c.pid():
			sock = n
		}
	}
	if tmp == "" || sock == "" {
		t.Fatalf("a rank about to publish should have a .tmp control file and an arena socket; have %v", listDir(t, dir))
	}
	// A live rank's unfinished init is not stale: others leave it alone.
	r := mustRegister(t, regOptions(root, "g", "rail0"))
	if !fileExists(filepath.Join(dir, tmp)) || !fileExists(filepath.Join(dir, sock)) {
		t.Fatalf("a registrant removed files of a live rank still initializing: %v", listDir(t, dir))
	}
	if ps, err := r.Peers(context.Background()); err != nil || len(ps) != 0 {
		t.Errorf("Peers = %v, %v; an unpublished rank must not be listed", ps, err)
	}
	c.kill()
	r2 := mustRegister(t, regOptions(root, "g", "rail1"))
	want := rankFiles(r, r2)
	if got := listDir(t, dir); !slices.Equal(got, want) {
		t.Errorf("after the init was killed the next registrant left %v, want %v", got, want)
	}
}

// rankFiles lists the files of the given ranks and the lock, sorted. A
// host arena is a memfd, not a file.
func rankFiles(rs ...*Rank) []string {
	names := []string{folder.LockFileName}
	for _, r := range rs {
		names = append(names, r.Name(), folder.SockFileName(r.Identity()))
	}
	slices.Sort(names)
	return names
}

// otherNS is a PID namespace no process of the test runs in.
var otherNS = staging.PidNS{Dev: 1, Ino: 2}

func selfNS(t testing.TB) staging.PidNS {
	t.Helper()
	ns, err := staging.SelfPidNS()
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// writeFakeRank writes a control file for id in this process's PID
// namespace with a valid header changed by mutate, and an arena file next
// to it.
func writeFakeRank(t *testing.T, dir string, id staging.Identity, name string, mutate func(h *staging.Header)) {
	t.Helper()
	h := folder.NewHeader(id, selfNS(t), os.Geteuid(), "rail-x", "hca-x", staging.ArenaHost)
	h.State = staging.StateReady
	h.Heartbeat = uint64(staging.MonoNanos())
	handle := [staging.ArenaHandleSize]byte{}
	copy(handle[:], folder.ArenaFileName(id))
	h.IPCHandle = handle
	if mutate != nil {
		mutate(&h)
	}
	b := make([]byte, staging.ControlSize)
	copy(b, unsafe.Slice((*byte)(unsafe.Pointer(&h)), folder.HeaderSize))
	writeFile0600(t, filepath.Join(dir, name), b)
	writeFile0600(t, filepath.Join(dir, folder.ArenaFileName(id)), nil)
}

// writeFile0600 writes b to a 0600 file, leaving trailing zeros sparse.
func writeFile0600(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.TrimRight(b, "\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, int64(len(b))); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

func selfStart(t *testing.T) uint64 {
	t.Helper()
	st, err := folder.ReadProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return st.StartTime
}

func deadPid(t *testing.T) int {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), registryHelperEnv+"=exit")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestRegistryStaleEntries(t *testing.T) {
	root := regTestRoot(t)
	dir := groupDir(root, "g")
	first := mustRegister(t, regOptions(root, "g", "rail0"))
	me, start := os.Getpid(), selfStart(t)
	dead := deadPid(t)
	tests := []struct {
		name   string
		id     staging.Identity
		tmp    bool
		mutate func(h *staging.Header)
		stale  bool
		// late: left out of Peers, but its process runs, so its files stay.
		late bool
	}{
		{name: "live", id: staging.Identity{Pid: me, StartTime: start, Epoch: 0x1001}, stale: false},
		{name: "pid reused", id: staging.Identity{Pid: me, StartTime: start + 1, Epoch: 0x1002}, stale: true},
		{name: "pid exited", id: staging.Identity{Pid: dead, StartTime: 12345, Epoch: 0x1003}, stale: true},
		{name: "heartbeat older than timeout", id: staging.Identity{Pid: me, StartTime: start, Epoch: 0x1004}, late: true,
			mutate: func(h *staging.Header) { h.Heartbeat = uint64(staging.MonoNanos() - int64(2*testHeartbeatTimeout)) }},
		{name: "heartbeat just inside timeout", id: staging.Identity{Pid: me, StartTime: start, Epoch: 0x1005}, stale: false,
			mutate: func(h *staging.Header) { h.Heartbeat = uint64(staging.MonoNanos() - int64(time.Second)) }},
		{name: "never beat", id: staging.Identity{Pid: me, StartTime: start, Epoch: 0x1006}, late: true,
			mutate: func(h *staging.Header) { h.Heartbeat = 0 }},
		{name: "initializing, live", id: staging.Identity{Pid: me, StartTime: start, Epoch: 0x1007}, tmp: true, stale: false,
			mutate: func(h *staging.Header) { h.State, h.Heartbeat = staging.StateInit, 0 }},
		{name: "initializing, exited", id: staging.Identity{Pid: dead, StartTime: 12345, Epoch: 0x1008}, tmp: true, stale: true,
			mutate: func(h *staging.Header) { h.State, h.Heartbeat = staging.StateInit, 0 }},
	}
	for _, tt := range tests {
		name := folder.RankFileName(tt.id)
		if tt.tmp {
			name = folder.TmpFileName(tt.id)
		}
		writeFakeRank(t, dir, tt.id, name, tt.mutate)
	}
	// Peers leaves stale ranks out.
	ps, err := first.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	listed := make(map[staging.Identity]bool)
	for _, p := range ps {
		listed[p.Identity] = true
	}
	for _, tt := range tests {
		if want := !tt.stale && !tt.late && !tt.tmp; listed[tt.id] != want {
			t.Errorf("%s: listed by Peers = %v, want %v", tt.name, listed[tt.id], want)
		}
	}
	// The next registrant (Peers already began) removes every file of
	// every stale registration and nothing else.
	mustRegister(t, regOptions(root, "g", "rail1"))
	for _, tt := range tests {
		name := folder.RankFileName(tt.id)
		if tt.tmp {
			name = folder.TmpFileName(tt.id)
		}
		for _, f := range []string{name, folder.ArenaFileName(tt.id)} {
			if gone := !fileExists(filepath.Join(dir, f)); gone != tt.stale {
				t.Errorf("%s: %s removed = %v, want %v", tt.name, f, gone, tt.stale)
			}
		}
	}
}

func TestRegistryGroupsDoNotSeeEachOther(t *testing.T) {
	root := regTestRoot(t)
	groups := map[string][]*regChild{}
	for _, g := range []string{"job-a", "job-b"} {
		for i := 0; i < 2; i++ {
			groups[g] = append(groups[g], startRegChild(t, childOpts{root: root, group: g}))
		}
	}
	names := map[*regChild]string{}
	for _, cs := range groups {
		for _, c := range cs {
			names[c] = c.expect("ready")
		}
	}
	for g, cs := range groups {
		for i, c := range cs {
			c.send("peers")
			if got, want := c.expect("peers"), "1 "+names[cs[1-i]]; got != want {
				t.Errorf("group %s: a rank sees %q, want %q", g, got, want)
			}
		}
	}
}

func TestRegistryUIDsDoNotSeeEachOther(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a rank as another uid")
	}
	const other = 65534
	root := regTestRoot(t)
	if err := os.Chmod(root, 0o1777); err != nil {
		t.Fatal(err)
	}
	// The other uid must be able to run the test binary.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.MkdirTemp("", "pxn-registry-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	copyExe := filepath.Join(bin, "staging.test")
	if err := os.WriteFile(copyExe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}

	mine := startRegChild(t, childOpts{root: root, group: "g"})
	theirs := startRegChild(t, childOpts{root: root, group: "g", exe: copyExe, cred: &syscall.Credential{Uid: other, Gid: other}})
	mine.expect("ready")
	theirs.expect("ready")
	for _, c := range []*regChild{mine, theirs} {
		c.send("peers")
		if got := c.expect("peers"); got != "0 " {
			t.Errorf("rank %d sees %q, want no peers", c.pid(), got)
		}
	}
	otherDir := filepath.Join(root, fmt.Sprintf("%s%d-g", folder.GroupDirPrefix, other))
	var st unix.Stat_t
	if err := unix.Lstat(otherDir, &st); err != nil || st.Uid != other || st.Mode&0o7777 != 0o700 {
		t.Errorf("directory of uid %d: %v, uid %d, mode %04o; want uid %d, 0700", other, err, st.Uid, st.Mode&0o7777, other)
	}
	mine.finish()
	theirs.finish()
}

func TestRegistryNineRanksSendDirect(t *testing.T) {
	root := regTestRoot(t)
	var children []*regChild
	var names []string
	for i := 0; i < staging.LaneCount+2; i++ {
		children = append(children, startRegChild(t, childOpts{root: root, group: "big", rail: fmt.Sprintf("rail%d", i%8)}))
	}
	for _, c := range children {
		names = append(names, c.expect("ready"))
	}
	for i, c := range children {
		c.send("peers")
		if got := c.expect("peers-error"); !strings.Contains(got, "8 valid peers") || !strings.Contains(got, ErrTooManyPeers.Error()) {
			t.Errorf("rank %d: peers-error %q, want more than %d valid peers", i, got, staging.LaneCount)
		}
		c.send("peers")
		c.expect("peers-error")
		c.send("attach " + names[(i+1)%len(names)])
		if got := c.expect("attach-error"); !strings.Contains(got, ErrTooManyPeers.Error()) {
			t.Errorf("rank %d: attach-error %q, want PXN off", i, got)
		}
	}
	for i, c := range children {
		stderr := c.finish()
		if n := strings.Count(stderr, "PXN off for this process"); n != 1 {
			t.Errorf("rank %d said PXN off %d times, want once; stderr:\n%s", i, n, stderr)
		}
	}
}

func TestRegistryInitFailureRollsBack(t *testing.T) {
	steps := []InitStep{StepOpenRegistry, StepCreateControl, StepAllocateArena, StepRegisterMemory, StepExportHandle, StepServeArena, StepPublish}
	for _, step := range steps {
		t.Run(step.String(), func(t *testing.T) {
			root := regTestRoot(t)
			reg := &countingRegistrar{}
			o := regOptions(root, "g", "rail0")
			o.Memory = reg
			var ran []InitStep
			inject := func(s InitStep) error {
				ran = append(ran, s)
				if s == step {
					return errors.New("injected")
				}
				return nil
			}
			r, err := register(context.Background(), o, &hooks{beforeStep: inject})
			var ie *InitError
			if r != nil || !errors.As(err, &ie) || ie.Step != step || !strings.Contains(err.Error(), step.String()) {
				t.Fatalf("Register = %v, %v; want an InitError of step %q", r, err, step)
			}
			if !slices.Equal(ran, steps[:step]) {
				t.Errorf("steps run %v, want %v", ran, steps[:step])
			}
			want := []string{folder.LockFileName}
			if step == StepOpenRegistry {
				want = nil
			}
			if got := listDir(t, groupDir(root, "g")); !slices.Equal(got, want) {
				t.Errorf("after the failure the directory holds %v, want %v", got, want)
			}
			if wantReg := step > StepRegisterMemory; reg.registered.Load() != reg.deregistered.Load() || (reg.registered.Load() == staging.LaneCount) != wantReg {
				t.Errorf("memory registered %d times, deregistered %d times", reg.registered.Load(), reg.deregistered.Load())
			}
		})
	}
}

type countingRegistrar struct {
	registered, deregistered atomic.Int32
	failDeregister           bool
	// beforeDeregister runs at the start of Deregister.
	beforeDeregister func()
}

func (c *countingRegistrar) Register(base uintptr, size uint64) error {
	if base == 0 || size != staging.LaneBytes {
		return fmt.Errorf("register %#x+%d: not an arena's lane", base, size)
	}
	c.registered.Add(1)
	return nil
}

func (c *countingRegistrar) Deregister(base uintptr, size uint64) error {
	if c.beforeDeregister != nil {
		c.beforeDeregister()
	}
	if c.failDeregister {
		return errors.New("NIC refused to deregister")
	}
	c.deregistered.Add(1)
	return nil
}

func mapsMention(t *testing.T, name string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), name)
}

func TestRegistryFailedMemoryRegistrationQuarantinesArena(t *testing.T) {
	root := regTestRoot(t)
	dir := groupDir(root, "g")
	o := regOptions(root, "g", "rail0")
	o.Memory = failingRegistrar{}
	r, err := Register(context.Background(), o)
	var ie *InitError
	if r != nil || !errors.As(err, &ie) || ie.Step != StepRegisterMemory || !strings.Contains(err.Error(), "quarantined") {
		t.Fatalf("Register = %v, %v; want a quarantining failure of %q", r, err, StepRegisterMemory)
	}
	// The control file stays with the arena (a memfd, no file): it names
	// the namespace by which others judge the registration.
	names := listDir(t, dir)
	if len(names) != 2 || names[0] != folder.LockFileName {
		t.Fatalf("directory holds %v, want the lock and the control file of the quarantined arena", names)
	}
	ctl := names[1]
	k, id := folder.ParseEntryName(ctl)
	if k != folder.EntryTmp || id.Pid != os.Getpid() {
		t.Fatalf("directory holds %v, want the lock and this process's .tmp control file", names)
	}
	arena := folder.ArenaFileName(id)
	if !mapsMention(t, arena) {
		t.Errorf("the quarantined arena %s is no longer mapped", arena)
	}
	// While the process lives its quarantined arena is not stale.
	mustRegister(t, regOptions(root, "g", "rail1"))
	if !fileExists(filepath.Join(dir, ctl)) {
		t.Errorf("a registrant removed the quarantined arena of a live process: %v", listDir(t, dir))
	}
}

func TestRegistryQuarantinedArenaOfExitedProcessIsCleaned(t *testing.T) {
	root := regTestRoot(t)
	dir := groupDir(root, "g")
	c := startRegChild(t, childOpts{root: root, group: "g", env: []string{helperMemFailEnv + "=1"}})
	if got := c.expect("register-error"); !strings.Contains(got, "quarantined") {
		t.Fatalf("register-error %q, want the arena quarantined", got)
	}
	<-c.done
	names := listDir(t, dir)
	if len(names) != 2 || !strings.HasPrefix(names[1], folder.TmpPrefix) {
		t.Fatalf("after the failed child the directory holds %v, want the lock and a control file", names)
	}
	r := mustRegister(t, regOptions(root, "g", "rail0"))
	if got, want := listDir(t, dir), rankFiles(r); !slices.Equal(got, want) {
		t.Errorf("the next registrant left %v, want %v", got, want)
	}
}

func TestRegistryTeardownOrderAndNothingLeft(t *testing.T) {
	root := regTestRoot(t)
	dir := groupDir(root, "g")
	reg := &countingRegistrar{}
	o := regOptions(root, "g", "rail0")
	o.Memory = reg
	relay, err := Register(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	arena := folder.ArenaFileName(relay.Identity())
	reg.beforeDeregister = func() {
		// Reverse order: READY revoked (the control file back under its
		// temporary name) and the socket gone before the NIC lets go; the
		// arena outlives its registration, the control file the arena.
		if fileExists(filepath.Join(dir, relay.Name())) || fileExists(filepath.Join(dir, folder.SockFileName(relay.Identity()))) ||
			!mapsMention(t, arena) || !fileExists(filepath.Join(dir, folder.TmpFileName(relay.Identity()))) {
			t.Errorf("deregistering with %v in the directory; want the revoked control file and the arena there, and no socket", listDir(t, dir))
		}
	}
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	l := attachByName(t, sender, relay.Name())
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := relay.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sender.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if reg.registered.Load() != staging.LaneCount || reg.deregistered.Load() != staging.LaneCount {
		t.Errorf("registered %d, deregistered %d; want %d and %d: one a lane", reg.registered.Load(), reg.deregistered.Load(), staging.LaneCount, staging.LaneCount)
	}
	if got := listDir(t, dir); !slices.Equal(got, []string{folder.LockFileName}) {
		t.Errorf("after teardown the directory holds %v, want only %s", got, folder.LockFileName)
	}
	if mapsMention(t, arena) {
		t.Errorf("arena %s still mapped after Close", arena)
	}
	if err := relay.Close(context.Background()); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestRegistryFailedDeregisterQuarantinesArena(t *testing.T) {
	root := regTestRoot(t)
	o := regOptions(root, "g", "rail0")
	o.Memory = &countingRegistrar{failDeregister: true}
	r, err := Register(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	arena := folder.ArenaFileName(r.Identity())
	if err := r.Close(context.Background()); err == nil || !strings.Contains(err.Error(), "quarantined") {
		t.Fatalf("Close = %v, want the arena quarantined", err)
	}
	if got, want := listDir(t, groupDir(root, "g")), []string{folder.LockFileName, folder.TmpFileName(r.Identity())}; !slices.Equal(got, want) {
		t.Errorf("directory holds %v, want %v: the lock and the revoked control file of the quarantined arena", got, want)
	}
	if !mapsMention(t, arena) {
		t.Errorf("quarantined arena unmapped")
	}
}

func TestRegistryHeartbeatIsRateLimited(t *testing.T) {
	r := mustRegister(t, regOptions(regTestRoot(t), "g", "rail0"))
	h := r.Header()
	t0 := staging.MonoNanos() + int64(time.Second)
	if !r.Heartbeat(t0) || atomic.LoadUint64(&h.Heartbeat) != uint64(t0) {
		t.Fatalf("first heartbeat not written")
	}
	if r.Heartbeat(t0+int64(heartbeatPeriod)-1) || atomic.LoadUint64(&h.Heartbeat) != uint64(t0) {
		t.Errorf("heartbeat written again within %v", heartbeatPeriod)
	}
	if !r.Heartbeat(t0+int64(heartbeatPeriod)) || atomic.LoadUint64(&h.Heartbeat) != uint64(t0)+uint64(heartbeatPeriod) {
		t.Errorf("heartbeat not written after %v", heartbeatPeriod)
	}
}

func TestRegistryOptionsAreChecked(t *testing.T) {
	root := regTestRoot(t)
	tests := []struct {
		name   string
		mutate func(o *Options)
		want   string
	}{
		{"no root", func(o *Options) { o.Root = "" }, "root"},
		{"other uid", func(o *Options) { o.UID = os.Geteuid() + 1 }, "effective uid"},
		{"empty group", func(o *Options) { o.Group = "" }, "group"},
		{"dot-dot group", func(o *Options) { o.Group = ".." }, "group"},
		{"slash in group", func(o *Options) { o.Group = "a/b" }, "'/'"},
		{"long group", func(o *Options) { o.Group = strings.Repeat("g", 65) }, "group"},
		{"no rail", func(o *Options) { o.Rail = "" }, "rail"},
		{"long rail", func(o *Options) { o.Rail = strings.Repeat("r", 49) }, "rail"},
		{"long HCA", func(o *Options) { o.HCA = strings.Repeat("h", 57) }, "HCA"},
		{"short heartbeat timeout", func(o *Options) { o.HeartbeatTimeout = 50 * time.Millisecond }, "heartbeat timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := regOptions(root, "g", "rail0")
			tt.mutate(&o)
			r, err := Register(context.Background(), o)
			if r != nil || err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Register = %v, %v; want an error about %s", r, err, tt.want)
			}
		})
	}
	if got := listDir(t, root); len(got) != 0 {
		t.Errorf("refused options created %v", got)
	}
}

func TestRegistryEntryNames(t *testing.T) {
	id := staging.Identity{Pid: 4242, StartTime: 987654, Epoch: 0xabcdef}
	tests := []struct {
		name string
		kind folder.EntryKind
	}{
		{folder.RankFileName(id), folder.EntryRank},
		{folder.TmpFileName(id), folder.EntryTmp},
		{folder.ArenaFileName(id), folder.EntryArena},
		{".lock", folder.EntryLock},
		{"rank-4242-987654-abcdef", folder.EntryOther},               // epoch not 16 digits
		{"rank-04242-987654-0000000000abcdef", folder.EntryOther},    // not canonical
		{"rank-4242-987654-0000000000ABCDEF", folder.EntryOther},     // not canonical
		{"rank-0-987654-0000000000abcdef", folder.EntryOther},        // pid 0
		{"rank-99999999-987654-0000000000abcdef", folder.EntryOther}, // pid out of range
		{"rank-4242-987654-0000000000000000", folder.EntryOther},     // epoch 0
		{"rank-4242-987654-0000000000abcdef-x", folder.EntryOther},
		{".rank-.tmp", folder.EntryOther},
		{"arena-../../x", folder.EntryOther},
		{"README", folder.EntryOther},
	}
	for _, tt := range tests {
		kind, got := folder.ParseEntryName(tt.name)
		if kind != tt.kind {
			t.Errorf("folder.ParseEntryName(%q) kind = %v, want %v", tt.name, kind, tt.kind)
		}
		if kind == folder.EntryRank || kind == folder.EntryTmp || kind == folder.EntryArena {
			if got != id {
				t.Errorf("folder.ParseEntryName(%q) = %v, want %v", tt.name, got, id)
			}
		}
	}
}
