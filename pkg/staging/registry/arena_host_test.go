// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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

func TestArenaHostAllocateIsSparseAndShared(t *testing.T) {
	dir := openTestDir(t)
	name := folder.ArenaFileName(staging.Identity{Pid: os.Getpid(), StartTime: 1, Epoch: 2})
	a, err := HostArenas{}.Allocate(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir.Name(), name)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != staging.ArenaSize || st.Mode&0o7777 != 0o600 {
		t.Errorf("arena file: %d bytes mode %04o, want %d bytes mode 0600", st.Size, st.Mode&0o7777, staging.ArenaSize)
	}
	if used := st.Blocks * 512; used > 1<<20 {
		t.Errorf("a fresh arena occupies %d bytes; allocation must not touch its pages", used)
	}
	if a.Kind() != staging.ArenaHost || a.Size() != staging.ArenaSize || a.Base() == 0 {
		t.Errorf("arena kind %d size %d base %#x", a.Kind(), a.Size(), a.Base())
	}
	h, err := a.Export()
	if err != nil {
		t.Fatal(err)
	}
	p, err := HostArenas{}.Open(dir, h)
	if err != nil {
		t.Fatal(err)
	}
	own, peer := a.(*hostArena).mem, p.(*hostPeerArena).mem
	off := staging.SlotOffset(staging.LaneCount-1, staging.SlotsPerLane-1) + staging.SlotSize - 1
	own[off] = 0xa5
	if peer[off] != 0xa5 || p.Base() == a.Base() {
		t.Errorf("peer mapping at %#x reads %#x at the arena's last byte, want 0xa5 through its own mapping", p.Base(), peer[off])
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
	if err := a.Close(); err != nil {
		t.Errorf("second Close = %v", err)
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
		p, err := HostArenas{}.Open(dir, tt.handle)
		if p != nil || err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Open = %v, %v; want an error saying %q", tt.name, p, err, tt.want)
		}
	}
	if _, err := (HostArenas{}).Allocate(dir, "../escape"); err == nil {
		t.Errorf("Allocate accepted a path")
	}
	if _, err := (HostArenas{}).Allocate(dir, short); !errors.Is(err, unix.EEXIST) {
		t.Errorf("Allocate over an existing file = %v, want EEXIST", err)
	}
}
