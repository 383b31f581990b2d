// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// A member holding lane 1 of a relay in another process maps lane 1 and
// nothing else of the relay: the socket refuses it a claim made with lane
// 0's owner words copied from the relay's control file; it holds no
// descriptor of the relay's memory and one mapping of each of lane 1's
// staging memory, sender block and relay block (read-only), nothing of
// lane 0's Descs, doorbells or completions, and the control file it can
// open holds none of them. The holder of lane 0 likewise maps lane 0's
// alone, and what each writes reaches the relay in its own lane only.
func TestLanesMemberMapsItsLaneOnly(t *testing.T) {
	root := regTestRoot(t)
	relay := startRegChild(t, childOpts{root: root, group: "g", rail: "rail0"})
	relayName := relay.expect("ready")
	_, relayID := folder.ParseEntryName(relayName)
	arena := folder.ArenaFileName(relayID)

	victim := mustRegister(t, regOptions(root, "g", "rail1"))
	lv := attachByName(t, victim, relayName)
	if lv.LaneIndex() != 0 || lv.ArenaShare() != staging.ShareLaneFD {
		t.Fatalf("the first sender holds lane %d by %s, want lane 0 by lane descriptor", lv.LaneIndex(), folder.ShareName(lv.ArenaShare()))
	}
	victimBytes := foreignBytes(lv.StagingBase(), fillBytes)
	for i := range victimBytes {
		victimBytes[i] = 0xa5
	}

	member := startRegChild(t, childOpts{root: root, group: "g", rail: "rail2"})
	member.expect("ready")
	member.send("attach " + relayName)
	f := strings.Fields(member.expect("attached"))
	if len(f) != 4 || f[1] != "1" || f[3] != "lane-descriptor" {
		t.Fatalf("the member attached as %v, want lane 1 by lane descriptor", f)
	}

	member.send("steal " + relayName + " 0")
	if got := member.expect("steal"); !strings.HasPrefix(got, "refused ") || !strings.Contains(got, "claim refused: the asker is not the rank it names") {
		t.Errorf("the member claiming with lane 0's owner words: %q, want the claim refused", got)
	}

	member.send("holds " + arena)
	if got, want := member.expect("holds"), fmt.Sprintf("map:%s.lane1:%d", arena, uint64(staging.LaneBytes)); got != want {
		t.Errorf("the member holds %q of the relay's arena, want %q alone", got, want)
	}
	if got, want := helperHolds(arena), fmt.Sprintf("map:%s.lane0:%d", arena, uint64(staging.LaneBytes)); got != want {
		t.Errorf("the holder of lane 0 holds %q of the relay's arena, want %q alone", got, want)
	}
	blocks := func(lane int) string {
		return fmt.Sprintf("map:%s.lane%d.relay:%d map:%s.lane%d.sender:%d", relayName, lane, pageRound(staging.RelayBlockSize), relayName, lane, pageRound(staging.SenderBlockSize))
	}
	member.send("holds " + relayName)
	if got, want := member.expect("holds"), blocks(1); got != want {
		t.Errorf("the member holds %q of the relay's lane words, want %q alone", got, want)
	}
	if got, want := helperHolds(relayName), blocks(0); got != want {
		t.Errorf("the holder of lane 0 holds %q of the relay's lane words, want %q alone", got, want)
	}
	member.send("mapmodes " + relayName)
	if got, want := member.expect("mapmodes"), fmt.Sprintf("%s.lane1.relay:r--s %s.lane1.sender:rw-s", relayName, relayName); got != want {
		t.Errorf("the member maps its lane's blocks as %q, want %q", got, want)
	}
	ctlBytes, err := os.ReadFile(filepath.Join(victim.d.path, relayName))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.IndexFunc(ctlBytes[staging.ControlSize:], func(r rune) bool { return r != 0 }) >= 0 {
		t.Error("the relay's control file holds bytes past its control block")
	}
	const session = "the-victims-session"
	if err := lv.Sender().Commit(lv.Sender().Next(), session, []staging.PlanEntry{{Dst: 1, Len: 1}}, 1, nil); err != nil {
		t.Fatal(err)
	}
	if ctlBytes, _ = os.ReadFile(filepath.Join(victim.d.path, relayName)); bytes.Contains(ctlBytes, []byte(session)) {
		t.Error("the victim's committed Desc is readable in the relay's control file")
	}

	member.send("fill " + relayName + " 7")
	member.expect("filled")
	want := make([]byte, fillBytes)
	for i := range want {
		want[i] = 7 + byte(i)
	}
	relay.send("sum 1")
	if got := strings.Fields(relay.expect("sum")); len(got) != 2 || got[1] != fnvHex(want) {
		t.Errorf("lane 1 of the relay reads %v, want the member's bytes %s", got, fnvHex(want))
	}
	for i := range want {
		want[i] = 0xa5
	}
	relay.send("sum 0")
	if got := strings.Fields(relay.expect("sum")); len(got) != 2 || got[1] != fnvHex(want) {
		t.Errorf("lane 0 of the relay reads %v, want the first sender's bytes %s", got, fnvHex(want))
	}
	member.finish()
	if err := lv.Close(); err != nil {
		t.Fatal(err)
	}
	relay.finish()
}

