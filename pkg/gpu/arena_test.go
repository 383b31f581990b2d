// SPDX-License-Identifier: Apache-2.0

package gpu_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/fakecuda"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

func TestParseArenaShare(t *testing.T) {
	for _, s := range []gpu.ArenaShare{gpu.ShareAuto, gpu.ShareLegacyIPC, gpu.ShareDescriptor} {
		got, err := gpu.ParseArenaShare(s.String())
		if err != nil || got != s {
			t.Errorf("ParseArenaShare(%q) = %v, %v", s.String(), got, err)
		}
	}
	if _, err := gpu.ParseArenaShare("posix"); err == nil || !strings.Contains(err.Error(), `"posix"`) {
		t.Errorf("ParseArenaShare(posix) = %v, want an error naming the value", err)
	}
}

// TestImportErrorText: the reason a relay's arena cannot be mapped is
// spelled out from the failing step and code, and every such error is
// recognisable as ErrPeerArenaUnusable while keeping the driver's code.
func TestImportErrorText(t *testing.T) {
	for _, tc := range []struct {
		e    *gpu.ImportError
		hint string
	}{
		{&gpu.ImportError{Share: gpu.ShareDescriptor, Step: "cuMemImportFromShareableHandle", Device: 0,
			Err: &cuda.Error{Call: "cuMemImportFromShareableHandle(fd 9, POSIX fd)", Code: cuda.ErrorInvalidDevice}}, "device node"},
		{&gpu.ImportError{Share: gpu.ShareDescriptor, Step: "cuMemSetAccess", Device: 1,
			Err: &cuda.Error{Call: "cuMemSetAccess", Code: cuda.ErrorInvalidDevice}}, "no peer access"},
		{&gpu.ImportError{Share: gpu.ShareLegacyIPC, Step: "cuIpcOpenMemHandle", Device: 0,
			Err: &cuda.Error{Call: "cuIpcOpenMemHandle", Code: cuda.ErrorInvalidContext}}, "sibling PID namespaces"},
		{&gpu.ImportError{Share: gpu.ShareDescriptor, Step: "cuMemMap", Device: 0,
			Err: &cuda.Error{Call: "cuMemMap", Code: cuda.NotAvailable}}, "lacks this entry point"},
		{&gpu.ImportError{Share: gpu.ShareDescriptor, Step: "cuMemMap", Device: 0,
			Err: &cuda.Error{Call: "cuMemMap", Code: cuda.ErrorInvalidValue}}, ""},
	} {
		msg := tc.e.Error()
		if tc.hint != "" && !strings.Contains(msg, tc.hint) {
			t.Errorf("%q lacks the hint %q", msg, tc.hint)
		}
		if tc.hint == "" && tc.e.Hint() != "" {
			t.Errorf("%q: unexpected hint %q", msg, tc.e.Hint())
		}
		if !strings.Contains(msg, tc.e.Step) || !strings.Contains(msg, "shared by "+tc.e.Share.String()) {
			t.Errorf("%q does not name the step and the share", msg)
		}
		var wrapped error = fmt.Errorf("attach: %w", tc.e)
		var ce *cuda.Error
		if !errors.Is(wrapped, gpu.ErrPeerArenaUnusable) || !errors.As(wrapped, &ce) || ce.Code != tc.e.Err.(*cuda.Error).Code {
			t.Errorf("%v: not ErrPeerArenaUnusable with its driver code", wrapped)
		}
	}
}

func arenaShares() []gpu.ArenaShare { return []gpu.ArenaShare{gpu.ShareLegacyIPC, gpu.ShareDescriptor} }

// newArenas returns a provider for share, skipping descriptor sharing
// where the device does not offer it.
func newArenas(t testing.TB, g *gpu.GPU, share gpu.ArenaShare) *gpu.Arenas {
	t.Helper()
	if share == gpu.ShareDescriptor {
		if err := g.Driver().FDShareSupport(g.Device()); err != nil {
			t.Skipf("skipping: %v", err)
		}
	}
	return gpu.NewArenasWith(g, gpu.ArenaOptions{Share: share})
}

