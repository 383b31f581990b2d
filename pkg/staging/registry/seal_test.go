// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// helperProcFDEnv names, for the "reshape" role, the path through /proc of
// the arena descriptor the parent holds.
const helperProcFDEnv = "PXN_REGISTRY_TEST_PROC_FD"

// reshapeOps are what the "reshape" role tries on the arena it is handed
// as descriptor 3, in order.
var reshapeOps = []string{"shrink", "grow", "fallocate-grow", "reopen-shrink", "reopen-trunc", "add-write-seal"}

// helperReshape tries every way to change an arena's size, through the
// descriptor it inherited and through the owner's descriptor reopened by
// path, and says "<op> <errno name or ok>" for each.
func helperReshape() int {
	const fd = 3
	size := int64(staging.LaneBytes)
	proc := os.Getenv(helperProcFDEnv)
	try := func(op string) error {
		switch op {
		case "shrink":
			return unix.Ftruncate(fd, 0)
		case "grow":
			return unix.Ftruncate(fd, size+4096)
		case "fallocate-grow":
			return unix.Fallocate(fd, 0, 0, 2*size)
		case "reopen-shrink":
			g, err := unix.Open(proc, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(g)
			return unix.Ftruncate(g, 4096)
		case "reopen-trunc":
			g, err := unix.Open(proc, unix.O_RDWR|unix.O_TRUNC|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(g)
			}
			return err
		case "add-write-seal":
			_, err := unix.FcntlInt(fd, unix.F_ADD_SEALS, unix.F_SEAL_WRITE)
			return err
		}
		return fmt.Errorf("unknown op %q", op)
	}
	for _, op := range reshapeOps {
		res := "ok"
		if err := try(op); err != nil {
			var errno unix.Errno
			if !errors.As(err, &errno) {
				res = strings.ReplaceAll(err.Error(), " ", "_")
			} else {
				res = unix.ErrnoName(errno)
			}
		}
		fmt.Println(op, res)
	}
	return 0
}

func allocateHostArena(t *testing.T, p HostArenas) staging.Arena {
	t.Helper()
	name := folder.ArenaFileName(staging.Identity{Pid: os.Getpid(), StartTime: 1, Epoch: 7})
	a, err := p.Allocate(openTestDir(t), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// Another process of the group's uid holding the arena's descriptor, or
// reaching the owner's through /proc, can neither shrink nor grow it: the
// owner's mapping, and every peer's, keeps every page.
func TestSealArenaResistsResizeByAnotherProcess(t *testing.T) {
	const lane = 3
	a := allocateHostArena(t, HostArenas{}).(*memfdArena)
	fd, err := a.ExportLaneFD(lane)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "arena")
	defer f.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), registryHelperEnv+"=reshape",
		helperProcFDEnv+"=/proc/"+strconv.Itoa(os.Getpid())+"/fd/"+strconv.Itoa(a.fds[lane]))
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reshape child: %v; said %q", err, out)
	}
	got := map[string]string{}
	s := bufio.NewScanner(strings.NewReader(string(out)))
	for s.Scan() {
		op, res, _ := strings.Cut(s.Text(), " ")
		got[op] = res
	}
	for _, op := range reshapeOps {
		if got[op] != "EPERM" {
			t.Errorf("child's %s: %q, want EPERM", op, got[op])
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(a.fds[lane], &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != staging.LaneBytes {
		t.Fatalf("lane %d is %d bytes after the child, want %d", lane, st.Size, uint64(staging.LaneBytes))
	}
	a.mem[staging.LaneOffset(lane+1)-1] = 0x5a
}

// A peer maps a descriptor only when nothing can change its size and it
// holds one lane: a tmpfs file, an unsealed or partly sealed memfd is
// refused with the seals it has, a sealed one of another size with its
// size, and nothing is mapped.
func TestSealOpenLaneFDRefusesUnsealedDescriptors(t *testing.T) {
	memfd := func(t *testing.T, size int64, mode uint32, seals int) int {
		fd, err := unix.MemfdCreate("arena-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.Fchmod(fd, mode); err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, size); err != nil {
			t.Fatal(err)
		}
		if seals != 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	tmpfsFile := func(t *testing.T) int {
		path := filepath.Join(regTestRoot(t), folder.ArenaFileName(staging.Identity{Pid: 1, StartTime: 1, Epoch: 1}))
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.Ftruncate(fd, staging.ArenaSize); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	size := int64(staging.LaneBytes)
	tests := []struct {
		name string
		fd   func(t *testing.T) int
		want string // "" accepts
	}{
		{"a file of the registry folder", tmpfsFile, "refused"},
		{"memfd without seals", func(t *testing.T) int { return memfd(t, size, 0o600, 0) }, "sealed none"},
		{"memfd sealed against shrinking only", func(t *testing.T) int { return memfd(t, size, 0o600, unix.F_SEAL_SHRINK) }, "sealed shrink, want seal|shrink|grow"},
		{"memfd whose seals can still change", func(t *testing.T) int { return memfd(t, size, 0o600, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) }, "sealed shrink|grow, want"},
		{"sealed memfd others may read", func(t *testing.T) int { return memfd(t, size, 0o644, arenaSeals) }, "has mode 0644"},
		{"sealed memfd smaller than a lane", func(t *testing.T) int { return memfd(t, 1<<20, 0o600, arenaSeals) }, "a file of 1048576 bytes, want one lane"},
		{"sealed memfd of a whole arena", func(t *testing.T) int { return memfd(t, staging.ArenaSize, 0o600, arenaSeals) }, "want one lane"},
		{"sealed memfd of a lane's size", func(t *testing.T) int { return memfd(t, size, 0o600, arenaSeals) }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fd := tt.fd(t)
			p, err := HostArenas{}.OpenLaneFD(fd, 2)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("OpenLaneFD = %v, want the lane mapped", err)
				}
				p.Close()
				return
			}
			if p != nil || err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "lane 2: descriptor "+strconv.Itoa(fd)) {
				t.Errorf("OpenLaneFD = %v, %v; want a refusal naming lane 2, descriptor %d and saying %q", p, err, fd, tt.want)
			}
		})
	}
}

