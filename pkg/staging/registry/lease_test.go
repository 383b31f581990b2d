// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// attachByName attaches r to the peer name; a claim refused while the
// relay has not yet seen r's earlier lease end (ErrLaneHeld) is asked
// again.
func attachByName(t *testing.T, r *Rank, name string) *PeerLink {
	t.Helper()
	var l *PeerLink
	pollUntil(t, "Attach "+name, func() bool {
		var err error
		l, err = r.Attach(context.Background(), peerByName(t, r, name))
		if err != nil && !errors.Is(err, ErrLaneHeld) {
			t.Fatalf("Attach %s: %v", name, err)
		}
		return err == nil
	})
	return l
}

func peerByName(t testing.TB, r *Rank, name string) PeerInfo {
	t.Helper()
	ps, err := r.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("%s not among the peers %+v", name, ps)
	return PeerInfo{}
}

func TestLeaseAttachClaimsLaneAndMapsArena(t *testing.T) {
	ctx := context.Background()
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	l := attachByName(t, sender, relay.Name())

	lane := &relay.ctl.Lanes[0]
	if l.LaneIndex() != 0 || l.LaneEpoch() == 0 || l.Sender() == nil {
		t.Fatalf("lane %d epoch %#x, want lane 0 with an epoch", l.LaneIndex(), l.LaneEpoch())
	}
	owner, held := lane.Owner.Load()
	if !held || owner != sender.Identity() || lane.Epoch() != l.LaneEpoch() {
		t.Errorf("relay sees owner %v (held %v) epoch %#x, want %v epoch %#x", owner, held, lane.Epoch(), sender.Identity(), l.LaneEpoch())
	}
	s := l.Sender()
	if s.Next() != 1 || s.Epoch() != l.LaneEpoch() {
		t.Errorf("sender endpoint at seq %d epoch %#x, want seq 1 epoch %#x", s.Next(), s.Epoch(), l.LaneEpoch())
	}
	// The sender's view of the lane and the relay's are the same memory.
	if _, ok := s.Ticket(); ok {
		t.Fatal("a ticket before the relay opened the lane")
	}
	relay.inbound[0].Sync()
	relay.inbound[0].Open()
	seq, ok := s.Ticket()
	if !ok {
		t.Fatal("a fresh lane has no ticket")
	}
	if err := s.Commit(seq, "session", []staging.PlanEntry{{Dst: 0x1000, Len: 8}}, 8, nil); err != nil {
		t.Fatal(err)
	}
	staging.RingDoorbell(s.ReadyWord(seq), seq)
	if err := s.Publish(seq); err != nil {
		t.Fatal(err)
	}
	in := relay.Inbound(0)
	if epoch, _ := in.Sync(); epoch != l.LaneEpoch() {
		t.Errorf("relay endpoint follows epoch %#x, want %#x", epoch, l.LaneEpoch())
	}
	if got, st := in.Poll(); got != seq || st != staging.TicketReady {
		t.Errorf("relay polls seq %d state %d, want seq %d ready", got, st, seq)
	}
	relay.copyLaneProgress()
	if got := lane.State().Published; got != seq {
		t.Errorf("relay reads published seq %d, sender published %d", got, seq)
	}
	// So are the sender's mapping of its lane and the relay's of the
	// lane's place in its arena; the sender maps that lane alone.
	if l.ArenaShare() != staging.ShareLaneFD {
		t.Errorf("attached by %s, want by lane descriptor", folder.ShareName(l.ArenaShare()))
	}
	peerMem := l.arena.(*hostPeerArena).mem
	if l.StagingBase() != uintptr(unsafe.Pointer(&peerMem[0])) || len(peerMem) != staging.LaneBytes {
		t.Errorf("staging base %#x over %d bytes, want the lane's own mapping of %d", l.StagingBase(), len(peerMem), uint64(staging.LaneBytes))
	}
	ownMem := relay.Arena().(*memfdArena).mem
	peerMem[staging.SlotSize+7] = 0x5a
	if got := ownMem[staging.SlotOffset(0, 1)+7]; got != 0x5a {
		t.Errorf("relay reads %#x from slot 1, sender wrote 0x5a", got)
	}
	if err := l.Live(staging.MonoNanos()); err != nil {
		t.Errorf("Live = %v", err)
	}
	if held := relay.Leases(); !slices.Equal(held, []int{0}) {
		t.Errorf("relay leases %v, want [0]", held)
	}

	if _, err := sender.Attach(ctx, peerByName(t, sender, relay.Name())); !errors.Is(err, ErrLaneHeld) {
		t.Errorf("second Attach = %v, want ErrLaneHeld", err)
	}
	self := PeerInfo{Name: sender.Name(), Identity: sender.Identity()}
	if _, err := sender.Attach(ctx, self); err == nil || !strings.Contains(err.Error(), "itself") {
		t.Errorf("Attach to self = %v, want refused", err)
	}
	sender2 := mustRegister(t, regOptions(root, "g", "rail2"))
	l2 := attachByName(t, sender2, relay.Name())
	if l2.LaneIndex() != 1 {
		t.Errorf("second sender got lane %d, want 1", l2.LaneIndex())
	}

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// The relay sees the lease's end on its socket goroutine.
	pollUntil(t, "the relay to see the lease end", func() bool {
		_, held := lane.Owner.Load()
		return !held
	})
	if held := relay.Leases(); !slices.Equal(held, []int{1}) {
		t.Errorf("relay leases %v, want [1]", held)
	}
	again := attachByName(t, sender, relay.Name())
	if again.LaneIndex() != 0 || again.LaneEpoch() == l.LaneEpoch() {
		t.Errorf("re-attach got lane %d epoch %#x, want lane 0 under a new epoch (old %#x)", again.LaneIndex(), again.LaneEpoch(), l.LaneEpoch())
	}
}

