// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// answerBytes is an arena socket answer as a relay encodes it.
func answerBytes(status, lane, rights uint32, epoch uint64) []byte {
	b := fdAnswer{Status: status, Lane: lane, Rights: rights, LaneEpoch: epoch, LaneBytes: staging.LaneBytes}.encode()
	return b[:]
}

// FuzzArenaSocketAnswer sends a sender's arena socket client what a relay
// (or anything else bound to the socket's name) could send: any bytes, cut
// in two writes, the first carrying 0 to 5 descriptors. The client accepts
// only a whole answer of the right magic and status ok, naming a lane in
// range, an epoch and the 3 or 4 descriptors that came with it, and then
// hands out those descriptors; anything else is an error naming what was
// wrong. Every descriptor it received is closed once the client is (or,
// handed out, by the caller), whatever the answer: the descriptors are the
// write end of a pipe, which reads EOF only when no copy of that end is
// left open.
func FuzzArenaSocketAnswer(f *testing.F) {
	f.Add(answerBytes(fdOK, 1, 4, 9), uint8(4), uint8(32))
	f.Add(answerBytes(fdOK, 1, 3, 9), uint8(3), uint8(32))
	f.Add(answerBytes(fdOK, 1, 4, 9), uint8(4), uint8(3))
	f.Add(answerBytes(fdOK, 1, 4, 9), uint8(3), uint8(32))
	f.Add(answerBytes(fdOK, 1, 2, 9), uint8(2), uint8(32))
	f.Add(answerBytes(fdOK, 7, 4, 9), uint8(4), uint8(32))
	f.Add(answerBytes(fdOK, 1, 4, 0), uint8(4), uint8(32))
	f.Add(answerBytes(fdOK, 1, 4, 9), uint8(5), uint8(32))
	f.Add(answerBytes(fdNotHolder, 0, 0, 0), uint8(1), uint8(16))
	f.Add(answerBytes(fdHeld+1, 0, 0, 0), uint8(0), uint8(16))
	f.Add(answerBytes(fdHeld, 0, 0, 0), uint8(0), uint8(16))
	f.Add(answerBytes(fdNoFreeLane, 0, 0, 0), uint8(0), uint8(16))
	f.Add(append(answerBytes(fdOK, 1, 4, 7), "trailing"...), uint8(4), uint8(40))
	f.Add(answerBytes(fdOK, 0, 3, 1)[:31], uint8(3), uint8(8))
	f.Add([]byte("PXFX0000000000000000000000000000"), uint8(1), uint8(16))
	f.Add([]byte{}, uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, answer []byte, fds, split uint8) {
		nfds := int(fds % 6)
		cut := 0
		if len(answer) > 0 {
			cut = 1 + int(split)%len(answer)
		} else {
			nfds = 0
		}
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		relayEnd := pair[1]
		defer func() {
			if relayEnd >= 0 {
				unix.Close(relayEnd)
			}
		}()
		c := &fdClient{fd: pair[0], name: "sock-fuzz"}
		defer c.close()
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(p[0])
		var passed unix.Stat_t
		if err := unix.Fstat(p[1], &passed); err != nil {
			t.Fatal(err)
		}
		if len(answer) > 0 {
			var oob []byte
			if nfds > 0 {
				rights := make([]int, nfds)
				for i := range rights {
					rights[i] = p[1]
				}
				oob = unix.UnixRights(rights...)
			}
			if err := unix.Sendmsg(relayEnd, answer[:cut], oob, nil, 0); err != nil {
				t.Fatalf("send %d bytes with %d descriptors: %v", cut, nfds, err)
			}
			if cut < len(answer) {
				if _, err := unix.Write(relayEnd, answer[cut:]); err != nil {
					t.Fatalf("send the rest of the answer: %v", err)
				}
			}
		}
		unix.Close(p[1])
		unix.Close(relayEnd)
		relayEnd = -1

		var ans fdAnswer
		var got []int
		done := false
		for deadline := time.Now().Add(10 * time.Second); !done; {
			if time.Now().After(deadline) {
				t.Fatalf("answer %x with %d descriptors: the client never finished reading a closed socket", answer, nfds)
			}
			ans, got, done, err = c.poll(time.Millisecond)
		}
		if want := wantAnswerError(answer, nfds); want != "" {
			if err == nil {
				for _, fd := range got {
					unix.Close(fd)
				}
				t.Fatalf("answer %x with %d descriptors accepted (%+v, descriptors %v), want an error saying %q", answer, nfds, ans, got, want)
			}
			if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), c.name) {
				t.Fatalf("answer %x with %d descriptors: error %q, want it to name %s and say %q", answer, nfds, err, c.name, want)
			}
			if got != nil {
				t.Fatalf("answer %x: error %v with descriptors %v", answer, err, got)
			}
		} else {
			if err != nil {
				t.Fatalf("answer %x with %d descriptors: %v", answer, nfds, err)
			}
			if len(got) != nfds {
				t.Fatalf("%d descriptors handed out, %d passed", len(got), nfds)
			}
			for _, fd := range got {
				var st unix.Stat_t
				if err := unix.Fstat(fd, &st); err != nil {
					t.Fatalf("a descriptor handed out (%d) is not open: %v", fd, err)
				}
				unix.Close(fd)
				if st.Dev != passed.Dev || st.Ino != passed.Ino {
					t.Fatalf("a descriptor handed out is inode %d, not the one passed (%d)", st.Ino, passed.Ino)
				}
			}
			if want := binary.LittleEndian.Uint64(answer[16:]); ans.LaneEpoch != want {
				t.Fatalf("lane epoch %d, the answer says %d", ans.LaneEpoch, want)
			}
		}
		c.close()
		var b [1]byte
		if n, err := unix.Read(p[0], b[:]); n != 0 || err != nil {
			t.Fatalf("answer %x with %d descriptors: a passed descriptor stayed open after the client closed (read %d, %v)", answer, nfds, n, err)
		}
	})
}