func TestArenas(t *testing.T) {
	for _, share := range arenaShares() {
		t.Run(share.String(), func(t *testing.T) {
			g := openGPU(t)
			p := newArenas(t, g, share)
			if p.Kind() != staging.ArenaCUDA {
				t.Fatalf("Kind = %d", p.Kind())
			}
			a, err := p.Allocate(nil, "arena-x")
			if err != nil {
				t.Fatal(err)
			}
			if got, why := p.Share(); got != share {
				t.Fatalf("provider shares by %v (%s), want %v", got, why, share)
			}
			if a.Kind() != staging.ArenaCUDA || a.Size() != staging.ArenaSize || a.Base() == 0 {
				t.Fatalf("arena kind %d size %d base %#x", a.Kind(), a.Size(), a.Base())
			}
			fa, isFD := a.(staging.LaneFDArena)
			// A legacy arena is one allocation; a descriptor arena one a
			// lane, side by side in one reserved range, which a driver
			// may report as one range (an H100's, CUDA 13.0, does) or
			// not (the stand-in): only each lane's answer is PXN's to
			// judge.
			whole := g.Driver().Classify(0, cuda.DevicePtr(a.Base()), a.Size()) == cuda.MemoryDevice
			if !isFD && !whole {
				t.Fatal("a legacy arena is not one device allocation of its size")
			}
			for lane := range staging.LaneCount {
				if g.Driver().Classify(0, cuda.DevicePtr(a.Base())+cuda.DevicePtr(staging.LaneOffset(lane)), staging.LaneBytes) != cuda.MemoryDevice {
					t.Fatalf("lane %d is not inside one device allocation", lane)
				}
			}
			fill(t, g, cuda.DevicePtr(a.Base())+cuda.DevicePtr(staging.ArenaSize-4096), 0x5a5a5a5a, 4096)
			h, err := a.Export()
			switch share {
			case gpu.ShareLegacyIPC:
				if isFD || err != nil || h == ([staging.ArenaHandleSize]byte{}) {
					t.Fatalf("legacy arena: LaneFDArena %v, Export = %x, %v", isFD, h, err)
				}
			case gpu.ShareDescriptor:
				if !isFD || !errors.Is(err, staging.ErrNoHandle) {
					t.Fatalf("descriptor arena: LaneFDArena %v, Export error %v", isFD, err)
				}
				for _, lane := range []int{0, staging.LaneCount - 1} {
					fd, err := fa.ExportLaneFD(lane)
					if err != nil {
						t.Fatal(err)
					}
					flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
					unix.Close(fd)
					if err != nil || flags&unix.FD_CLOEXEC == 0 {
						t.Fatalf("exported descriptor flags %#x, %v: want close-on-exec", flags, err)
					}
				}
				if fd, err := fa.ExportLaneFD(staging.LaneCount); err == nil || !strings.Contains(err.Error(), "lane 7") {
					unix.Close(fd)
					t.Fatalf("ExportLaneFD(%d) = %v, want an error naming the lane", staging.LaneCount, err)
				}
			}
			if _, err := p.Open(nil, [staging.ArenaHandleSize]byte{}); err == nil {
				t.Fatal("opened an empty handle")
			}
			var junk [staging.ArenaHandleSize]byte
			for i := range junk {
				junk[i] = byte(i*37 + 11)
			}
			if pa, err := p.Open(nil, junk); err == nil {
				pa.Close()
				t.Fatal("opened a junk handle")
			} else if !errors.Is(err, gpu.ErrPeerArenaUnusable) {
				t.Fatalf("junk handle: %v, want ErrPeerArenaUnusable", err)
			}
			if err := g.Driver().FDShareSupport(g.Device()); err == nil {
				badFDs(t, p)
			}
			if c := p.Counts(); c.FD != 0 || c.IPC != 0 || c.FailedIPC != 2 {
				t.Fatalf("counts %+v after two refused handles", c)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if err := a.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if isFD {
				if _, err := fa.ExportLaneFD(0); err == nil {
					t.Fatal("ExportLaneFD of a closed arena succeeded")
				}
			}
		})
	}
}

// badFDs: descriptors that are not a peer's lane are refused with the
// reason, and a lane out of range is refused before the driver sees the
// descriptor.
func badFDs(t *testing.T, p *gpu.Arenas) {
	t.Helper()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	before := p.Counts().FailedFD
	for _, tc := range []struct {
		fd, lane int
		is       error
	}{
		{-1, 0, nil},
		{int(null.Fd()), 2, gpu.ErrPeerArenaUnusable},
		{int(null.Fd()), -1, registry.ErrCorruptEntry},
		{int(null.Fd()), staging.LaneCount, registry.ErrCorruptEntry},
	} {
		pa, err := p.OpenLaneFD(tc.fd, tc.lane)
		if err == nil {
			pa.Close()
			t.Fatalf("OpenLaneFD(%d, %d) succeeded", tc.fd, tc.lane)
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Fatalf("OpenLaneFD(%d, %d) = %v, want %v", tc.fd, tc.lane, err, tc.is)
		}
		if !strings.Contains(err.Error(), "lane "+strconv.Itoa(tc.lane)) {
			t.Fatalf("OpenLaneFD(%d, %d) = %v: does not name the lane", tc.fd, tc.lane, err)
		}
	}
	if got := p.Counts().FailedFD - before; got != 4 {
		t.Fatalf("%d failed descriptor maps counted, want 4", got)
	}
}

// TestArenaAcrossProcesses has another process, on this GPU and on another,
// map the arena by its handle or lane 3 by its descriptor, check what we
// wrote in lane 3 and write at the lane's very end.
func TestArenaAcrossProcesses(t *testing.T) {
	for _, share := range arenaShares() {
		for _, peer := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/peer-on-device-%d", share, peer), func(t *testing.T) {
				g := openGPU(t)
				if _, n := loadDriver(t); peer >= n {
					t.Skipf("skipping: needs %d CUDA devices, found %d", peer+1, n)
				}
				a, err := newArenas(t, g, share).Allocate(nil, "arena-x")
				if err != nil {
					t.Fatal(err)
				}
				defer a.Close()
				const n = 1 << 20
				first := cuda.DevicePtr(a.Base()) + cuda.DevicePtr(staging.SlotOffset(3, 5))
				last := cuda.DevicePtr(a.Base()) + cuda.DevicePtr(staging.LaneOffset(4)-n)
				fill(t, g, first, 0x13579bdf, n)
				fill(t, g, last, 0, n)
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), childEnv+"=arena-peer", "PXN_GPU_TEST_DEVICE="+strconv.Itoa(peer))
				if share == gpu.ShareLegacyIPC {
					h, _ := a.Export()
					cmd.Env = append(cmd.Env, "PXN_GPU_TEST_HANDLE="+hex.EncodeToString(h[:]))
				} else {
					fd, err := a.(staging.LaneFDArena).ExportLaneFD(3)
					if err != nil {
						t.Fatal(err)
					}
					f := os.NewFile(uintptr(fd), "arena")
					defer f.Close()
					cmd.ExtraFiles = []*os.File{f}
				}
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("peer: %v\n%s", err, out)
				}
				expectWords(t, g, last, 0x2468ace0, n)
			})
		}
	}
}