func TestLeaseRelayCloseWaitsForSender(t *testing.T) {
	for _, end := range []string{"sender detaches", "sender is killed"} {
		t.Run(end, func(t *testing.T) {
			ctx := context.Background()
			root := regTestRoot(t)
			dir := groupDir(root, "g")
			relay, err := Register(ctx, regOptions(root, "g", "rail0"))
			if err != nil {
				t.Fatal(err)
			}
			arena := folder.ArenaFileName(relay.Identity())
			waits := make(chan []int, 1)
			relay.hooks = &hooks{leaseWait: func(held []int) time.Duration {
				select {
				case waits <- held:
				default:
				}
				return time.Millisecond
			}}
			sender := startRegChild(t, childOpts{root: root, group: "g", rail: "rail1"})
			sender.expect("ready")
			sender.send("attach " + relay.Name())
			if got := strings.Fields(sender.expect("attached")); got[1] != "0" {
				t.Fatalf("sender attached %v, want lane 0", got)
			}

			closed := make(chan error, 1)
			go func() { closed <- relay.Close(ctx) }()
			for i := 0; i < 2; i++ {
				select {
				case held := <-waits:
					if !slices.Equal(held, []int{0}) {
						t.Fatalf("Close waits for lanes %v, want [0]", held)
					}
				case err := <-closed:
					t.Fatalf("Close returned %v while the sender held a lease", err)
				case <-time.After(childWait):
					t.Fatal("Close never waited for the lease")
				}
			}
			if fileExists(filepath.Join(dir, relay.Name())) {
				t.Errorf("READY not revoked while closing: %s still there", relay.Name())
			}
			if !mapsMention(t, arena) {
				t.Errorf("arena freed while a lease is held")
			}
			late := startRegChild(t, childOpts{root: root, group: "g", rail: "rail2"})
			late.expect("ready")
			late.send("attach " + relay.Name())
			if got := late.expect("attach-error"); !strings.Contains(got, ErrPeerGone.Error()) {
				t.Errorf("attach to a closing relay: %q, want %q", got, ErrPeerGone)
			}
			select {
			case err := <-closed:
				t.Fatalf("Close returned %v while the sender held a lease", err)
			default:
			}

			if end == "sender detaches" {
				sender.send("detach " + relay.Name())
				sender.expect("detached")
			} else {
				sender.kill()
			}
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("Close = %v", err)
				}
			case <-time.After(childWait):
				t.Fatal("Close did not return after the lease ended")
			}
			if mapsMention(t, arena) {
				t.Errorf("arena %s not freed after the lease ended", arena)
			}
		})
	}
}