// BenchmarkLeaseHostLane is what one lease on a relay's host arena costs
// the sender: the claim over the relay's arena socket (the relay picks the
// lane and makes its blocks and eventfd and, from the lane's second claim
// on, its new memfd), the checks and mappings of the blocks and of the
// lane; the relay's open of the claim's ring, as its pump does it, which
// puts the new memfd in place of the lane's (open-ns/op); the first write
// of each of its slots (a page fault each), and the release with its
// unmaps; then the wait until the relay has seen the release and the lane
// is free again, which a sender that attaches anew at once waits for. The relay is in this process; its
// socket is served by its own goroutines, as in a relay's process.
func BenchmarkLeaseHostLane(b *testing.B) {
	root := regTestRoot(b)
	quiet := func(o Options) Options {
		o.Logger = logr.Discard()
		return o
	}
	relay := mustRegister(b, quiet(regOptions(root, "g", "rail0")))
	sender := mustRegister(b, quiet(regOptions(root, "g", "rail1")))
	p := peerByName(b, sender, relay.Name())
	ctx := context.Background()
	var attach, open, write, release, freed time.Duration
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		l, err := sender.Attach(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if l.ArenaShare() != staging.ShareLaneFD {
			b.Fatalf("attached by %s", folder.ShareName(l.ArenaShare()))
		}
		rx := relay.inbound[l.LaneIndex()]
		rx.Sync()
		if err := rx.Open(); err != nil {
			b.Fatal(err)
		}
		t1o := time.Now()
		open += t1o.Sub(t1)
		t1 = t1o
		mem := foreignBytes(l.StagingBase(), staging.LaneBytes)
		for s := range staging.SlotsPerLane {
			mem[s*staging.SlotSize] = byte(s)
		}
		t2 := time.Now()
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		for deadline := t3.Add(childWait); ; {
			if _, held := relay.ctl.Lanes[l.LaneIndex()].Owner.Load(); !held {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("the relay never saw the release")
			}
			runtime.Gosched()
		}
		attach, write, release, freed = attach+t1.Sub(t0), write+t2.Sub(t1), release+t3.Sub(t2), freed+time.Since(t3)
	}
	n := float64(b.N)
	b.ReportMetric(float64(attach.Nanoseconds())/n, "attach-ns/op")
	b.ReportMetric(float64(open.Nanoseconds())/n, "open-ns/op")
	b.ReportMetric(float64(write.Nanoseconds())/n, "first-writes-ns/op")
	b.ReportMetric(float64(release.Nanoseconds())/n, "close-ns/op")
	b.ReportMetric(float64(freed.Nanoseconds())/n, "freed-ns/op")
}

