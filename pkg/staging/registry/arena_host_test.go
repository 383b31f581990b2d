// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

func openTestDir(t *testing.T) *os.File {
	t.Helper()
	dir := filepath.Join(regTestRoot(t), "arenas")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// A host arena is one sealed memfd a lane, 0600, one lane long, mapped
// side by side in one arena of ArenaSize, with no file in the folder and
// no handle; a peer maps one lane from its descriptor, exactly one lane
// long, and sees the owner's bytes of that lane through its own mapping.
func TestArenaHostAllocateIsSealedAndSharedByLane(t *testing.T) {
	dir := openTestDir(t)
	name := folder.ArenaFileName(staging.Identity{Pid: os.Getpid(), StartTime: 1, Epoch: 2})
	a, err := HostArenas{}.Allocate(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	if names := listDir(t, dir.Name()); len(names) != 0 {
		t.Errorf("the folder holds %v, want nothing: the arena is memfds", names)
	}
	if _, err := a.Export(); !errors.Is(err, staging.ErrNoHandle) {
		t.Errorf("Export = %v, want ErrNoHandle", err)
	}
	if a.Kind() != staging.ArenaHost || a.Size() != staging.ArenaSize || a.Base() == 0 {
		t.Errorf("arena kind %d size %d base %#x", a.Kind(), a.Size(), a.Base())
	}
	la := a.(staging.LaneFDArena)
	own := a.(*memfdArena).mem
	for lane := range staging.LaneCount {
		fd, err := la.ExportLaneFD(lane)
		if err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size != staging.LaneBytes || st.Mode&0o7777 != 0o600 || seals&arenaSeals != arenaSeals {
			t.Errorf("lane %d memfd: %d bytes mode %04o seals %s, want %d bytes mode 0600 seals %s", lane, st.Size, st.Mode&0o7777, sealNames(seals), staging.LaneBytes, sealNames(arenaSeals))
		}
		p, err := HostArenas{}.OpenLaneFD(fd, lane)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		if p.Lane() != lane || testtools.MappingSize(t, p.Base()) != staging.LaneBytes {
			t.Errorf("lane %d mapped as lane %d, %d bytes; want %d", lane, p.Lane(), testtools.MappingSize(t, p.Base()), uint64(staging.LaneBytes))
		}
		peer := foreignBytes(p.Base(), staging.LaneBytes)
		first, last := staging.LaneOffset(lane), staging.SlotOffset(lane, staging.SlotsPerLane-1)+staging.SlotSize-1
		own[first], own[last] = byte(lane+1), 0xa5
		if peer[0] != byte(lane+1) || peer[staging.LaneBytes-1] != 0xa5 {
			t.Errorf("lane %d: the peer reads %#x, %#x at the lane's first and last byte, want %#x, 0xa5", lane, peer[0], peer[staging.LaneBytes-1], lane+1)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, lane := range []int{-1, staging.LaneCount} {
		if fd, err := la.ExportLaneFD(lane); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("lane %d", lane)) {
			unix.Close(fd)
			t.Errorf("ExportLaneFD(%d) = %v, want an error naming the lane", lane, err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if mapsMention(t, name) {
		t.Errorf("arena mapping left after Close")
	}
	if _, err := la.ExportLaneFD(0); err == nil {
		t.Errorf("ExportLaneFD after Close succeeded")
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

// A by-name arena is a file of the folder with every block allocated when
// it is created, mapped by name by a rank that opts in.
func TestArenaHostByNameIsAllocatedInFull(t *testing.T) {
	dir := openTestDir(t)
	name := folder.ArenaFileName(staging.Identity{Pid: os.Getpid(), StartTime: 1, Epoch: 2})
	byName := HostArenas{ByName: true}
	a, err := byName.Allocate(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir.Name(), name)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != staging.ArenaSize || st.Mode&0o7777 != 0o600 || st.Blocks*512 < staging.ArenaSize {
		t.Errorf("arena file: %d bytes in %d blocks, mode %04o; want %d bytes all allocated, mode 0600", st.Size, st.Blocks, st.Mode&0o7777, staging.ArenaSize)
	}
	h, err := a.Export()
	if err != nil {
		t.Fatal(err)
	}
	p, err := byName.Open(dir, h)
	if err != nil {
		t.Fatal(err)
	}
	own, peer := a.(*fileArena).mem, p.(*hostPeerArena).mem
	own[len(own)-1] = 0xa5
	if peer[len(peer)-1] != 0xa5 {
		t.Errorf("peer mapping reads %#x at the arena's last byte, want 0xa5", peer[len(peer)-1])
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if fileExists(path) || mapsMention(t, name) {
		t.Errorf("arena file or mapping left after Close")
	}
}

func TestArenaHostOpenRefusesBadHandles(t *testing.T) {
	dir := openTestDir(t)
	id := staging.Identity{Pid: os.Getpid(), StartTime: 1, Epoch: 3}
	short := folder.ArenaFileName(id)
	writeFile0600(t, filepath.Join(dir.Name(), short), make([]byte, 4096))
	link := folder.ArenaFileName(staging.Identity{Pid: os.Getpid(), StartTime: 1, Epoch: 4})
	if err := os.Symlink(short, filepath.Join(dir.Name(), link)); err != nil {
		t.Fatal(err)
	}
	handle := func(s string) (h [staging.ArenaHandleSize]byte) {
		copy(h[:], s)
		return h
	}
	trailing := handle(short)
	trailing[len(trailing)-1] = 'x'
	tests := []struct {
		name   string
		handle [staging.ArenaHandleSize]byte
		want   string
	}{
		{"zeros", [staging.ArenaHandleSize]byte{}, "not an arena name"},
		{"path", handle("../../etc/passwd"), "not an arena name"},
		{"arena in another directory", handle("arena-1-2-0000000000000003/../x"), "not an arena name"},
		{"bytes after the name", trailing, "bytes after its name"},
		{"missing file", handle(folder.ArenaFileName(staging.Identity{Pid: 1, StartTime: 1, Epoch: 1})), "no such file"},
		{"file shorter than an arena", handle(short), "is 4096 bytes"},
		{"symlink", handle(link), "is a symlink"},
	}
	for _, tt := range tests {
		p, err := HostArenas{ByName: true}.Open(dir, tt.handle)
		if p != nil || err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Open = %v, %v; want an error saying %q", tt.name, p, err, tt.want)
		}
	}
	if _, err := (HostArenas{}).Allocate(dir, "../escape"); err == nil {
		t.Errorf("Allocate accepted a path")
	}
	if _, err := (HostArenas{ByName: true}).Allocate(dir, short); !errors.Is(err, unix.EEXIST) {
		t.Errorf("Allocate over an existing file = %v, want EEXIST", err)
	}
}