// wantAnswerError is what the client must say of an answer that came with
// nfds descriptors on its first byte, or "" when it must accept it. Its
// control buffer has room for fdMaxRights descriptors: more arrive
// truncated.
func wantAnswerError(answer []byte, nfds int) string {
	switch {
	case nfds > fdMaxRights:
		return fmt.Sprintf("more descriptors than %d", fdMaxRights)
	case len(answer) < fdAnswerSize:
		return fmt.Sprintf("closed after %d bytes of the answer", len(answer))
	}
	magic := binary.LittleEndian.Uint32(answer)
	a := decodeFDAnswer(answer)
	switch {
	case magic != fdMagic:
		return fmt.Sprintf("answer magic %#x", magic)
	case a.Status == fdNoFreeLane:
		return "refused: " + ErrNoFreeLane.Error()
	case a.Status == fdHeld:
		return "refused: " + ErrLaneHeld.Error()
	case a.Status != fdOK:
		return "refused: " + fdStatusText(a.Status)
	case a.Lane >= staging.LaneCount:
		return fmt.Sprintf("lane %d out of range", a.Lane)
	case a.LaneEpoch == 0:
		return "lane epoch 0"
	case a.Rights != uint32(nfds) || nfds < 3:
		return fmt.Sprintf("%d descriptors with the answer, which names %d", nfds, a.Rights)
	}
	return ""
}

// FuzzHostHandleName feeds the host arena's handle check the 64 bytes a
// peer's header holds. It accepts only a canonical arena name padded with
// NUL, which the arena's own Export gives back byte for byte; anything
// else is a corrupt entry, and the error says so.
func FuzzHostHandleName(f *testing.F) {
	id := staging.Identity{Pid: 4242, StartTime: 99, Epoch: 0x0123456789abcdef}
	good := folder.ArenaFileName(id)
	f.Add([]byte(good))
	f.Add([]byte(good + "\x00\x00x"))
	f.Add([]byte("../" + good))
	f.Add([]byte(folder.RankFileName(id)))
	f.Add([]byte(strings.Repeat("a", staging.ArenaHandleSize)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h [staging.ArenaHandleSize]byte
		copy(h[:], b)
		name, err := hostHandleName(h)
		if err != nil {
			if !errors.Is(err, ErrCorruptEntry) {
				t.Fatalf("handle %q: error %v is not a corrupt entry", h, err)
			}
			return
		}
		if k, _ := folder.ParseEntryName(name); k != folder.EntryArena {
			t.Fatalf("handle %q accepted as %q, which is no arena name", h, name)
		}
		if strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			t.Fatalf("handle %q accepted as %q, which leaves the directory", h, name)
		}
		back, err := (&fileArena{name: name}).Export()
		if err != nil {
			t.Fatalf("handle %q accepted as %q, which does not export: %v", h, name, err)
		}
		if back != h {
			t.Fatalf("handle %q accepted as %q, which exports as %q", h, name, back)
		}
	})
}

