// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The two endpoints of a lane, SenderLane and RelayLane, are the only code
// that reads or writes a claim's words (LaneSenderBlock, LaneRelayBlock);
// the relay alone writes the lane's summary in its control file
// (LaneSummary). Their ordering rules, stated once:
//
//   - Desc: the sender writes every field, then release-stores CommitSeq
//     (Commit). The relay acquire-loads CommitSeq and trusts nothing else
//     of the Desc until it equals the seq it expects; it then copies each
//     field once (ValidateDesc) and uses only the copy.
//   - Ready word: written once per seq after the copy into the slot, by the
//     sender's GPU (cuStreamWriteValue64 on the copy's stream, whose
//     system-scope fence orders the copy first) or, as a fallback, by a
//     release store on the CPU once the copy's event has completed
//     (RingDoorbell). The relay acquire-loads it; a doorbell may become
//     visible before the Desc commit (a GPU store against a CPU store),
//     which is not an error. Part words (ReadyWord.Parts) follow the same
//     rule for their part of the slot: the copy stores seq into Parts[p]
//     once part p is written (a GPU store behind a system-scope fence, or
//     a release store), and never for the last part, which the doorbell
//     covers. The relay may take a ticket once Parts[0] holds its seq.
//   - Completion: the relay stores Status, then release-stores Seq, for
//     every seq in order; CompletedSeq is release-stored after them and
//     advances only over a contiguous run of finished seqs. The sender
//     acquire-loads Completion.Seq, then reads Status.
//   - Credit: a sender publishes seq only while seq-reaped ≤ K; the relay
//     takes seq only while seq-completed ≤ K, so a sender that ignores
//     credit cannot hand it a slot an earlier seq still uses.
//   - Owner: Pid is the owner's publication word in the summary, cleared
//     first and stored last at a claim, so a reader that loads a non-zero
//     Pid and then the rest sees a whole owner.
//   - Open: a slot is written by a sender only when no second-hop write of
//     an earlier epoch can still read it. After a claim the relay follows
//     the new claim's words at once (an earlier epoch's completions are
//     dropped), but it opens the ring only once every second-hop write it
//     took under the lane's earlier epochs is final: it then
//     release-stores the epoch into OpenEpoch (Open). A sender takes no
//     ticket, so copies nothing into a slot, until it acquire-loads its
//     own epoch there (Ticket).
//   - Wake: see EventWaiter.
//
// Progress words (SenderProgress) are for inspect, and PublishedSeq is the
// relay's hint that doorbells are on their way (Announced): it decides how
// soon the relay looks again, never what it takes.

// LaneState is a moment's copy of a lane's owner and progress words.
type LaneState struct {
	Owner     Identity
	Held      bool
	LaneEpoch uint64
	Next      uint64
	Published uint64
	Reaped    uint64
	Completed uint64
	// Open is the epoch whose ring the relay has opened (OpenEpoch).
	Open uint64
}

// Load reads the owner words; held is false for a free lane. A pid out of
// range (garbage) loads as -1, which no process has.
func (o *LaneOwner) Load() (owner Identity, held bool) {
	pid := atomic.LoadUint64(&o.Pid)
	if pid == 0 {
		return Identity{}, false
	}
	owner = Identity{Pid: -1, StartTime: atomic.LoadUint64(&o.StartTime), Epoch: atomic.LoadUint64(&o.SenderEpoch)}
	if pid <= MaxPid {
		owner.Pid = int(pid)
	}
	return owner, true
}

// LoadNS reads the PID namespace the owner's pid and start time belong
// to; the zero PidNS for a free lane.
func (o *LaneOwner) LoadNS() PidNS {
	return PidNS{Dev: atomic.LoadUint64(&o.PidNSDev), Ino: atomic.LoadUint64(&o.PidNSIno)}
}