// TestFDArenaAcrossPIDNamespaces is the shape of two pods without hostPID:
// an owner and an importer, each the first process of a PID and mount
// namespace of its own with its own /proc (the driver's cuInit fails with
// CUDA_ERROR_OPERATING_SYSTEM in a PID namespace that still sees the
// parent's /proc), the descriptor passed over a unix socket (SCM_RIGHTS). The importer checks
// the owner's bytes and writes its own, which the owner checks. What a
// legacy IPC handle does in the same shape is logged, not judged (the
// driver decides; docs/cuda.md records what it did).
func TestFDArenaAcrossPIDNamespaces(t *testing.T) {
	d, _ := loadDriver(t)
	dev, err := d.DeviceGet(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.FDShareSupport(dev); err != nil {
		t.Skipf("skipping: %v", err)
	}
	ownerAndImporter(t, nil)
}

// TestLaneArenaAcrossPIDNamespacesOnStandIn is TestFDArenaAcrossPIDNamespaces
// on the stand-in driver with its virtual memory calls: lane 3's
// descriptor crosses into another process, and into a sibling PID
// namespace, and what each side writes the other reads.
func TestLaneArenaAcrossPIDNamespacesOnStandIn(t *testing.T) {
	lib := fakeLib(t)
	ownerAndImporter(t, []string{childDriverEnv + "=" + lib, fakecuda.VMMEnv + "=1", fakecuda.VersionEnv + "=13000"})
}

// childDriverEnv names the driver library a child loads instead of
// libcuda.so.1.
const childDriverEnv = "PXN_GPU_TEST_DRIVER"

// ownerAndImporter runs an owner and an importer child with env added,
// in one PID namespace and in two sibling ones.
func ownerAndImporter(t *testing.T, env []string) {
	t.Helper()
	for _, ns := range []bool{false, true} {
		name := map[bool]string{false: "same-namespace", true: "sibling-namespaces"}[ns]
		t.Run(name, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			ends := []*os.File{os.NewFile(uintptr(fds[0]), "owner-end"), os.NewFile(uintptr(fds[1]), "importer-end")}
			defer ends[0].Close()
			defer ends[1].Close()
			var outs [2]bytes.Buffer
			var cmds [2]*exec.Cmd
			for i, role := range []string{"arena-owner", "arena-importer"} {
				c := exec.Command(os.Args[0], "-test.run=^$")
				c.Env = append(append(os.Environ(), env...), childEnv+"="+role)
				if ns {
					c.Env = append(c.Env, ownProcEnv+"=1")
				}
				c.ExtraFiles = []*os.File{ends[i]}
				c.Stdout, c.Stderr = &outs[i], &outs[i]
				c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
				if ns {
					c.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS
				}
				if err := c.Start(); err != nil {
					if i == 0 && ns && (errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL)) {
						t.Skipf("skipping: a PID namespace cannot be made here (needs CAP_SYS_ADMIN): %v", err)
					}
					if cmds[0] != nil {
						cmds[0].Process.Kill()
						cmds[0].Wait()
					}
					t.Fatal(err)
				}
				cmds[i] = c
			}
			ends[0].Close()
			ends[1].Close()
			var errs []error
			for i, c := range cmds {
				if err := c.Wait(); err != nil {
					errs = append(errs, fmt.Errorf("child %d: %w\n%s", i, err, outs[i].String()))
				}
			}
			t.Logf("owner:\n%simporter:\n%s", outs[0].String(), outs[1].String())
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(outs[0].String(), "importer wrote its bytes") {
				t.Fatal("the owner did not confirm the importer's bytes")
			}
		})
	}
}