// Kinds of descriptor FuzzHostOpenLaneFD hands to OpenLaneFD.
const (
	fdPrivateFile = iota
	fdSharedFile  // mode 0644
	// fdSealedMemfd is a memfd sealed as an arena's lane is;
	// fdHalfSealedMemfd lacks the grow seal.
	fdSealedMemfd
	fdHalfSealedMemfd
	fdPipe
	fdSocket
	fdDirectory
	fdKinds
)

// FuzzHostOpenLaneFD hands the host arena's OpenLaneFD what a descriptor
// passed over the arena socket could be, for any lane. It maps only a
// private memfd sealed against shrinking and growing, exactly one lane
// long, for a lane in range, and then exactly one lane; anything else (an
// unsealed file, a whole arena among them) is an error naming the
// descriptor or the lane.
func FuzzHostOpenLaneFD(f *testing.F) {
	f.Add(uint8(fdSealedMemfd), int64(1), uint64(staging.LaneBytes))
	f.Add(uint8(fdSealedMemfd), int64(staging.LaneCount-1), uint64(staging.ArenaSize))
	f.Add(uint8(fdHalfSealedMemfd), int64(0), uint64(staging.LaneBytes))
	f.Add(uint8(fdSealedMemfd), int64(0), uint64(staging.LaneBytes-1))
	f.Add(uint8(fdSealedMemfd), int64(staging.LaneCount), uint64(staging.LaneBytes))
	f.Add(uint8(fdSealedMemfd), int64(-1), uint64(staging.LaneBytes))
	f.Add(uint8(fdPrivateFile), int64(0), uint64(staging.LaneBytes))
	f.Add(uint8(fdPrivateFile), int64(0), uint64(0))
	f.Add(uint8(fdSharedFile), int64(0), uint64(staging.LaneBytes))
	f.Add(uint8(fdPipe), int64(0), uint64(0))
	f.Add(uint8(fdSocket), int64(0), uint64(0))
	f.Add(uint8(fdDirectory), int64(0), uint64(0))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, kind uint8, lane int64, fileSize uint64) {
		kind %= fdKinds
		// Files stay within a few arenas: sparse, but not past what the
		// file system takes.
		fileSize %= 4 * staging.ArenaSize
		fd := openFuzzDescriptor(t, dir, kind, fileSize)
		defer unix.Close(fd)
		pl, err := HostArenas{}.OpenLaneFD(fd, int(lane))
		inRange := lane >= 0 && lane < staging.LaneCount
		accept := kind == fdSealedMemfd && inRange && fileSize == staging.LaneBytes
		if err != nil {
			if accept {
				t.Fatalf("a sealed memfd of %d bytes, lane %d: %v", fileSize, lane, err)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("lane %d", lane)) || inRange && !strings.Contains(err.Error(), fmt.Sprintf("descriptor %d", fd)) {
				t.Fatalf("kind %d, file of %d bytes, lane %d: error %q names neither the lane nor descriptor %d", kind, fileSize, lane, err, fd)
			}
			return
		}
		defer pl.Close()
		if !accept {
			t.Fatalf("kind %d, file of %d bytes, lane %d: mapped", kind, fileSize, lane)
		}
		if pl.Base() == 0 || pl.Lane() != int(lane) {
			t.Fatalf("lane %d mapped at %#x as lane %d", lane, pl.Base(), pl.Lane())
		}
		if n := testtools.MappingSize(t, pl.Base()); n != staging.LaneBytes {
			t.Fatalf("lane %d: %d bytes mapped at %#x, want one lane of %d", lane, n, pl.Base(), uint64(staging.LaneBytes))
		}
	})
}