// State reads the lane's owner and the progress words the relay last
// copied into the summary.
func (l *LaneSummary) State() LaneState {
	owner, held := l.Owner.Load()
	return LaneState{
		Owner:     owner,
		Held:      held,
		LaneEpoch: atomic.LoadUint64(&l.Owner.LaneEpoch),
		Next:      atomic.LoadUint64(&l.Sender.NextSeq),
		Published: atomic.LoadUint64(&l.Sender.PublishedSeq),
		Reaped:    atomic.LoadUint64(&l.Sender.ReapedSeq),
		Completed: atomic.LoadUint64(&l.Relay.CompletedSeq),
		Open:      atomic.LoadUint64(&l.Relay.OpenEpoch),
	}
}

// Epoch is the lane's current epoch, 0 before its first claim.
func (l *LaneSummary) Epoch() uint64 { return atomic.LoadUint64(&l.Owner.LaneEpoch) }

// Owned reports whether owner holds the lane under laneEpoch.
func (l *LaneSummary) Owned(owner Identity, laneEpoch uint64) bool {
	got, held := l.Owner.Load()
	return held && got == owner && l.Epoch() == laneEpoch
}

// Claim records owner as the lane's holder under laneEpoch; the progress
// copy starts over. Only the relay calls it, under its own lock.
func (l *LaneSummary) Claim(owner Identity, ns PidNS, laneEpoch uint64, now int64) {
	atomic.StoreUint64(&l.Owner.Pid, 0)
	atomic.StoreUint64(&l.Sender.NextSeq, 1)
	atomic.StoreUint64(&l.Sender.PublishedSeq, 0)
	atomic.StoreUint64(&l.Sender.ReapedSeq, 0)
	atomic.StoreUint64(&l.Relay.CompletedSeq, 0)
	atomic.StoreUint64(&l.Relay.OpenEpoch, 0)
	atomic.StoreUint64(&l.Owner.StartTime, owner.StartTime)
	atomic.StoreUint64(&l.Owner.PidNSDev, ns.Dev)
	atomic.StoreUint64(&l.Owner.PidNSIno, ns.Ino)
	atomic.StoreUint64(&l.Owner.SenderEpoch, owner.Epoch)
	atomic.StoreUint64(&l.Owner.LaneEpoch, laneEpoch)
	atomic.StoreUint64(&l.Owner.ClaimedAt, uint64(now))
	atomic.StoreUint64(&l.Owner.Pid, uint64(owner.Pid))
}

// Free clears the owner. The lane epoch stays. Only the relay calls it,
// under its own lock.
func (l *LaneSummary) Free() {
	atomic.StoreUint64(&l.Owner.Pid, 0)
	atomic.StoreUint64(&l.Owner.StartTime, 0)
	atomic.StoreUint64(&l.Owner.PidNSDev, 0)
	atomic.StoreUint64(&l.Owner.PidNSIno, 0)
	atomic.StoreUint64(&l.Owner.SenderEpoch, 0)
	atomic.StoreUint64(&l.Owner.ClaimedAt, 0)
}

// CopyProgress copies a claim's progress words into the summary, for
// inspect: the sender's as they are (untrusted) and the relay's own.
func (l *LaneSummary) CopyProgress(w *LaneSenderBlock, r *LaneRelayBlock) {
	atomic.StoreUint64(&l.Sender.NextSeq, atomic.LoadUint64(&w.Sender.NextSeq))
	atomic.StoreUint64(&l.Sender.PublishedSeq, atomic.LoadUint64(&w.Sender.PublishedSeq))
	atomic.StoreUint64(&l.Sender.ReapedSeq, atomic.LoadUint64(&w.Sender.ReapedSeq))
	atomic.StoreUint64(&l.Relay.CompletedSeq, atomic.LoadUint64(&r.Relay.CompletedSeq))
	atomic.StoreUint64(&l.Relay.OpenEpoch, atomic.LoadUint64(&r.Relay.OpenEpoch))
}

// SenderLane is the sender's endpoint of one claimed lane: it allocates
// seqs under credit, commits Descs, hands out the ready word of a seq for
// the doorbell, and reaps completions in order. It is owned by one
// goroutine (the pump).
type SenderLane struct {
	w   *LaneSenderBlock
	r   *LaneRelayBlock
	seq LaneSeq
}