// ownProcEnv asks a child started in new PID and mount namespaces to mount
// a /proc of its own first.
const ownProcEnv = "PXN_GPU_TEST_OWN_PROC"

func arenaChild(role string) error {
	if os.Getenv(ownProcEnv) == "1" {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make the mount namespace private: %w", err)
		}
		if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount /proc: %w", err)
		}
	}
	switch role {
	case "arena-peer":
		return arenaPeer()
	case "arena-owner":
		return arenaOwner()
	case "arena-importer":
		return arenaImporter()
	}
	return fmt.Errorf("unknown role %q", role)
}

func childGPU(ordinal int) (*gpu.GPU, error) {
	load := cuda.Load
	if lib := os.Getenv(childDriverEnv); lib != "" {
		load = func() (*cuda.Driver, error) { return cuda.LoadLibrary(lib) }
	}
	d, err := load()
	if err != nil {
		return nil, err
	}
	return gpu.Open(d, ordinal)
}

// arenaPeer maps the parent's arena from a handle (environment) or lane
// 3 of it from a descriptor (fd 3), checks the words at slot (3, 5) and
// writes the last MiB of lane 3.
func arenaPeer() error {
	ordinal, _ := strconv.Atoi(os.Getenv("PXN_GPU_TEST_DEVICE"))
	g, err := childGPU(ordinal)
	if err != nil {
		return err
	}
	defer g.Close()
	p := gpu.NewArenas(g)
	var pa staging.PeerArena
	var lane3 uintptr
	if hs := os.Getenv("PXN_GPU_TEST_HANDLE"); hs != "" {
		raw, err := hex.DecodeString(hs)
		if err != nil {
			return err
		}
		var h [staging.ArenaHandleSize]byte
		copy(h[:], raw)
		pa, err = p.Open(nil, h)
		if err != nil {
			return err
		}
		lane3 = pa.Base() + uintptr(staging.LaneOffset(3))
	} else {
		if pa, err = p.OpenLaneFD(3, 3); err != nil {
			return err
		}
		unix.Close(3)
		lane3 = pa.Base()
	}
	return errors.Join(checkAndWrite(g, lane3, 0x13579bdf, 0x2468ace0), pa.Close())
}

// checkAndWrite checks the words at slot 5 of the lane at lane and writes
// the lane's last MiB.
func checkAndWrite(g *gpu.GPU, lane uintptr, want, write uint32) error {
	const n = 1 << 20
	d := g.Driver()
	return g.Do(func() error {
		got := make([]byte, n)
		if err := d.MemcpyDtoH(got, cuda.DevicePtr(lane)+cuda.DevicePtr(5*staging.SlotSize)); err != nil {
			return err
		}
		for off := 0; off < n; off += 4 {
			if w := *(*uint32)(unsafe.Pointer(&got[off])); w != want {
				return fmt.Errorf("peer arena word %d is %#x, want %#x", off, w, want)
			}
		}
		last := cuda.DevicePtr(lane) + cuda.DevicePtr(staging.LaneBytes-n)
		if err := d.MemsetD32Async(last, write, n/4, 0); err != nil {
			return err
		}
		return d.StreamSynchronize(0)
	})
}