// unsealedArenas hands out, for a lane, a descriptor of an unsealed memfd
// of the lane's size: a relay offering memory that could shrink under its
// peers.
type unsealedArenas struct{ HostArenas }

type unsealedArena struct{ staging.Arena }

func (p unsealedArenas) Allocate(dir *os.File, name string) (staging.Arena, error) {
	a, err := p.HostArenas.Allocate(dir, name)
	if err != nil {
		return nil, err
	}
	return unsealedArena{a}, nil
}

func (unsealedArena) ExportLaneFD(lane int) (int, error) {
	fd, err := unix.MemfdCreate("unsealed-lane", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Ftruncate(fd, staging.LaneBytes); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// A relay whose arena socket hands out an unsealed descriptor is not
// used: the sender's attach fails saying why, holds no lane and maps
// nothing, and the relay is not tried again.
func TestSealAttachRefusesUnsealedArena(t *testing.T) {
	root := regTestRoot(t)
	o := regOptions(root, "g", "rail0")
	o.Arenas = unsealedArenas{HostArenas{ByName: true}}
	relay := mustRegister(t, o)
	if relay.Header().ArenaShares&staging.ShareLaneFD == 0 {
		t.Fatalf("the relay offers shares %#x, want a descriptor", relay.Header().ArenaShares)
	}
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	p := peerByName(t, sender, relay.Name())
	for range 2 {
		l, err := sender.Attach(context.Background(), p)
		if l != nil || err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "sealed") {
			t.Fatalf("Attach = %v, %v; want a refusal of the unsealed arena", l, err)
		}
	}
	// The refused attach released its claim; the relay sees the release
	// on its socket goroutine.
	pollUntil(t, "the refused attach's claim released", func() bool { return len(relay.Leases()) == 0 })
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), folder.ArenaFileName(relay.Identity())); n != 1 {
		t.Errorf("the arena is mapped %d times in this process, want once: by the relay alone", n)
	}
}

// Mapping a peer's arena by name is something a rank opts into: by
// default a named arena, which nothing can seal, is refused.
func TestSealOpenByNameNeedsByName(t *testing.T) {
	a := allocateHostArena(t, HostArenas{ByName: true})
	if _, ok := a.(staging.LaneFDArena); ok {
		t.Errorf("a by-name arena hands out descriptors; they could not be sealed")
	}
	h, err := a.Export()
	if err != nil {
		t.Fatal(err)
	}
	dir := openTestDir(t)
	if p, err := (HostArenas{}).Open(dir, h); p != nil || err == nil || !strings.Contains(err.Error(), "sealed descriptor only") {
		t.Errorf("Open by name = %v, %v; want it refused", p, err)
	}
}