func openFuzzDescriptor(t *testing.T, dir string, kind uint8, fileSize uint64) int {
	t.Helper()
	switch kind {
	case fdPrivateFile, fdSharedFile:
		path := filepath.Join(dir, "arena")
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		unix.Unlink(path)
		if kind == fdSharedFile {
			if err := unix.Fchmod(fd, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := unix.Ftruncate(fd, int64(fileSize)); err != nil {
			unix.Close(fd)
			t.Fatalf("ftruncate to %d: %v", fileSize, err)
		}
		return fd
	case fdSealedMemfd, fdHalfSealedMemfd:
		fd, err := unix.MemfdCreate("pxn-fuzz-arena", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Fchmod(fd, 0o600); err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, int64(fileSize)); err != nil {
			unix.Close(fd)
			t.Fatalf("ftruncate to %d: %v", fileSize, err)
		}
		seals := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
		if kind == fdHalfSealedMemfd {
			seals = unix.F_SEAL_SHRINK
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
		return fd
	case fdPipe:
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		unix.Close(p[1])
		return p[0]
	case fdSocket:
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(pair[1])
		return pair[0]
	default:
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
}

// FuzzReadRefusals puts one file named pxn-refused-<suffix> holding body in
// a registry root, as a workload could, and reads the root. The file is
// either one record or one bad entry, never an error of the whole read. A
// record read has the pid its canonical name says, at least one variable,
// every one a contract variable with valid UTF-8; written back with
// WriteRefusal and read again, it is the same record, values over the
// writer's bound cut to a prefix.
func FuzzReadRefusals(f *testing.F) {
	f.Add("1234", []byte(`{"pid":1234,"variables":[{"name":"MC_PXN_ENABLE","value":"yes","reason":"want 0 or 1"}]}`))
	f.Add("1234", []byte(`{"pid":1234,"variables":[{"name":"MC_PXN_ENABLE","value":"yes","reason":"x"}],"extra":1}`))
	f.Add("1234", []byte(`{"pid":1234,"variables":[{"name":"PATH","value":"","reason":""}]}`))
	f.Add("01234", []byte(`{"pid":1234,"variables":[{"name":"MC_PXN_ENABLE","value":"","reason":""}]}`))
	f.Add("7", []byte(`{"pid":7,"variables":[]}`))
	f.Add("7", []byte(`{"pid":7,"variables":[{"name":"MC_PXN_ENABLE","value":"\xff","reason":""}]}`))
	f.Add("-1", []byte(`{"pid":-1}`))
	f.Add("9", []byte(`null`))
	f.Add("9", []byte(``))
	root, back := f.TempDir(), f.TempDir()
	f.Fuzz(func(t *testing.T, suffix string, body []byte) {
		name := RefusalPrefix + suffix
		if suffix == "" || strings.ContainsAny(suffix, "/\x00") || len(name) > 255 {
			return
		}
		path := filepath.Join(root, name)
		if err := os.WriteFile(path, body, 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(path)
		rs, bad, err := ReadRefusals(root)
		if err != nil {
			t.Fatalf("%q holding %q: %v", name, body, err)
		}
		if len(rs)+bad != 1 {
			t.Fatalf("%q holding %q: %d records and %d bad, want one of them", name, body, len(rs), bad)
		}
		if bad == 1 {
			return
		}
		r := rs[0]
		if r.Pid <= 0 || refusalName(r.Pid) != name || len(r.Variables) == 0 {
			t.Fatalf("%q holding %q read as %+v", name, body, r)
		}
		for _, v := range r.Variables {
			if !contract.IsVariable(v.Name) || !utf8.ValidString(v.Value) || !utf8.ValidString(v.Reason) {
				t.Fatalf("%q holding %q read with variable %+v", name, body, v)
			}
		}
		if err := WriteRefusal(back, r); err != nil {
			// JSON's escapes can make a record of a file within the
			// bound longer than the bound: the writer refuses it.
			if strings.Contains(err.Error(), fmt.Sprintf("over %d", maxRefusalBytes)) {
				return
			}
			t.Fatalf("write back %+v: %v", r, err)
		}
		defer RemoveRefusal(back, r.Pid)
		again, bad, err := ReadRefusals(back)
		if err != nil || bad != 0 || len(again) != 1 {
			t.Fatalf("read back %+v: %d records, %d bad, %v", r, len(again), bad, err)
		}
		got := again[0]
		if got.Pid != r.Pid || len(got.Variables) != len(r.Variables) {
			t.Fatalf("%+v read back as %+v", r, got)
		}
		for i, v := range r.Variables {
			g := got.Variables[i]
			if g.Name != v.Name || !cutOf(g.Value, v.Value) || !cutOf(g.Reason, v.Reason) {
				t.Fatalf("variable %+v read back as %+v", v, g)
			}
		}
		if short := shortRefusal(r); short && !reflect.DeepEqual(got, r) {
			t.Fatalf("%+v read back as %+v", r, got)
		}
	})
}

// cutOf reports whether got is what a record's writer keeps of want: want
// itself, or a prefix of it within the bound.
func cutOf(got, want string) bool {
	if len(want) <= maxRefusedValue {
		return got == want
	}
	return len(got) <= maxRefusedValue && strings.HasPrefix(want, got) && len(got) > maxRefusedValue-utf8.UTFMax
}

func shortRefusal(r Refusal) bool {
	for _, v := range r.Variables {
		if len(v.Value) > maxRefusedValue || len(v.Reason) > maxRefusedValue {
			return false
		}
	}
	return true
}