// arenaOwner allocates a descriptor arena and a legacy one, sends the
// first's descriptor and the second's handle over fd 3, and checks what the
// importer wrote once it answers.
func arenaOwner() error {
	g, err := childGPU(0)
	if err != nil {
		return err
	}
	defer g.Close()
	fdA, err := gpu.NewArenasWith(g, gpu.ArenaOptions{Share: gpu.ShareDescriptor}).Allocate(nil, "")
	if err != nil {
		return err
	}
	defer fdA.Close()
	ipcA, err := gpu.NewArenasWith(g, gpu.ArenaOptions{Share: gpu.ShareLegacyIPC}).Allocate(nil, "")
	if err != nil {
		return err
	}
	defer ipcA.Close()
	const n = 1 << 20
	d := g.Driver()
	err = g.Do(func() error {
		for _, a := range []staging.Arena{fdA, ipcA} {
			if err := d.MemsetD32Async(cuda.DevicePtr(a.Base())+cuda.DevicePtr(staging.SlotOffset(3, 5)), 0x13579bdf, n/4, 0); err != nil {
				return err
			}
			if err := d.MemsetD32Async(cuda.DevicePtr(a.Base())+cuda.DevicePtr(staging.LaneOffset(4)-n), 0, n/4, 0); err != nil {
				return err
			}
		}
		return d.StreamSynchronize(0)
	})
	if err != nil {
		return err
	}
	fd, err := fdA.(staging.LaneFDArena).ExportLaneFD(3)
	if err != nil {
		return err
	}
	h, _ := ipcA.Export()
	err = unix.Sendmsg(3, h[:], unix.UnixRights(fd), nil, 0)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("sendmsg: %w", err)
	}
	buf := make([]byte, 4096)
	k, err := unix.Read(3, buf)
	if err != nil {
		return fmt.Errorf("the importer's answer: %w", err)
	}
	ans := string(buf[:k])
	if !strings.HasPrefix(ans, "ok") {
		return fmt.Errorf("importer: %s", ans)
	}
	fmt.Printf("pid namespace %s: %s\n", pidNS(), ans)
	var got [n]byte
	if err := g.Do(func() error {
		return d.MemcpyDtoH(got[:], cuda.DevicePtr(fdA.Base())+cuda.DevicePtr(staging.LaneOffset(4)-n))
	}); err != nil {
		return err
	}
	for off := 0; off < n; off += 4 {
		if w := *(*uint32)(unsafe.Pointer(&got[off])); w != 0x2468ace0 {
			return fmt.Errorf("arena word %d is %#x after the importer wrote", off, w)
		}
	}
	fmt.Println("importer wrote its bytes")
	return nil
}

// arenaImporter receives the owner's descriptor of lane 3 and handle, maps
// the lane, checks and writes; it tries the handle and says what it did.
func arenaImporter() error {
	g, err := childGPU(0)
	if err != nil {
		return err
	}
	defer g.Close()
	answer := func(s string) error {
		_, err := unix.Write(3, []byte(s))
		return err
	}
	buf := make([]byte, staging.ArenaHandleSize)
	oob := make([]byte, unix.CmsgSpace(4))
	k, oobn, _, _, err := unix.Recvmsg(3, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil || k != staging.ArenaHandleSize {
		return errors.Join(fmt.Errorf("recvmsg: %d bytes, %w", k, err), answer("err: recvmsg"))
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return errors.Join(fmt.Errorf("control messages: %d, %w", len(msgs), err), answer("err: no descriptor"))
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return errors.Join(fmt.Errorf("rights: %v, %w", fds, err), answer("err: no descriptor"))
	}
	p := gpu.NewArenas(g)
	pa, err := p.OpenLaneFD(fds[0], 3)
	unix.Close(fds[0])
	if err != nil {
		return errors.Join(err, answer("err: "+err.Error()))
	}
	if err := errors.Join(checkAndWrite(g, pa.Base(), 0x13579bdf, 0x2468ace0), pa.Close()); err != nil {
		return errors.Join(err, answer("err: "+err.Error()))
	}
	legacy := "opens"
	var h [staging.ArenaHandleSize]byte
	copy(h[:], buf)
	if la, err := p.Open(nil, h); err != nil {
		legacy = err.Error()
	} else {
		la.Close()
	}
	return answer(fmt.Sprintf("ok: importer in pid namespace %s mapped the descriptor (counts %+v); legacy IPC handle: %s", pidNS(), p.Counts(), legacy))
}

func pidNS() string {
	s, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return "?"
	}
	return s
}