// An arena by name is a file of the folder too: on a full tmpfs its
// allocation fails at registration, naming the folder and the arena's
// size, and the rank leaves nothing behind.
func TestSpaceFullTmpfsFailsByNameArena(t *testing.T) {
	root := mountSmallTmpfs(t)
	o := regOptions(root, "g", "rail0")
	o.Arenas = HostArenas{ByName: true}
	r, err := Register(context.Background(), o)
	var ie *InitError
	var ns *NoSpaceError
	if r != nil || !errors.As(err, &ie) || ie.Step != StepAllocateArena || !errors.As(err, &ns) || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Register = %v, %v; want no room for the arena at %q", r, err, StepAllocateArena)
	}
	if ns.Dir != groupDir(root, "g") || ns.Size != staging.ArenaSize || !strings.Contains(err.Error(), strconv.FormatUint(uint64(staging.ArenaSize), 10)) {
		t.Errorf("NoSpaceError %+v (%v), want the folder %s and %d bytes", ns, err, groupDir(root, "g"), uint64(staging.ArenaSize))
	}
	if names := listDir(t, groupDir(root, "g")); !slices.Equal(names, []string{folder.LockFileName}) {
		t.Errorf("the failed rank left %v", names)
	}
}

// helperOpenLane prints the id of the OS thread it stays on, waits for a
// byte on stdin, maps the descriptor it inherited as fd 3 as lane 0 from
// that thread, and says "mapped <the descriptor's size then>" or
// "refused <why>".
func helperOpenLane() int {
	runtime.LockOSThread()
	fmt.Println(unix.Gettid())
	var b [1]byte
	for {
		_, err := unix.Read(0, b[:])
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN) {
			fmt.Println("stdin", err)
			return 1
		}
		unix.Poll([]unix.PollFd{{Fd: 0, Events: unix.POLLIN}}, -1)
	}
	pl, err := HostArenas{}.OpenLaneFD(3, 0)
	if err != nil {
		fmt.Println("refused", err)
		return 0
	}
	defer pl.Close()
	var st unix.Stat_t
	if err := unix.Fstat(3, &st); err != nil {
		fmt.Println("fstat", err)
		return 1
	}
	fmt.Println("mapped", st.Size)
	return 0
}

// A rank's control file is a named tmpfs file, which takes no seals: any
// process of the group's uid can shrink it. The rank does not map it, so
// when another process (truncate(1) here) empties the file the rank goes
// on beating, publishing its counters and closing without a fault, its
// next write puts the whole block back, and peers read it again.
func TestSealControlFileShrunkByAnotherProcess(t *testing.T) {
	truncate, err := exec.LookPath("truncate")
	if err != nil {
		t.Skipf("truncate(1) not found: %v", err)
	}
	root := regTestRoot(t)
	r := mustRegister(t, regOptions(root, "g", "rail0"))
	path := filepath.Join(r.Dir(), r.Name())
	if out, err := exec.Command(truncate, "-s", "0", path).CombinedOutput(); err != nil {
		t.Fatalf("truncate -s 0 %s: %v\n%s", path, err, out)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
		t.Fatalf("the control file after truncate: %v, %v", fi, err)
	}
	now := staging.MonoNanos() + int64(heartbeatPeriod)
	if !r.Heartbeat(now) {
		t.Fatal("Heartbeat took no beat a period after the last")
	}
	r.PublishStats(&staging.RankStats{RelayedBytes: 4096}, now)
	fi, err := os.Stat(path)
	if err != nil || fi.Size() < int64(staging.ControlSize) {
		t.Fatalf("the control file after the next beat: %v, %v; want the whole %d-byte block back", fi, err, staging.ControlSize)
	}
	if hb := fileHeartbeat(t, path); hb != now {
		t.Errorf("heartbeat in the file %d, want the beat's %d", hb, now)
	}
	peer := mustRegister(t, regOptions(root, "g", "rail1"))
	if p := peerByName(t, peer, r.Name()); p.Rail != "rail0" {
		t.Errorf("a peer reads %+v, want the rank on rail0", p)
	}
	r.BeginClose()
}
