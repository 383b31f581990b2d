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

func attachByName(t *testing.T, r *Rank, name string) *PeerLink {
	t.Helper()
	l, err := r.Attach(context.Background(), peerByName(t, r, name))
	if err != nil {
		t.Fatalf("Attach %s: %v", name, err)
	}
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

	if _, err := sender.Attach(ctx, peerByName(t, sender, relay.Name())); err == nil || !strings.Contains(err.Error(), "already holds lane 0") {
		t.Errorf("second Attach = %v, want already holds lane 0", err)
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
	if _, held := lane.Owner.Load(); held {
		t.Errorf("lane 0 still owned after Close")
	}
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

func TestLeaseStaleOwnerIsReclaimed(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	first := startRegChild(t, childOpts{root: root, group: "g", rail: "rail1"})
	first.expect("ready")
	first.send("attach " + relay.Name())
	f := strings.Fields(first.expect("attached"))
	oldEpoch, _ := strconv.ParseUint(f[2], 10, 64)
	first.kill()

	// What the dead sender left in its lane.
	lane := &relay.ctl.Lanes[0]
	atomic.StoreUint64(&lane.Sender.NextSeq, 77)
	atomic.StoreUint64(&lane.Sender.PublishedSeq, 70)
	atomic.StoreUint64(&lane.Sender.ReapedSeq, 60)
	atomic.StoreUint64(&lane.Relay.CompletedSeq, 65)
	atomic.StoreUint64(&lane.Ready[3].Seq, 58)
	atomic.StoreUint64(&lane.Completions[2].Seq, 57)
	atomic.StoreUint64(&lane.Descs[1].CommitSeq, 56)

	second := startRegChild(t, childOpts{root: root, group: "g", rail: "rail2"})
	second.expect("ready")
	second.send("attach " + relay.Name())
	f = strings.Fields(second.expect("attached"))
	newEpoch, _ := strconv.ParseUint(f[2], 10, 64)
	if f[1] != "0" || newEpoch == oldEpoch {
		t.Fatalf("second sender got lane %s epoch %#x, want lane 0 reclaimed under a new epoch (old %#x)", f[1], newEpoch, oldEpoch)
	}
	if owner, _ := lane.Owner.Load(); owner.Pid != second.pid() {
		t.Errorf("lane 0 owned by pid %d, want %d", owner.Pid, second.pid())
	}
	for name, got := range map[string]uint64{
		"next":       atomic.LoadUint64(&lane.Sender.NextSeq),
		"published":  atomic.LoadUint64(&lane.Sender.PublishedSeq),
		"reaped":     atomic.LoadUint64(&lane.Sender.ReapedSeq),
		"completed":  atomic.LoadUint64(&lane.Relay.CompletedSeq),
		"ready[3]":   atomic.LoadUint64(&lane.Ready[3].Seq),
		"complet[2]": atomic.LoadUint64(&lane.Completions[2].Seq),
		"desc[1]":    atomic.LoadUint64(&lane.Descs[1].CommitSeq),
	} {
		want := uint64(0)
		if name == "next" {
			want = 1
		}
		if got != want {
			t.Errorf("reclaimed lane: %s = %d, want %d", name, got, want)
		}
	}
}

func TestLeaseNoFreeLaneAndReusedPidOwner(t *testing.T) {
	ctx := context.Background()
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	holder := mustRegister(t, regOptions(root, "g", "rail2"))
	for i := range relay.ctl.Lanes {
		relay.ctl.Lanes[i].Claim(holder.Identity(), holder.ns, uint64(i+1), staging.MonoNanos())
	}
	peer := peerByName(t, sender, relay.Name())
	if _, err := sender.Attach(ctx, peer); !errors.Is(err, ErrNoFreeLane) {
		t.Fatalf("Attach with every lane held = %v, want ErrNoFreeLane", err)
	}
	atomic.StoreUint64(&relay.ctl.Lanes[4].Owner.StartTime, holder.Identity().StartTime+1)
	l, err := sender.Attach(ctx, peer)
	if err != nil || l.LaneIndex() != 4 {
		t.Fatalf("Attach = lane %v, %v; want lane 4, whose owner's pid was reused", l, err)
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

func TestLeaseRolloverAndReclaimedLane(t *testing.T) {
	ctx := context.Background()
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	l := attachByName(t, sender, relay.Name())
	old := l.LaneEpoch()
	epoch, err := l.Rollover(ctx)
	if err != nil || epoch == 0 || epoch == old || l.LaneEpoch() != epoch {
		t.Fatalf("Rollover = %#x, %v (link epoch %#x); want a new epoch other than %#x", epoch, err, l.LaneEpoch(), old)
	}
	if got := relay.ctl.Lanes[0].Epoch(); got != epoch {
		t.Errorf("relay sees lane epoch %#x, want %#x", got, epoch)
	}
	if err := l.Live(staging.MonoNanos()); err != nil {
		t.Errorf("Live after Rollover = %v", err)
	}
	// Someone else took the lane (as after this process was judged stale).
	relay.ctl.Lanes[0].Claim(relay.Identity(), relay.ns, 77, staging.MonoNanos())
	if err := l.Live(staging.MonoNanos()); !errors.Is(err, ErrPeerGone) || !strings.Contains(err.Error(), "reclaimed") {
		t.Errorf("Live = %v, want the lane reclaimed", err)
	}
	if _, err := l.Rollover(ctx); !errors.Is(err, ErrPeerGone) {
		t.Errorf("Rollover of a reclaimed lane = %v, want ErrPeerGone", err)
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

// The no-wait calls never wait for a lock held elsewhere: TryAttach claims
// nothing and says so, CloseNoWait keeps the lane claimed for later, and the
// next TryAppendPeers once the lock is free releases it. Close releases what
// is left, waiting. Each no-wait call that found the lock held counts as
// busy, none as waited, and all of them return while the lock is held: the
// lock is freed only after them, or by a watchdog that fails the test.
func TestLeaseNoWaitCallsUnderAHeldLock(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	peer := peerByName(t, sender, relay.Name())
	l := attachByName(t, sender, relay.Name())
	owned := func() bool { return len(relay.Leases()) > 0 }

	busy0, waited0 := sender.LockContention()
	unlock := holdLock(t, root, "g")
	// A call that waits for the lock would wait for ever; the watchdog
	// frees the lock instead, so that the call returns and the test fails
	// saying why. childWait is far beyond what the calls take however
	// loaded the machine.
	var freedByWatchdog atomic.Bool
	watchdog := time.AfterFunc(childWait, func() {
		freedByWatchdog.Store(true)
		unlock()
	})
	t.Cleanup(func() { watchdog.Stop() })
	if _, err := sender.TryAttach(peer); !errors.Is(err, ErrLockBusy) {
		t.Fatalf("TryAttach under a held lock: %v, want ErrLockBusy", err)
	}
	if err := l.CloseNoWait(); err != nil {
		t.Fatalf("CloseNoWait under a held lock: %v", err)
	}
	if !owned() {
		t.Fatal("the lane was released under a lock held elsewhere")
	}
	if _, err := sender.TryAppendPeers(nil); err != nil {
		t.Fatalf("TryAppendPeers under a held lock: %v", err)
	}
	if !watchdog.Stop() || freedByWatchdog.Load() {
		t.Fatalf("the no-wait calls waited %v for the lock, until a watchdog freed it", childWait)
	}
	// Each of the three found the lock held: TryAttach for its claim,
	// CloseNoWait for the release, TryAppendPeers for the release it
	// retries.
	if busy, waited := sender.LockContention(); busy-busy0 != 3 || waited != waited0 {
		t.Errorf("under a held lock the no-wait calls gave up %d times and waited %d times, want 3 and 0", busy-busy0, waited-waited0)
	}
	if !owned() {
		t.Fatal("the lane was released under a lock held elsewhere")
	}
	if got := relay.ctl.Lanes[0].Epoch(); got != l.LaneEpoch() {
		t.Fatalf("a lane was claimed under a held lock: epoch %#x, want %#x", got, l.LaneEpoch())
	}

	unlock()
	if _, err := sender.TryAppendPeers(nil); err != nil {
		t.Fatal(err)
	}
	if owned() {
		t.Fatalf("lanes %v still leased after the lock was freed", relay.Leases())
	}

	l2 := attachByName(t, sender, relay.Name())
	unlock = holdLock(t, root, "g")
	if err := l2.CloseNoWait(); err != nil {
		t.Fatal(err)
	}
	unlock()
	if err := sender.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if owned() {
		t.Fatalf("lanes %v still leased after the sender closed", relay.Leases())
	}
}
