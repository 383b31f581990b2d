// SPDX-License-Identifier: Apache-2.0

package staging

import "fmt"

// startAt makes a lane that has published nothing start at seq instead of
// 1, as if seqs 1..seq-1 had been published and reaped: the tests reach
// MaxLaneSeq with it.
func (s *SenderLane) startAt(seq uint64) error {
	if s.seq.next != 1 || s.seq.published != 0 || seq == 0 || seq > MaxLaneSeq {
		return fmt.Errorf("%w: start at %d, next %d, published %d", ErrSeqOrder, seq, s.seq.next, s.seq.published)
	}
	s.seq.next, s.seq.published, s.seq.reaped = seq, seq-1, seq-1
	return nil
}

// startAt makes the current epoch's ring start at seq instead of 1, as if
// seqs 1..seq-1 had been completed.
func (r *RelayLane) startAt(seq uint64) {
	r.next, r.window = seq, CompletionWindow{completed: seq - 1}
}

// ring is the CPU doorbell of seq, as a copier rings it.
func (s *SenderLane) ring(seq uint64) { RingDoorbell(s.ReadyWord(seq), seq) }