// NewSenderLane is the endpoint of a lane claimed under epoch, whose blocks
// are mapped at w (read-write) and r (read-only: the endpoint only loads
// from it).
func NewSenderLane(w *LaneSenderBlock, r *LaneRelayBlock, epoch uint64) (*SenderLane, error) {
	seq, err := NewLaneSeq(epoch)
	if err != nil {
		return nil, err
	}
	return &SenderLane{w: w, r: r, seq: seq}, nil
}

// Epoch is the lane epoch every Desc of this lane carries.
func (s *SenderLane) Epoch() uint64 { return s.seq.Epoch() }

// Next is the seq the next Ticket returns.
func (s *SenderLane) Next() uint64 { return s.seq.Next() }

// Published is the highest seq whose doorbell was submitted.
func (s *SenderLane) Published() uint64 { return s.seq.Published() }

// Reaped is the highest seq whose completion was consumed (or abandoned).
func (s *SenderLane) Reaped() uint64 { return s.seq.Reaped() }

// InFlight reports whether published seqs wait for their completion.
func (s *SenderLane) InFlight() bool { return s.seq.Published() > s.seq.Reaped() }

// Exhausted reports whether the epoch's last seq was used: the lane takes
// no more tickets until it is drained and rolled over.
func (s *SenderLane) Exhausted() bool { return s.seq.NeedsRollover() }

// Ticket returns the seq the next Piece gets, or false when the lane has no
// credit, is exhausted, or the relay has not opened its epoch yet (Open).
// Nothing changes until Publish.
func (s *SenderLane) Ticket() (uint64, bool) {
	if !s.Opened() {
		return 0, false
	}
	return s.seq.peek()
}

// Opened reports whether the relay has opened this lane's epoch: no
// second-hop write of an earlier epoch still reads its slots.
func (s *SenderLane) Opened() bool {
	return atomic.LoadUint64(&s.r.Relay.OpenEpoch) == s.seq.Epoch()
}

// Commit writes the Desc of ticket seq, in parts that end at partEnds
// (Desc.Fill), and release-stores its commit seq. On error nothing of the
// Desc changed.
func (s *SenderLane) Commit(seq uint64, session string, plans []PlanEntry, pieceLen uint64, partEnds []uint32) error {
	if seq != s.seq.next {
		return fmt.Errorf("%w: commit seq %d, ticket %d", ErrSeqOrder, seq, s.seq.next)
	}
	d := &s.w.Descs[SlotOf(seq)]
	if err := d.Fill(s.seq.epoch, session, plans, pieceLen, partEnds); err != nil {
		return err
	}
	PublishDesc(d, seq)
	return nil
}

// ReadyWord is the address of seq's ready word, for a doorbell that a
// device writes (cuStreamWriteValue64) or that RingDoorbell writes. Only
// seq may be stored there, once, after the copy of its Piece into the slot.
func (s *SenderLane) ReadyWord(seq uint64) *uint64 { return &s.w.Ready[SlotOf(seq)].Seq }

// PartWords are the part words of seq's ready line, for a copy that
// signals the parts its Desc names: seq may be stored into PartWords[p]
// once part p is in the slot, for every part but the last.
func (s *SenderLane) PartWords(seq uint64) *[MaxParts - 1]uint64 {
	return &s.w.Ready[SlotOf(seq)].Parts
}

// RingDoorbell release-stores seq at a ready word handed out by ReadyWord:
// the CPU doorbell, for a copy whose completion the caller has seen.
func RingDoorbell(word *uint64, seq uint64) { atomic.StoreUint64(word, seq) }

// Publish records that ticket seq's Desc is committed and its doorbell
// submitted; the slot is the relay's until Reap returns seq.
func (s *SenderLane) Publish(seq uint64) error {
	if got, ok := s.seq.Alloc(); !ok || got != seq {
		return fmt.Errorf("%w: publish seq %d, ticket %d", ErrSeqOrder, seq, got)
	}
	if err := s.seq.MarkPublished(seq); err != nil {
		return err
	}
	atomic.StoreUint64(&s.w.Sender.NextSeq, s.seq.next)
	atomic.StoreUint64(&s.w.Sender.PublishedSeq, seq)
	return nil
}