func TestLeaseRelayCloseGivesUpAtDeadline(t *testing.T) {
	root := regTestRoot(t)
	relay, err := Register(context.Background(), regOptions(root, "g", "rail0"))
	if err != nil {
		t.Fatal(err)
	}
	arena := folder.ArenaFileName(relay.Identity())
	sender := startRegChild(t, childOpts{root: root, group: "g", rail: "rail1"})
	sender.expect("ready")
	sender.send("attach " + relay.Name())
	sender.expect("attached")

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = relay.Close(ctx)
	if !errors.Is(err, ErrLeaseHeld) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want ErrLeaseHeld at the deadline", err)
	}
	if !mapsMention(t, arena) {
		t.Errorf("arena freed although the sender still holds its lease")
	}
	sender.send("detach " + relay.Name())
	sender.expect("detached")
	sender.finish()
}

func TestLeaseSenderNoticesClosingRelay(t *testing.T) {
	root := regTestRoot(t)
	relay, err := Register(context.Background(), regOptions(root, "g", "rail0"))
	if err != nil {
		t.Fatal(err)
	}
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	l := attachByName(t, sender, relay.Name())
	closed := make(chan error, 1)
	go func() { closed <- relay.Close(context.Background()) }()
	pollUntil(t, "the sender to see the relay closing", func() bool { return l.Live(staging.MonoNanos()) != nil })
	if err := l.Live(staging.MonoNanos()); !errors.Is(err, ErrPeerGone) || !strings.Contains(err.Error(), "CLOSING") {
		t.Errorf("Live = %v, want the relay CLOSING", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("relay Close = %v", err)
	}
}

// The lane of a sender that exited goes to the next one, under a new
// epoch and with words of its own: nothing the dead sender left in its
// blocks is the new holder's.
func TestLeaseDeadHoldersLaneGoesToTheNext(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	first := startRegChild(t, childOpts{root: root, group: "g", rail: "rail1"})
	first.expect("ready")
	first.send("attach " + relay.Name())
	f := strings.Fields(first.expect("attached"))
	oldEpoch, _ := strconv.ParseUint(f[2], 10, 64)
	relay.inbound[0].Sync()
	old := relay.inbound[0].Words()
	// What the sender left in its lane before it died.
	atomic.StoreUint64(&old.Sender.Sender.PublishedSeq, 70)
	atomic.StoreUint64(&old.Sender.Ready[3].Seq, 58)
	atomic.StoreUint64(&old.Sender.Descs[1].CommitSeq, 56)
	first.kill()

	second := startRegChild(t, childOpts{root: root, group: "g", rail: "rail2"})
	second.expect("ready")
	second.send("attach " + relay.Name())
	f = strings.Fields(second.expect("attached"))
	newEpoch, _ := strconv.ParseUint(f[2], 10, 64)
	if f[1] != "0" || newEpoch == oldEpoch {
		t.Fatalf("second sender got lane %s epoch %#x, want lane 0 under a new epoch (old %#x)", f[1], newEpoch, oldEpoch)
	}
	lane := &relay.ctl.Lanes[0]
	if owner, _ := lane.Owner.Load(); owner.Pid != second.pid() {
		t.Errorf("lane 0 owned by pid %d, want %d", owner.Pid, second.pid())
	}
	if epoch, _ := relay.inbound[0].Sync(); epoch != newEpoch {
		t.Fatalf("relay follows epoch %#x, want %#x", epoch, newEpoch)
	}
	w := relay.inbound[0].Words()
	if w == old || w.Sender == old.Sender {
		t.Fatal("the new claim shares the dead sender's words")
	}
	for name, got := range map[string]uint64{
		"published": atomic.LoadUint64(&w.Sender.Sender.PublishedSeq),
		"ready[3]":  atomic.LoadUint64(&w.Sender.Ready[3].Seq),
		"desc[1]":   atomic.LoadUint64(&w.Sender.Descs[1].CommitSeq),
		"completed": atomic.LoadUint64(&w.Relay.Relay.CompletedSeq),
	} {
		if got != 0 {
			t.Errorf("new claim: %s = %d, want 0", name, got)
		}
	}
}

// A relay whose every lane is held has none for another sender; a lane
// whose lease ends goes to the next claim.
func TestLeaseNoFreeLane(t *testing.T) {
	ctx := context.Background()
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	holder := mustRegister(t, regOptions(root, "g", "rail2"))
	var claims [staging.LaneCount]*inboundClaim
	relay.laneMu.Lock()
	for i := range relay.claims {
		claims[i] = &inboundClaim{lane: i, owner: holder.Identity(), ns: holder.ns, epoch: uint64(i + 1)}
		relay.claims[i] = claims[i]
		relay.ctl.Lanes[i].Claim(holder.Identity(), holder.ns, uint64(i+1), staging.MonoNanos())
	}
	relay.laneMu.Unlock()
	peer := peerByName(t, sender, relay.Name())
	if _, err := sender.Attach(ctx, peer); !errors.Is(err, ErrNoFreeLane) {
		t.Fatalf("Attach with every lane held = %v, want ErrNoFreeLane", err)
	}
	relay.release(claims[4], "test")
	l, err := sender.Attach(ctx, peer)
	if err != nil || l.LaneIndex() != 4 {
		t.Fatalf("Attach = lane %v, %v; want lane 4, whose lease ended", l, err)
	}
}

// A late heartbeat alone ends no lease: the owner may be stopped, frozen or
// starved, and its copies would land in the next owner's slots. Only a
// free liveness lock (the process gone, or done with its files) does.
func TestLeaseOwnerWithOldHeartbeatHoldsItsLeaseWhileAlive(t *testing.T) {
	ctx := context.Background()
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	other := mustRegister(t, regOptions(root, "g", "rail2"))
	attachByName(t, sender, relay.Name())
	if held := relay.Leases(); !slices.Equal(held, []int{0}) {
		t.Fatalf("leases %v, want [0]", held)
	}
	atomic.StoreUint64(&sender.Header().Heartbeat, uint64(staging.MonoNanos()-int64(2*testHeartbeatTimeout)))
	sender.flushControl()
	if held := relay.Leases(); !slices.Equal(held, []int{0}) {
		t.Errorf("leases %v, want [0]: the owner's heartbeat is late but it holds its liveness lock", held)
	}
	l, err := other.Attach(ctx, peerByName(t, other, relay.Name()))
	if err != nil || l.LaneIndex() == 0 {
		t.Fatalf("Attach = lane %v, %v; want a lane other than the live owner's lane 0", l, err)
	}
	// The owner's lock dropped, as at its exit.
	unix.Close(sender.liveFd)
	sender.liveFd = -1
	if held := relay.Leases(); !slices.Equal(held, []int{1}) {
		t.Errorf("leases %v, want [1]: lane 0's owner has a late heartbeat and no liveness lock", held)
	}
}

func TestLeaseAttachToRestartedPeerFails(t *testing.T) {
	root := regTestRoot(t)
	relay, err := Register(context.Background(), regOptions(root, "g", "rail0"))
	if err != nil {
		t.Fatal(err)
	}
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	old := peerByName(t, sender, relay.Name())
	if err := relay.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustRegister(t, regOptions(root, "g", "rail0"))
	if _, err := sender.Attach(context.Background(), old); !errors.Is(err, ErrPeerGone) {
		t.Errorf("Attach to a relay that restarted = %v, want ErrPeerGone", err)
	}
}

// A link whose lane the relay gave to someone else says so, and its
// Close ends nothing of the other's claim.
func TestLeaseReclaimedLane(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	l := attachByName(t, sender, relay.Name())
	if err := l.Live(staging.MonoNanos()); err != nil {
		t.Errorf("Live = %v", err)
	}
	// Someone else took the lane.
	relay.laneMu.Lock()
	relay.endClaim(0, "test")
	relay.claims[0] = &inboundClaim{lane: 0, owner: relay.Identity(), ns: relay.ns, epoch: 77}
	relay.ctl.Lanes[0].Claim(relay.Identity(), relay.ns, 77, staging.MonoNanos())
	relay.laneMu.Unlock()
	if err := l.Live(staging.MonoNanos()); !errors.Is(err, ErrPeerGone) || !strings.Contains(err.Error(), "reclaimed") {
		t.Errorf("Live = %v, want the lane reclaimed", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if owner, _ := relay.ctl.Lanes[0].Owner.Load(); owner != relay.Identity() {
		t.Errorf("Close released a lane it no longer owned: owner %v", owner)
	}
}

func BenchmarkLeaseLive(b *testing.B) {
	root, err := os.MkdirTemp("/dev/shm", "pxn-registry-bench-")
	if err != nil {
		root = b.TempDir()
	} else {
		defer os.RemoveAll(root)
	}
	ctx := context.Background()
	relay, err := Register(ctx, regOptions(root, "g", "rail0"))
	if err != nil {
		b.Fatal(err)
	}
	defer relay.Close(ctx)
	sender, err := Register(ctx, regOptions(root, "g", "rail1"))
	if err != nil {
		b.Fatal(err)
	}
	defer sender.Close(ctx)
	ps, err := sender.Peers(ctx)
	if err != nil || len(ps) != 1 {
		b.Fatal(ps, err)
	}
	l, err := sender.Attach(ctx, ps[0])
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now := staging.MonoNanos()
		sender.Heartbeat(now)
		if err := l.Live(now); err != nil {
			b.Fatal(err)
		}
	}
}

// holdLock takes the group's flock through a descriptor of its own, as
// another process would, until the returned func.
func holdLock(t *testing.T, root, group string) func() {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(groupDir(root, group), folder.LockFileName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlock := func() { once.Do(func() { f.Close() }) }
	t.Cleanup(unlock)
	return unlock
}

// TryAttach, CloseNoWait and TryAppendPeers never wait for the registry
// lock: a claim and its release are the relay's, over its socket, and
// take no lock, so a lock held elsewhere neither stops nor delays them;
// the lock is freed only after them, or by a watchdog that fails the
// test.
func TestLeaseNoWaitCallsUnderAHeldLock(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	peer := peerByName(t, sender, relay.Name())
	owned := func() bool { return len(relay.Leases()) > 0 }

	busy0, waited0 := sender.LockContention()
	unlock := holdLock(t, root, "g")
	var freedByWatchdog atomic.Bool
	watchdog := time.AfterFunc(childWait, func() {
		freedByWatchdog.Store(true)
		unlock()
	})
	t.Cleanup(func() { watchdog.Stop() })
	var l *PeerLink
	pollUntil(t, "TryAttach under a held lock", func() bool {
		var err error
		l, err = sender.TryAttach(peer)
		if err != nil && !isPending(err) {
			t.Fatalf("TryAttach under a held lock: %v", err)
		}
		return err == nil
	})
	if !owned() {
		t.Fatal("no lease after TryAttach")
	}
	if err := l.CloseNoWait(); err != nil {
		t.Fatalf("CloseNoWait under a held lock: %v", err)
	}
	pollUntil(t, "the lease to end under a held lock", func() bool { return !owned() })
	if _, err := sender.TryAppendPeers(nil); err != nil {
		t.Fatalf("TryAppendPeers under a held lock: %v", err)
	}
	if !watchdog.Stop() || freedByWatchdog.Load() {
		t.Fatalf("the no-wait calls waited %v for the lock, until a watchdog freed it", childWait)
	}
	if _, waited := sender.LockContention(); waited != waited0 {
		t.Errorf("under a held lock the no-wait calls waited %d times for it, want 0", waited-waited0)
	}
	if busy, _ := sender.LockContention(); busy-busy0 > 1 {
		t.Errorf("under a held lock the no-wait calls gave up %d times, want at most 1 (TryAppendPeers' cleanup)", busy-busy0)
	}
	unlock()
	if err := sender.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