func pageRound(n uintptr) uintptr {
	p := uintptr(os.Getpagesize())
	return (n + p - 1) / p * p
}

// A relay that offers only its whole arena by descriptor (ShareFD, which
// no rank of this version offers) gets no sender: the attach fails saying
// so, claims no lane, asks the socket nothing and maps nothing, and a
// second attach fails the same way without looking again; the sender's
// traffic to that rail goes direct.
func TestLanesWholeArenaDescriptorRefused(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	relay.ctl.Header.ArenaShares = staging.ShareFD
	relay.flushControl()
	epochs := func() (e [staging.LaneCount]uint64) {
		for i := range e {
			e[i] = relay.ctl.Lanes[i].Epoch()
		}
		return e
	}
	before := epochs()
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	p := peerByName(t, sender, relay.Name())
	for range 2 {
		l, err := sender.Attach(context.Background(), p)
		if l != nil || err == nil || !strings.Contains(err.Error(), "no way to map the relay's arena: the relay offers its arena by descriptor") {
			t.Fatalf("Attach = %v, %v; want a refusal of the whole arena", l, err)
		}
	}
	if after := epochs(); after != before {
		t.Errorf("lane epochs %x became %x: the refused attach claimed a lane", before, after)
	}
	for i := range staging.LaneCount {
		if _, held := relay.ctl.Lanes[i].Owner.Load(); held {
			t.Errorf("lane %d of the relay is held after the refused attach", i)
		}
	}
	if got := relay.ServeStats(); got.Served != 0 || got.Refused != 0 {
		t.Errorf("the relay's socket counts %+v, want no request", got)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(maps), folder.ArenaFileName(relay.Identity())+".lane0 "); n != 1 {
		t.Errorf("lane 0 of the relay is mapped %d times in this process, want once: by the relay alone", n)
	}
}

// A member of the relay's uid that puts a socket of its own in place of
// the relay's arena socket gets nothing staged into its memory: a sender
// in the relay's PID namespace takes a lane's descriptor only from the
// relay's process, refuses the impostor's sealed memfd naming both pids,
// maps nothing of it and holds no lane of the relay afterwards.
func TestLanesSenderRefusesAnImpostorSocket(t *testing.T) {
	root := regTestRoot(t)
	relay := startRegChild(t, childOpts{root: root, group: "g", rail: "rail0"})
	relayName := relay.expect("ready")
	_, relayID := folder.ParseEntryName(relayName)
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	peer := peerByName(t, sender, relayName)

	path := filepath.Join(sender.d.path, folder.SockFileName(relayID))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	lane, err := newSealedMemfd("impostor-lane", staging.LaneBytes, arenaSeals)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lane)
	served := make(chan error, 1)
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		var req [fdRequestSize]byte
		if _, err := io.ReadFull(c, req[:]); err != nil {
			served <- err
			return
		}
		ans := fdAnswer{Status: fdOK, Rights: 1, LaneEpoch: 1, LaneBytes: staging.LaneBytes}.encode()
		_, _, err = c.WriteMsgUnix(ans[:], unix.UnixRights(lane), nil)
		served <- err
	}()

	l, err := sender.Attach(context.Background(), peer)
	if err == nil {
		l.Close()
	}
	want := fmt.Sprintf("served by pid %d, not the relay's %d", os.Getpid(), relay.pid())
	if l != nil || err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Attach through an impostor's socket = %v, %v; want a refusal saying %q", l, err, want)
	}
	ln.Close()
	if err := <-served; err != nil {
		t.Logf("the impostor's answer: %v", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(maps), "impostor-lane") {
		t.Error("the impostor's memfd is mapped in the sender")
	}
	mem, err := folder.MapPrivate(sender.d.fd(), sender.d.path, relayName, os.Geteuid(), int(staging.ControlSize), false)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	ctl := (*staging.ControlBlock)(unsafe.Pointer(&mem[0]))
	for i := range staging.LaneCount {
		if owner, held := ctl.Lanes[i].Owner.Load(); held && owner == sender.Identity() {
			t.Errorf("the sender still holds lane %d of the relay", i)
		}
	}
	relay.finish()
}