// Reap consumes the completion of the oldest published seq, if the relay
// has written it, and returns the seq and its status.
func (s *SenderLane) Reap() (seq uint64, status int32, ok bool) {
	if s.seq.reaped >= s.seq.published {
		return 0, 0, false
	}
	seq = s.seq.reaped + 1
	c := &s.r.Completions[SlotOf(seq)]
	if atomic.LoadUint64(&c.Seq) != seq {
		return 0, 0, false
	}
	status = atomic.LoadInt32(&c.Status)
	s.seq.reaped = seq
	atomic.StoreUint64(&s.w.Sender.ReapedSeq, seq)
	return seq, status, true
}

// Abandon gives up the oldest published seq without its completion, for a
// lane whose relay is gone: the caller fails its Piece. The lane must not
// take tickets afterwards, since the relay may still use the slot.
func (s *SenderLane) Abandon() (uint64, bool) {
	if s.seq.reaped >= s.seq.published {
		return 0, false
	}
	s.seq.reaped++
	return s.seq.reaped, true
}

// Drained reports whether every published seq was reaped.
func (s *SenderLane) Drained() bool { return s.seq.Drained() }

// Words is the address range of the lane's sender block in this process,
// for registering it with a device that writes ready words.
func (s *SenderLane) Words() (base uintptr, size uint64) {
	return uintptr(unsafe.Pointer(s.w)), uint64(unsafe.Sizeof(*s.w))
}

// RelaySleeping reports whether the relay's pump may be asleep: a sender
// that has published wakes it through the lane's eventfd (LaneWaker).
func (s *SenderLane) RelaySleeping() bool { return atomic.LoadUint32(&s.r.Wake.Sleeping) != 0 }

// TicketState is what RelayLane.Poll finds for the next seq.
type TicketState uint8

const (
	// TicketNone: no doorbell for the next seq, or no credit for it.
	TicketNone TicketState = iota
	// TicketRung: the doorbell rang but the Desc's commit is not visible
	// yet. A commit that never comes is a broken sender; the relay takes
	// the ticket anyway after a bound, and validation fails it.
	TicketRung
	// TicketReady: doorbell, or the first part word, and commit match the
	// next seq.
	TicketReady
)

// LaneWords are the blocks of one claim of a lane as its relay maps them,
// and the claim's eventfd, which the lane's holder writes to wake the
// relay. The relay makes them for each claim (a new holder never sees an
// earlier holder's words) and offers them to the lane's RelayLane; Free
// unmaps and closes them, once, when no read of them is left.
type LaneWords struct {
	Epoch  uint64
	Sender *LaneSenderBlock
	Relay  *LaneRelayBlock
	WakeFD int
	Free   func()
	// Install, when set, puts the claim's staging memory in place of the
	// lane's earlier holder's (LaneRenewer); Open calls it once, before
	// it opens the ring, and a ring whose Install failed never opens.
	Install func() error

	adopted bool
	refused bool
}

// RelayLane is the relay's endpoint of one of its inbound lanes: it follows
// the lane's claims, takes tickets strictly in seq order and publishes
// completions in order, whatever order the second hops finish in. Offer
// and Withdraw come from the goroutine that decides claims; everything
// else from one goroutine (the pump).
type RelayLane struct {
	// offer is the current claim's words, nil while the lane is free; mu
	// orders Offer and Withdraw against the pump's adoption (Sync), so
	// that words the pump never adopted are freed by whoever replaces
	// them, and adopted ones only by the pump.
	mu    sync.Mutex
	offer atomic.Pointer[LaneWords]

	cur    *LaneWords
	epoch  uint64
	next   uint64
	window CompletionWindow
	status [SlotsPerLane]int32
	// open: the ring of epoch is open (Open); until then Poll finds no
	// ticket.
	open bool
}

