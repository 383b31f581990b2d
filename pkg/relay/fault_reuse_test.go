// SPDX-License-Identifier: Apache-2.0

package relay_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
)

// A member that held a lane of a relay and kept, after releasing it, a
// mapping of the lane's staging memory and a descriptor of it reaches
// nothing the lane's next holder stages: what the honest sender that
// claims the lane next stages never shows in the member's view, and what
// the member writes through its mapping and its descriptor while the
// honest sender sends reaches neither the relay's view of the lane nor
// any destination: every destination holds the honest sender's bytes.
func TestFaultLaneStagingIsNewForItsNextHolder(t *testing.T) {
	const pieces = 6
	g := newFaultGroup(t, faultGroupOpts{rails: 3})
	r := g.start("relay", 1, faultMiB)
	h := attachHostile(t, g, g.hostileRank(2), r)
	lane := h.link.LaneIndex()
	if h.link.ArenaShare() != staging.ShareLaneFD {
		t.Fatalf("the member maps the relay's arena by share %d, want by lane descriptor", h.link.ArenaShare())
	}
	kept := keepMapping(t, h.link.StagingBase(), staging.LaneBytes)
	keptFD := openRelayLaneFD(t, r, lane)
	defer unix.Close(keptFD)
	const hostileByte = 0xee
	fillStaged(kept, pieces, hostileByte)
	if err := h.link.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the member's lane freed", func() bool { return g.laneOf(r.pid, os.Getpid()) == nil })

	s := g.start("honest sender", 0, 4*faultMiB)
	s.route(faultRail(1), true, 20*time.Second)
	if l := g.laneOf(r.pid, s.pid); l == nil || l.Lane != lane {
		t.Fatalf("the honest sender holds lane %+v of the relay, want lane %d, the member's before", l, lane)
	}
	s.submit(true, faultWrites(1, pieces, faultPiece, 0, 0)...)
	ts := s.wait(20 * time.Second)
	checkStates(t, ts, map[string]int{"completed": pieces})
	g.verify(0, ts)
	// The honest sender's bytes went through the lane's slots: none of
	// them is in what the member still maps or holds.
	var honest [64]byte
	faultPattern(honest[:], faultSeed(0), 0)
	viaFD := make([]byte, pieces*staging.SlotSize)
	if _, err := unix.Pread(keptFD, viaFD, 0); err != nil {
		t.Fatal(err)
	}
	for what, b := range map[string][]byte{"mapping": kept[:pieces*staging.SlotSize], "descriptor": viaFD} {
		if bytes.Contains(b, honest[:]) {
			t.Errorf("the member's kept %s shows what the lane's next holder staged", what)
		}
	}

	// Now the member writes its bytes, through both, while the honest
	// sender sends again.
	chunk := bytes.Repeat([]byte{hostileByte}, faultPiece)
	scribble := func() {
		fillStaged(kept, pieces, hostileByte)
		for p := range pieces {
			if _, err := unix.Pwrite(keptFD, chunk, int64(p*staging.SlotSize)); err != nil {
				t.Errorf("write through the kept descriptor: %v", err)
				return
			}
		}
	}
	scribble()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			scribble()
		}
	}()
	s.submit(true, faultWrites(1, pieces, faultPiece, 0, uint64(pieces)*faultPiece)...)
	ts = s.wait(20 * time.Second)
	close(stop)
	wg.Wait()
	scribble()
	checkStates(t, ts, map[string]int{"completed": 2 * pieces})
	g.verify(0, ts)
	view := relayLaneView(t, r, lane, pieces*staging.SlotSize)
	if i := bytes.Index(view, bytes.Repeat([]byte{hostileByte}, 64)); i >= 0 {
		t.Errorf("the relay's view of lane %d holds the member's bytes at offset %d", lane, i)
	}
	for k := range g.tgt {
		if i := bytes.Index(g.tgt[k], bytes.Repeat([]byte{hostileByte}, 64)); i >= 0 {
			t.Errorf("rail %d's destination holds the member's bytes at offset %d", k, i)
		}
	}
}

// keepMapping makes a second mapping of the shared mapping of n bytes at
// addr (mremap of old size 0), which stays when the first is unmapped.
func keepMapping(t *testing.T, addr uintptr, n int) []byte {
	t.Helper()
	p, _, errno := unix.Syscall6(unix.SYS_MREMAP, addr, 0, uintptr(n), unix.MREMAP_MAYMOVE, 0, 0)
	if errno != 0 {
		t.Fatalf("mremap of the lane's mapping: %v", errno)
	}
	// p is a new shared mapping of the lane, not Go memory.
	b := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// fillStaged writes v over the first faultPiece bytes of the first n
// slots of lane memory b.
func fillStaged(b []byte, n int, v byte) {
	for p := range n {
		s := b[p*staging.SlotSize : p*staging.SlotSize+faultPiece]
		for i := range s {
			s[i] = v
		}
	}
}

// laneMemfd reports whether a /proc link or maps path names the staging
// memfd of lane of the host arena of p (not one of a claim's blocks, nor
// a lane p holds on another rank).
func laneMemfd(p *faultProc, path string, lane int) bool {
	arena := "arena-" + strings.TrimPrefix(p.rank, "rank-")
	return path == fmt.Sprintf("/memfd:%s.lane%d (deleted)", arena, lane)
}

// openRelayLaneFD opens, through the relay process's descriptor table,
// the memfd that is lane's staging memory there now: the memory object
// the lane's holder was given.
func openRelayLaneFD(t *testing.T, p *faultProc, lane int) int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", p.pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !laneMemfd(p, link, lane) {
			continue
		}
		fd, err := unix.Open(filepath.Join(dir, e.Name()), unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	t.Fatalf("the relay holds no descriptor of lane %d's staging memory", lane)
	return -1
}

// relayLaneView reads the first n bytes of lane's staging memory as the
// relay process maps it, from its memory.
func relayLaneView(t *testing.T, p *faultProc, lane int, n int) []byte {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 || !laneMemfd(p, strings.Join(f[5:], " "), lane) {
			continue
		}
		lo, _, _ := strings.Cut(f[0], "-")
		start, err := strconv.ParseUint(lo, 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", p.pid))
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Close()
		b := make([]byte, n)
		if _, err := mem.ReadAt(b, int64(start)); err != nil {
			t.Fatal(err)
		}
		return b
	}
	t.Fatalf("the relay maps no staging memory of lane %d", lane)
	return nil
}