// A holder whose lease's connection ends without a release while it
// lives (it closed a stray descriptor), and that is then stopped and its
// registration removed (as by a cleanup that took it for dead), keeps
// its lane: the next sender gets another lane, and what the stopped
// holder writes when it runs again, staging bytes and a Desc with its
// doorbell, lands in its own lane, never in the next sender's, whose
// staging memory and words hold its own. Once the holder is gone the
// lane goes to the next claim, with words of its own: nothing the gone
// holder wrote is in them.
func TestLanesStoppedHolderWritesOnlyItsOwnLane(t *testing.T) {
	root := regTestRoot(t)
	relay := startRegChild(t, childOpts{root: root, group: "g", rail: "rail0"})
	relayName := relay.expect("ready")
	old := startRegChild(t, childOpts{root: root, group: "g", rail: "rail1"})
	oldName := old.expect("ready")
	old.send("attach " + relayName)
	if f := strings.Fields(old.expect("attached")); f[1] != "0" {
		t.Fatalf("the first holder attached as %v, want lane 0", f)
	}
	old.send("droplease " + relayName)
	old.expect("dropped")
	if err := syscall.Kill(old.pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			syscall.Kill(old.pid(), syscall.SIGCONT)
		}
	}()
	if err := os.Remove(filepath.Join(groupDir(root, "g"), oldName)); err != nil {
		t.Fatal(err)
	}

	next := mustRegister(t, regOptions(root, "g", "rail2"))
	ln := attachByName(t, next, relayName)
	if ln.LaneIndex() == 0 {
		t.Fatal("the next sender got the lane of a holder that lives, stopped")
	}
	mine := foreignBytes(ln.StagingBase(), fillBytes)
	for i := range mine {
		mine[i] = 0xa5
	}
	if err := helperPost(ln, 1); err != "ok" {
		t.Fatal(err)
	}

	if err := syscall.Kill(old.pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	old.send("fill " + relayName + " 9")
	old.expect("filled")
	old.send("post " + relayName + " 1")
	if got := old.expect("posted"); got != "ok" {
		t.Fatalf("the resumed holder's post: %s", got)
	}

	want := make([]byte, fillBytes)
	for i := range want {
		want[i] = 0xa5
	}
	relay.send(fmt.Sprintf("sum %d", ln.LaneIndex()))
	if got := strings.Fields(relay.expect("sum")); got[1] != fnvHex(want) {
		t.Errorf("the next sender's lane %d reads %v, want its own bytes %s", ln.LaneIndex(), got, fnvHex(want))
	}
	for i := range want {
		want[i] = 9 + byte(i)
	}
	relay.send("sum 0")
	if got := strings.Fields(relay.expect("sum")); got[1] != fnvHex(want) {
		t.Errorf("lane 0 reads %v, want the resumed holder's bytes %s", got, fnvHex(want))
	}
	relay.send(fmt.Sprintf("words %d", ln.LaneIndex()))
	if got := relay.expect("words"); got != "1 1/1" {
		t.Errorf("the relay's words of the next sender's lane: %q, want its one Desc and doorbell (\"1 1/1\")", got)
	}

	// Gone, the holder's lane goes to the next claim with new words.
	old.kill()
	third := mustRegister(t, regOptions(root, "g", "rail3"))
	var l3 *PeerLink
	pollUntil(t, "lane 0 to go to the next claim", func() bool {
		if l3 != nil {
			l3.Close()
		}
		l3 = attachByName(t, third, relayName)
		return l3.LaneIndex() == 0
	})
	relay.send("words 0")
	if got := relay.expect("words"); got != "1 0/0" {
		t.Errorf("the relay's words of lane 0 after the gone holder: %q, want one claim's, new (\"1 0/0\")", got)
	}
	for _, l := range []*PeerLink{ln, l3} {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	relay.finish()
}
