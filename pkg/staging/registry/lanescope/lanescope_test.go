// SPDX-License-Identifier: Apache-2.0

// Package lanescope tests, through the registry's exported API and the
// kernel's view of this process's mappings, what a lane's holder can reach
// of its relay's memory (ABI 6, docs/abi.md).
package lanescope

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

func register(t *testing.T, root, rail string) *registry.Rank {
	t.Helper()
	o := registry.Options{Root: root, Group: "scope", UID: os.Geteuid(), Rail: rail, HCA: "hca-" + rail, HeartbeatTimeout: 30 * time.Second}
	r, err := registry.Register(context.Background(), o)
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	return r
}

func attach(t *testing.T, sender, relay *registry.Rank) *registry.PeerLink {
	t.Helper()
	peers, err := sender.AppendPeers(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peers {
		if p.Identity == relay.Identity() {
			l, err := sender.Attach(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			return l
		}
	}
	t.Fatalf("relay %v not among the peers %v", relay.Identity(), peers)
	return nil
}

// mapping is one line of /proc/self/maps.
type mapping struct {
	start, end uintptr
	perms      string
	path       string
}

func mappings(t *testing.T, suffix string) []mapping {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasSuffix(strings.Join(fields[5:], " "), suffix) {
			continue
		}
		var m mapping
		lo, hi, _ := strings.Cut(fields[0], "-")
		for _, c := range []struct {
			s string
			p *uintptr
		}{{lo, &m.start}, {hi, &m.end}} {
			var v uintptr
			for _, ch := range c.s {
				v = v*16 + uintptr(strings.IndexRune("0123456789abcdef", ch))
			}
			*c.p = v
		}
		m.perms, m.path = fields[1], strings.Join(fields[5:], " ")
		out = append(out, m)
	}
	return out
}

// TestHolderCannotWriteItsRelayBlock: the holder maps its relay block
// read-only, and the memfd's seals refuse every way to write it or change
// its size: a writable mmap, write(2), mprotect of the holder's mapping,
// ftruncate. The sender block keeps its size too.
func TestHolderCannotWriteItsRelayBlock(t *testing.T) {
	root := t.TempDir()
	relay := register(t, root, "r0")
	sender := register(t, root, "r1")
	l := attach(t, sender, relay)
	var held mapping
	for _, m := range mappings(t, ".relay (deleted)") {
		if m.perms == "r--s" {
			held = m
		}
	}
	if held.start == 0 {
		t.Fatalf("no read-only mapping of a relay block among %+v", mappings(t, ".relay"))
	}
	path := filepath.Join("/proc/self/map_files", fmtRange(held))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("open %s: %v (no access to map_files here)", path, err)
	}
	defer unix.Close(fd)
	size := int(staging.RelayBlockSize)
	if mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		unix.Munmap(mem)
		t.Fatal("a writable shared mapping of the relay block was made")
	} else if !errors.Is(err, unix.EPERM) {
		t.Fatalf("mmap PROT_WRITE = %v, want EPERM", err)
	}
	if _, err := unix.Pwrite(fd, []byte{1}, 0); !errors.Is(err, unix.EPERM) {
		t.Fatalf("pwrite of the relay block = %v, want EPERM", err)
	}
	if _, _, e := unix.Syscall(unix.SYS_MPROTECT, held.start, held.end-held.start, unix.PROT_READ|unix.PROT_WRITE); e == 0 {
		t.Fatal("mprotect made the holder's mapping of the relay block writable")
	}
	for _, n := range []int64{0, int64(size) * 2} {
		if err := unix.Ftruncate(fd, n); !errors.Is(err, unix.EPERM) {
			t.Fatalf("ftruncate of the relay block to %d = %v, want EPERM", n, err)
		}
	}
	if !l.Sender().Opened() && l.LaneEpoch() == 0 {
		t.Fatal("no lane epoch")
	}
	for _, m := range mappings(t, ".sender (deleted)") {
		p := fmtRange(m)
		sfd, err := unix.Open(filepath.Join("/proc/self/map_files", p), unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		for _, n := range []int64{0, int64(staging.SenderBlockSize) * 2} {
			if err := unix.Ftruncate(sfd, n); !errors.Is(err, unix.EPERM) {
				t.Errorf("ftruncate of a sender block to %d = %v, want EPERM", n, err)
			}
		}
		unix.Close(sfd)
	}
}

func fmtRange(m mapping) string {
	const hex = "0123456789abcdef"
	f := func(v uintptr) string {
		if v == 0 {
			return "0"
		}
		var b []byte
		for ; v > 0; v /= 16 {
			b = append([]byte{hex[v%16]}, b...)
		}
		return string(b)
	}
	return f(m.start) + "-" + f(m.end)
}

// TestControlFileHoldsNoLaneWords: a Desc the holder commits is in its
// lane's sender block, and nowhere in the relay's control file, which a
// group member can open; the file is a version-5 file's length, sparse.
func TestControlFileHoldsNoLaneWords(t *testing.T) {
	root := t.TempDir()
	relay := register(t, root, "r0")
	sender := register(t, root, "r1")
	l := attach(t, sender, relay)
	tx := l.Sender()
	seq := tx.Next()
	const session = "a-session-name-only-the-desc-holds"
	if err := tx.Commit(seq, session, []staging.PlanEntry{{Dst: 0x1000, Len: 64}}, 64, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(relay.Dir(), relay.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 8316160 {
		t.Errorf("control file of %d bytes, want 8316160", len(b))
	}
	if bytes.Contains(b, []byte(session)) {
		t.Fatal("the holder's Desc is in the relay's control file")
	}
	if bytes.IndexFunc(b[staging.ControlSize:], func(r rune) bool { return r != 0 }) >= 0 {
		t.Fatal("bytes past the control block")
	}
}