// NewRelayLane is the relay's endpoint of a lane, free until Offer.
func NewRelayLane() *RelayLane { return &RelayLane{} }

// Offer makes w the lane's current claim; the pump adopts it at its next
// Sync. Words offered before and never adopted are freed here.
func (r *RelayLane) Offer(w *LaneWords) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev := r.offer.Swap(w); prev != nil && !prev.adopted {
		prev.Free()
	}
}

// Withdraw ends the lane's current claim: the pump's ring stops being
// Current, and words it never adopted are freed here.
func (r *RelayLane) Withdraw() {
	r.Offer(nil)
}

// Release frees the words the endpoint holds, adopted or offered; the
// caller is the pump's owner once the pump has stopped.
func (r *RelayLane) Release() {
	r.mu.Lock()
	prev := r.offer.Swap(nil)
	r.mu.Unlock()
	if prev != nil && !prev.adopted {
		prev.Free()
	}
	if r.cur != nil {
		r.cur.Free()
		r.cur = nil
	}
}

// Sync adopts the lane's current claim. A new one restarts the ring at seq
// 1 with nothing completed, closed until Open; the words of the claim
// before are freed, since nothing reads them any more (a Piece of an
// earlier epoch writes no completion, and its parts no longer land). prev
// is the epoch before (0: none seen yet). A lane never claimed has epoch 0
// and no tickets; a lane freed keeps its last ring, not Current.
func (r *RelayLane) Sync() (epoch, prev uint64) {
	prev = r.epoch
	o := r.offer.Load()
	if o == nil || o == r.cur {
		return r.epoch, prev
	}
	r.mu.Lock()
	o = r.offer.Load()
	if o != nil {
		o.adopted = true
	}
	r.mu.Unlock()
	if o == nil || o == r.cur {
		return r.epoch, prev
	}
	if r.cur != nil {
		r.cur.Free()
	}
	r.cur = o
	r.epoch, r.next, r.window, r.open = o.Epoch, 1, CompletionWindow{}, false
	return r.epoch, prev
}

// Opened reports whether the ring of the epoch last synced is open.
func (r *RelayLane) Opened() bool { return r.open }

// Open opens the ring of the epoch last synced, which the caller calls
// only once no second-hop write of the lane's earlier epochs can still
// read a slot: it installs the claim's staging memory where the claim
// brought new memory (LaneWords.Install), then release-stores the epoch
// into OpenEpoch, after which the sender may take tickets. The claim's
// words are new, so there is nothing of an earlier epoch to reset. An
// Install that fails is returned once, and that ring stays closed.
func (r *RelayLane) Open() error {
	if r.open || r.cur == nil || r.cur.refused {
		return nil
	}
	if install := r.cur.Install; install != nil {
		r.cur.Install = nil
		if err := install(); err != nil {
			r.cur.refused = true
			return fmt.Errorf("lane epoch %#x: %w", r.epoch, err)
		}
	}
	atomic.StoreUint64(&r.cur.Relay.Relay.OpenEpoch, r.epoch)
	r.open = true
	return nil
}

// Words are the claim the pump follows, nil before the first; valid until
// the next Sync.
func (r *RelayLane) Words() *LaneWords { return r.cur }

// Epoch is the epoch of the ring the relay follows.
func (r *RelayLane) Epoch() uint64 { return r.epoch }

// Next is the first seq not yet taken.
func (r *RelayLane) Next() uint64 { return r.next }

// Completed is the highest seq below which every seq was completed.
func (r *RelayLane) Completed() uint64 { return r.window.Completed() }

// Poll looks at the next seq's doorbell (or its first part word: the
// Piece has begun to land) and Desc commit, within credit.
func (r *RelayLane) Poll() (uint64, TicketState) {
	seq := r.next
	if !r.open || seq-r.window.Completed() > SlotsPerLane {
		return seq, TicketNone
	}
	slot := SlotOf(seq)
	rw := &r.cur.Sender.Ready[slot]
	if atomic.LoadUint64(&rw.Seq) != seq && atomic.LoadUint64(&rw.Parts[0]) != seq {
		return seq, TicketNone
	}
	if LoadCommitSeq(&r.cur.Sender.Descs[slot]) != seq {
		return seq, TicketRung
	}
	return seq, TicketReady
}

// Announced is how many seqs past the last one taken the sender says it
// has published (its progress word, untrusted), at most K: doorbells that
// may still be on their way.
func (r *RelayLane) Announced() int {
	if !r.open {
		return 0
	}
	pub := atomic.LoadUint64(&r.cur.Sender.Sender.PublishedSeq)
	if pub < r.next {
		return 0
	}
	return int(min(pub-r.next+1, SlotsPerLane))
}

// AnnouncedBytes is how many bytes the tickets Announced counts carry, as
// their committed Descs say (untrusted, clamped to a slot); a ticket whose
// Desc is not committed yet counts as a whole slot. It stops adding once
// the sum passes limit. Like Announced, it is a hint for how soon the relay
// looks again.
func (r *RelayLane) AnnouncedBytes(limit uint64) uint64 {
	var sum uint64
	for seq, n := r.next, r.Announced(); n > 0 && sum <= limit; seq, n = seq+1, n-1 {
		d := &r.cur.Sender.Descs[SlotOf(seq)]
		b := uint64(SlotSize)
		if LoadCommitSeq(d) == seq {
			if l := atomic.LoadUint64(&d.PieceLen); l > 0 && l < SlotSize {
				b = l
			}
		}
		sum += b
	}
	return sum
}

// PartsLanded is how many of the first parts of seq, a Piece of parts
// parts taken from this lane and not yet completed, are in the slot: all
// of them once its doorbell rang, else those whose part words, in order,
// hold seq. A lane claimed anew since (another epoch) has reset the words:
// the caller checks the epoch.
func (r *RelayLane) PartsLanded(seq uint64, parts int) int {
	if r.cur == nil {
		return 0
	}
	rw := &r.cur.Sender.Ready[SlotOf(seq)]
	if atomic.LoadUint64(&rw.Seq) == seq {
		return parts
	}
	n := 0
	for n < parts-1 && atomic.LoadUint64(&rw.Parts[n]) == seq {
		n++
	}
	return n
}

// Current reports whether the ring the relay follows is still the lane's:
// the epoch is the one last synced and a sender holds the lane. A sender
// that is gone (its lane freed) or a new claim ends it; a Piece whose parts
// are still landing then never lands whole.
func (r *RelayLane) Current() bool {
	o := r.offer.Load()
	return o != nil && o == r.cur
}

// Take consumes the next seq: it copies and validates its Desc into out
// and moves on to the following seq, valid or not. An invalid Desc still
// needs its completion (CompletionInvalidDesc), so credit never leaks.
func (r *RelayLane) Take(out *ValidDesc) (uint64, error) {
	seq := r.next
	r.next++
	return seq, ValidateDesc(&r.cur.Sender.Descs[SlotOf(seq)], DescExpect{Epoch: r.epoch, Seq: seq}, out)
}

// Complete records that seq of epoch finished with status and publishes
// every completion that is now contiguous. A finish from an epoch the lane
// has left writes nothing: the ring belongs to a new sender.
func (r *RelayLane) Complete(epoch, seq uint64, status int32) error {
	if epoch != r.epoch {
		return nil
	}
	before := r.window.Completed()
	r.status[SlotOf(seq)] = status
	after, err := r.window.MarkDone(seq)
	if err != nil {
		return err
	}
	for s := before + 1; s <= after; s++ {
		c := &r.cur.Relay.Completions[SlotOf(s)]
		atomic.StoreInt32(&c.Status, r.status[SlotOf(s)])
		atomic.StoreUint64(&c.Seq, s)
	}
	if after != before {
		atomic.StoreUint64(&r.cur.Relay.Relay.CompletedSeq, after)
	}
	return nil
}
