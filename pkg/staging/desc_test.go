// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"runtime"
	"strings"
	"testing"
	"time"
)

const (
	testEpoch   = 0x5eed_0000_0000_0001
	testSeq     = 42
	testSession = "kv-target-session"
)

var testPlans = []PlanEntry{
	{Dst: 0x7f00_0000_0000, Len: 4096},
	{Dst: 0x7f00_0010_0000, Len: 1 << 20},
	{Dst: 0x7f00_1000_0000, Len: 123},
}

func testPieceLen() uint64 { return 4096 + 1<<20 + 123 }

// validDesc returns a published Desc that ValidateDesc accepts with
// testExpect.
func validDesc(t testing.TB) *Desc {
	t.Helper()
	d := new(Desc)
	if err := d.Fill(testEpoch, testSession, testPlans, testPieceLen(), nil); err != nil {
		t.Fatalf("Fill: %v", err)
	}
	PublishDesc(d, testSeq)
	return d
}

var testExpect = DescExpect{Epoch: testEpoch, Seq: testSeq}

func TestValidateDescAccepts(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(d *Desc)
	}{
		{"as filled", func(d *Desc) {}},
		{"one plan of a full slot", func(d *Desc) {
			d.PieceLen = SlotSize
			d.PlanCount = 1
			d.Plans[0] = PlanEntry{Dst: 0x1000, Len: SlotSize}
		}},
		{"MaxPlans one-byte plans", func(d *Desc) {
			d.PieceLen = MaxPlans
			d.PlanCount = MaxPlans
			for i := range d.Plans {
				d.Plans[i] = PlanEntry{Dst: uint64(i) * 64, Len: 1}
			}
		}},
		{"dst 0 (zero-based MR)", func(d *Desc) { d.Plans[0].Dst = 0 }},
		{"plan ending at 2^64-1", func(d *Desc) { d.Plans[2].Dst = math.MaxUint64 - 123 }},
		{"session of MaxSession bytes", func(d *Desc) {
			d.SessionLen = MaxSession
			copy(d.Session[:], strings.Repeat("s", MaxSession))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := validDesc(t)
			tt.mutate(d)
			var v ValidDesc
			if err := ValidateDesc(d, testExpect, &v); err != nil {
				t.Fatalf("ValidateDesc: %v", err)
			}
			if v.Seq() != testSeq || v.Epoch() != testEpoch || v.PieceLen() != d.PieceLen {
				t.Errorf("validated seq %d epoch %#x piece len %d, want %d %#x %d", v.Seq(), v.Epoch(), v.PieceLen(), testSeq, uint64(testEpoch), d.PieceLen)
			}
			if !bytes.Equal(v.Session(), d.Session[:d.SessionLen]) {
				t.Errorf("session %q, want %q", v.Session(), d.Session[:d.SessionLen])
			}
			if len(v.Plans()) != int(d.PlanCount) {
				t.Fatalf("%d plans, want %d", len(v.Plans()), d.PlanCount)
			}
			for i, p := range v.Plans() {
				if p != d.Plans[i] {
					t.Fatalf("plans[%d] = %+v, want %+v", i, p, d.Plans[i])
				}
			}
		})
	}
}

// descRuleCase is one Desc that breaks one rule.
type descRuleCase struct {
	name   string
	mutate func(d *Desc)
	want   DescError
}

func runDescRuleCases(t *testing.T, sentinel error, tests []descRuleCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := validDesc(t)
			tt.mutate(d)
			var v ValidDesc
			err := ValidateDesc(d, testExpect, &v)
			if !errors.Is(err, sentinel) {
				t.Fatalf("ValidateDesc = %v, want %v", err, sentinel)
			}
			var de *DescError
			if !errors.As(err, &de) {
				t.Fatalf("ValidateDesc = %T, want *DescError", err)
			}
			if *de != tt.want {
				t.Errorf("DescError = %+v, want %+v", *de, tt.want)
			}
			for _, other := range descSentinels {
				if other != nil && other != sentinel && errors.Is(err, other) {
					t.Errorf("%v also matches %v", err, other)
				}
			}
			if v.Seq() != 0 || len(v.Plans()) != 0 || len(v.Session()) != 0 {
				t.Errorf("rejected Desc left seq %d, %d plans, session %q", v.Seq(), len(v.Plans()), v.Session())
			}
		})
	}
}

func TestValidateDescSeq(t *testing.T) {
	runDescRuleCases(t, ErrDescSeq, []descRuleCase{
		{"zero", func(d *Desc) { d.CommitSeq = 0 }, DescError{Kind: DescSeq, Field: "commit_seq", Plan: -1, Value: 0, Want: testSeq}},
		{"previous round of the slot", func(d *Desc) { d.CommitSeq = testSeq - SlotsPerLane }, DescError{Kind: DescSeq, Field: "commit_seq", Plan: -1, Value: testSeq - SlotsPerLane, Want: testSeq}},
		{"ahead", func(d *Desc) { d.CommitSeq = testSeq + 1 }, DescError{Kind: DescSeq, Field: "commit_seq", Plan: -1, Value: testSeq + 1, Want: testSeq}},
	})

	d := validDesc(t)
	PublishDesc(d, MaxLaneSeq+1)
	var v ValidDesc
	if err := ValidateDesc(d, DescExpect{Epoch: testEpoch, Seq: MaxLaneSeq + 1}, &v); !errors.Is(err, ErrDescSeq) {
		t.Errorf("seq past MaxLaneSeq: ValidateDesc = %v, want %v", err, ErrDescSeq)
	}
	PublishDesc(d, 0)
	if err := ValidateDesc(d, DescExpect{Epoch: testEpoch, Seq: 0}, &v); !errors.Is(err, ErrDescSeq) {
		t.Errorf("seq 0 expected and found: ValidateDesc = %v, want %v", err, ErrDescSeq)
	}
}

func TestValidateDescEpoch(t *testing.T) {
	runDescRuleCases(t, ErrDescEpoch, []descRuleCase{
		{"other epoch", func(d *Desc) { d.Epoch = testEpoch + 1 }, DescError{Kind: DescEpoch, Field: "epoch", Plan: -1, Value: testEpoch + 1, Want: testEpoch}},
		{"zero", func(d *Desc) { d.Epoch = 0 }, DescError{Kind: DescEpoch, Field: "epoch", Plan: -1, Value: 0, Want: testEpoch}},
	})

	d := validDesc(t)
	d.Epoch = 0
	var v ValidDesc
	if err := ValidateDesc(d, DescExpect{Epoch: 0, Seq: testSeq}, &v); !errors.Is(err, ErrDescEpoch) {
		t.Errorf("epoch 0 expected and found: ValidateDesc = %v, want %v", err, ErrDescEpoch)
	}
}

func TestValidateDescPieceLen(t *testing.T) {
	runDescRuleCases(t, ErrDescPieceLen, []descRuleCase{
		{"zero", func(d *Desc) { d.PieceLen = 0 }, DescError{Kind: DescPieceLen, Field: "piece_len", Plan: -1, Value: 0, Want: SlotSize}},
		{"one past the slot", func(d *Desc) { d.PieceLen = SlotSize + 1 }, DescError{Kind: DescPieceLen, Field: "piece_len", Plan: -1, Value: SlotSize + 1, Want: SlotSize}},
		{"huge", func(d *Desc) { d.PieceLen = math.MaxUint64 }, DescError{Kind: DescPieceLen, Field: "piece_len", Plan: -1, Value: math.MaxUint64, Want: SlotSize}},
	})
}

func TestValidateDescPlanCount(t *testing.T) {
	runDescRuleCases(t, ErrDescPlanCount, []descRuleCase{
		{"zero", func(d *Desc) { d.PlanCount = 0 }, DescError{Kind: DescPlanCount, Field: "plan_count", Plan: -1, Value: 0, Want: MaxPlans}},
		{"one past MaxPlans", func(d *Desc) { d.PlanCount = MaxPlans + 1 }, DescError{Kind: DescPlanCount, Field: "plan_count", Plan: -1, Value: MaxPlans + 1, Want: MaxPlans}},
		{"huge", func(d *Desc) { d.PlanCount = math.MaxUint32 }, DescError{Kind: DescPlanCount, Field: "plan_count", Plan: -1, Value: math.MaxUint32, Want: MaxPlans}},
	})
}

func TestValidateDescSession(t *testing.T) {
	runDescRuleCases(t, ErrDescSession, []descRuleCase{
		{"empty", func(d *Desc) { d.SessionLen = 0 }, DescError{Kind: DescSession, Field: "session_len", Plan: -1, Value: 0, Want: MaxSession}},
		{"one past MaxSession", func(d *Desc) { d.SessionLen = MaxSession + 1 }, DescError{Kind: DescSession, Field: "session_len", Plan: -1, Value: MaxSession + 1, Want: MaxSession}},
		{"huge", func(d *Desc) { d.SessionLen = math.MaxUint32 }, DescError{Kind: DescSession, Field: "session_len", Plan: -1, Value: math.MaxUint32, Want: MaxSession}},
	})
}

func TestValidateDescPlanLen(t *testing.T) {
	runDescRuleCases(t, ErrDescPlanLen, []descRuleCase{
		{"first", func(d *Desc) { d.Plans[0].Len = 0 }, DescError{Kind: DescPlanLen, Field: "plans.len", Plan: 0}},
		{"count covers an unwritten entry", func(d *Desc) { d.PlanCount = 4 }, DescError{Kind: DescPlanLen, Field: "plans.len", Plan: 3}},
	})
}

func TestValidateDescOverflow(t *testing.T) {
	runDescRuleCases(t, ErrDescOverflow, []descRuleCase{
		{"end one past 2^64-1", func(d *Desc) { d.Plans[2].Dst = math.MaxUint64 - 122 }, DescError{Kind: DescOverflow, Field: "plans.dst", Plan: 2, Value: math.MaxUint64 - 122, Want: math.MaxUint64 - 123}},
		{"dst at the top", func(d *Desc) { d.Plans[1].Dst = math.MaxUint64 }, DescError{Kind: DescOverflow, Field: "plans.dst", Plan: 1, Value: math.MaxUint64, Want: math.MaxUint64 - 1<<20}},
		{"len wraps a small dst", func(d *Desc) { d.Plans[0].Len = math.MaxUint64 }, DescError{Kind: DescOverflow, Field: "plans.dst", Plan: 0, Value: 0x7f00_0000_0000, Want: 0}},
	})
}

func TestValidateDescPlanSum(t *testing.T) {
	runDescRuleCases(t, ErrDescPlanSum, []descRuleCase{
		{"short by one", func(d *Desc) { d.Plans[2].Len = 122 }, DescError{Kind: DescPlanSum, Field: "plans", Plan: -1, Value: testPieceLen() - 1, Want: testPieceLen()}},
		{"long by one", func(d *Desc) { d.Plans[2].Len = 124 }, DescError{Kind: DescPlanSum, Field: "plans.len", Plan: 2, Value: 124, Want: 123}},
		{"one entry larger than the piece", func(d *Desc) { d.Plans[0].Len = SlotSize }, DescError{Kind: DescPlanSum, Field: "plans.len", Plan: 0, Value: SlotSize, Want: testPieceLen()}},
		{"lens that wrap to the piece length", func(d *Desc) {
			d.PlanCount = 2
			d.PieceLen = 100
			d.Plans[0] = PlanEntry{Dst: 0, Len: 1 << 63}
			d.Plans[1] = PlanEntry{Dst: 0, Len: 1<<63 + 100}
		}, DescError{Kind: DescPlanSum, Field: "plans.len", Plan: 0, Value: 1 << 63, Want: 100}},
	})
}

func TestDescErrorMessagesNameTheValue(t *testing.T) {
	tests := []struct {
		err  DescError
		want string
	}{
		{DescError{Kind: DescSeq, Field: "commit_seq", Plan: -1, Value: 7, Want: 5}, "commit_seq 7, want 5"},
		{DescError{Kind: DescSeq, Field: "commit_seq", Plan: -1, Value: 0, Want: 5}, "commit_seq 0"},
		{DescError{Kind: DescEpoch, Field: "epoch", Plan: -1, Value: 0xab, Want: 0xcd}, "epoch 0xab, want 0xcd"},
		{DescError{Kind: DescPieceLen, Field: "piece_len", Plan: -1, Value: 9 << 20, Want: SlotSize}, "piece_len 9437184 out of range 1..8388608"},
		{DescError{Kind: DescPlanCount, Field: "plan_count", Plan: -1, Value: 5000, Want: MaxPlans}, "plan_count 5000 out of range 1..4096"},
		{DescError{Kind: DescSession, Field: "session_len", Plan: -1, Value: 300, Want: MaxSession}, "session_len 300 out of range 1..256"},
		{DescError{Kind: DescPlanLen, Field: "plans.len", Plan: 9}, "plans[9].len 0"},
		{DescError{Kind: DescOverflow, Field: "plans.dst", Plan: 3, Value: 0xfff0, Want: 0xff00}, "plans[3].dst 0xfff0"},
		{DescError{Kind: DescPlanSum, Field: "plans.len", Plan: 2, Value: 124, Want: 123}, "plans[2].len 124 exceeds the 123 bytes"},
		{DescError{Kind: DescPlanSum, Field: "plans", Plan: -1, Value: 80, Want: 100}, "sum to 80, want piece_len 100"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); !strings.Contains(got, tt.want) {
			t.Errorf("%+v: Error() = %q, want it to contain %q", tt.err, got, tt.want)
		}
	}
}

func TestValidateDescCopiesOutOfSharedMemory(t *testing.T) {
	d := validDesc(t)
	var v ValidDesc
	if err := ValidateDesc(d, testExpect, &v); err != nil {
		t.Fatalf("ValidateDesc: %v", err)
	}
	d.CommitSeq, d.Epoch, d.PieceLen, d.PlanCount, d.SessionLen = 1, 2, 3, MaxPlans, MaxSession
	d.Plans[0] = PlanEntry{Dst: math.MaxUint64, Len: math.MaxUint64}
	d.Session[0] = 'X'

	if v.Seq() != testSeq || v.Epoch() != testEpoch || v.PieceLen() != testPieceLen() {
		t.Errorf("after the peer rewrote the Desc: seq %d epoch %#x piece len %d, want %d %#x %d", v.Seq(), v.Epoch(), v.PieceLen(), testSeq, uint64(testEpoch), testPieceLen())
	}
	if string(v.Session()) != testSession {
		t.Errorf("after the peer rewrote the Desc: session %q, want %q", v.Session(), testSession)
	}
	if len(v.Plans()) != len(testPlans) || v.Plans()[0] != testPlans[0] {
		t.Errorf("after the peer rewrote the Desc: plans %v, want %v", v.Plans()[:min(len(v.Plans()), 4)], testPlans)
	}
}

func TestFill(t *testing.T) {
	d := new(Desc)
	copy(d.Session[:], strings.Repeat("stale", 50))
	d.CommitSeq = 17
	if err := d.Fill(testEpoch, testSession, testPlans, testPieceLen(), nil); err != nil {
		t.Fatalf("Fill: %v", err)
	}
	if d.CommitSeq != 17 {
		t.Errorf("Fill wrote CommitSeq %d; it belongs to PublishDesc", d.CommitSeq)
	}
	if d.Epoch != testEpoch || d.PieceLen != testPieceLen() || d.PlanCount != uint32(len(testPlans)) || d.SessionLen != uint32(len(testSession)) {
		t.Errorf("Fill wrote epoch %#x piece len %d plan count %d session len %d", d.Epoch, d.PieceLen, d.PlanCount, d.SessionLen)
	}
	if string(d.Session[:d.SessionLen]) != testSession || d.Session[d.SessionLen] != 0 || d.Session[MaxSession-1] != 0 {
		t.Errorf("Fill left session %q", d.Session[:])
	}
	for i, p := range testPlans {
		if d.Plans[i] != p {
			t.Errorf("plans[%d] = %+v, want %+v", i, d.Plans[i], p)
		}
	}
}

func TestFillRejects(t *testing.T) {
	manyPlans := make([]PlanEntry, MaxPlans+1)
	for i := range manyPlans {
		manyPlans[i] = PlanEntry{Dst: uint64(i), Len: 1}
	}
	tests := []struct {
		name     string
		epoch    uint64
		session  string
		plans    []PlanEntry
		pieceLen uint64
		want     error
	}{
		{"epoch 0", 0, testSession, testPlans, testPieceLen(), ErrDescEpoch},
		{"piece larger than a slot", testEpoch, testSession, []PlanEntry{{Dst: 0, Len: SlotSize + 1}}, SlotSize + 1, ErrDescPieceLen},
		{"no plans", testEpoch, testSession, nil, 1, ErrDescPlanCount},
		{"too many plans", testEpoch, testSession, manyPlans, MaxPlans + 1, ErrDescPlanCount},
		{"empty session", testEpoch, "", testPlans, testPieceLen(), ErrDescSession},
		{"session too long", testEpoch, strings.Repeat("s", MaxSession+1), testPlans, testPieceLen(), ErrDescSession},
		{"empty plan", testEpoch, testSession, []PlanEntry{{Dst: 0, Len: 0}, {Dst: 0, Len: 1}}, 1, ErrDescPlanLen},
		{"overflowing plan", testEpoch, testSession, []PlanEntry{{Dst: math.MaxUint64, Len: 1}}, 1, ErrDescOverflow},
		{"sum short", testEpoch, testSession, testPlans, testPieceLen() + 1, ErrDescPlanSum},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Desc
			err := d.Fill(tt.epoch, tt.session, tt.plans, tt.pieceLen, nil)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Fill = %v, want %v", err, tt.want)
			}
			if d.Epoch != 0 || d.PieceLen != 0 || d.PlanCount != 0 || d.SessionLen != 0 || d.Plans[0] != (PlanEntry{}) {
				t.Errorf("a rejected Fill wrote to the Desc")
			}
		})
	}
}

// TestPublishDescOrdersTheFill relies on the race detector: if PublishDesc
// were not a release store matched by LoadCommitSeq's acquire, the relay
// side's reads of the filled fields would race with the sender's writes.
func TestPublishDescOrdersTheFill(t *testing.T) {
	d := new(Desc)
	errc := make(chan error, 1)
	go func() {
		if err := d.Fill(testEpoch, testSession, testPlans, testPieceLen(), nil); err != nil {
			errc <- err
			return
		}
		PublishDesc(d, testSeq)
		errc <- nil
	}()
	deadline := time.Now().Add(10 * time.Second)
	for LoadCommitSeq(d) != testSeq {
		if time.Now().After(deadline) {
			t.Fatalf("commit seq still %d after 10s", LoadCommitSeq(d))
		}
		runtime.Gosched()
	}
	var v ValidDesc
	if err := ValidateDesc(d, testExpect, &v); err != nil {
		t.Fatalf("ValidateDesc after the commit: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Fill: %v", err)
	}
}

func TestDescHotPathDoesNotAllocate(t *testing.T) {
	d := validDesc(t)
	var v ValidDesc
	allocs := testing.AllocsPerRun(100, func() {
		if err := d.Fill(testEpoch, testSession, testPlans, testPieceLen(), nil); err != nil {
			t.Fatal(err)
		}
		PublishDesc(d, testSeq)
		if LoadCommitSeq(d) != testSeq {
			t.Fatal("commit seq lost")
		}
		if err := ValidateDesc(d, testExpect, &v); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Fill+PublishDesc+ValidateDesc allocate %v times per Piece, want 0", allocs)
	}
}

func BenchmarkValidateDesc(b *testing.B) {
	d := new(Desc)
	plans := make([]PlanEntry, MaxPlans)
	for i := range plans {
		plans[i] = PlanEntry{Dst: uint64(i) << 12, Len: SlotSize / MaxPlans}
	}
	if err := d.Fill(testEpoch, testSession, plans, SlotSize, nil); err != nil {
		b.Fatal(err)
	}
	PublishDesc(d, testSeq)
	v := new(ValidDesc)
	b.ReportAllocs()
	for b.Loop() {
		if err := ValidateDesc(d, testExpect, v); err != nil {
			b.Fatal(err)
		}
	}
}

// descOracle decides independently of ValidateDesc whether d is valid for
// want, using 128-bit sums.
func descOracle(d *Desc, want DescExpect) bool {
	if d.CommitSeq == 0 || d.CommitSeq != want.Seq || d.CommitSeq > math.MaxUint64-SlotsPerLane-1 {
		return false
	}
	if d.Epoch == 0 || d.Epoch != want.Epoch {
		return false
	}
	if d.PieceLen < 1 || d.PieceLen > 8<<20 || d.PlanCount < 1 || d.PlanCount > 4096 || d.SessionLen < 1 || d.SessionLen > 256 {
		return false
	}
	var hi, lo uint64
	for _, p := range d.Plans[:d.PlanCount] {
		if p.Len == 0 {
			return false
		}
		if _, carry := bits.Add64(p.Dst, p.Len, 0); carry != 0 {
			return false
		}
		var c uint64
		lo, c = bits.Add64(lo, p.Len, 0)
		hi += c
	}
	if hi != 0 || lo != d.PieceLen || d.Parts > 8 {
		return false
	}
	for p := 0; p+1 < int(d.Parts); p++ {
		if d.PartEnds[p] == 0 || d.PartEnds[p] >= d.PlanCount || p > 0 && d.PartEnds[p] <= d.PartEnds[p-1] {
			return false
		}
	}
	return true
}

func fuzzSeed(f *testing.F, d *Desc, want DescExpect) {
	plans := make([]byte, 0, 16*d.PlanCount)
	for _, p := range d.Plans[:min(d.PlanCount, 8)] {
		plans = binary.LittleEndian.AppendUint64(plans, p.Dst)
		plans = binary.LittleEndian.AppendUint64(plans, p.Len)
	}
	f.Add(d.CommitSeq, d.Epoch, d.PieceLen, d.PlanCount, d.SessionLen, want.Epoch, want.Seq, plans, d.Session[:min(d.SessionLen, MaxSession)])
}

func FuzzValidateDesc(f *testing.F) {
	fuzzSeed(f, validDesc(f), testExpect)
	one := new(Desc)
	if err := one.Fill(1, "s", []PlanEntry{{Dst: math.MaxUint64 - SlotSize, Len: SlotSize}}, SlotSize, nil); err != nil {
		f.Fatal(err)
	}
	PublishDesc(one, 1)
	fuzzSeed(f, one, DescExpect{Epoch: 1, Seq: 1})
	bad := validDesc(f)
	bad.Plans[1].Len = math.MaxUint64 - 4095
	fuzzSeed(f, bad, testExpect)

	const fuzzPlans = 64
	d := new(Desc)
	var v ValidDesc
	f.Fuzz(func(t *testing.T, commitSeq, epoch, pieceLen uint64, planCount, sessionLen uint32, wantEpoch, wantSeq uint64, plans, session []byte) {
		d.CommitSeq, d.Epoch, d.PieceLen, d.PlanCount, d.SessionLen = commitSeq, epoch, pieceLen, planCount, sessionLen
		for i := range d.Plans[:fuzzPlans] {
			d.Plans[i] = PlanEntry{}
			if len(plans) >= 16 {
				d.Plans[i] = PlanEntry{Dst: binary.LittleEndian.Uint64(plans), Len: binary.LittleEndian.Uint64(plans[8:])}
				plans = plans[16:]
			}
		}
		n := copy(d.Session[:], session)
		clear(d.Session[n:])
		want := DescExpect{Epoch: wantEpoch, Seq: wantSeq}

		err := ValidateDesc(d, want, &v)
		if ok := descOracle(d, want); ok != (err == nil) {
			t.Fatalf("ValidateDesc = %v, oracle says valid=%v for %+v", err, ok, LoadDescHeader(d))
		}
		if err != nil {
			var de *DescError
			if !errors.As(err, &de) || de.Kind < DescSeq || de.Kind > DescParts || !errors.Is(err, descSentinels[de.Kind]) {
				t.Fatalf("ValidateDesc = %#v, want a *DescError of a known kind", err)
			}
			if len(v.Plans()) != 0 || len(v.Session()) != 0 {
				t.Fatalf("rejected Desc left %d plans and session %q", len(v.Plans()), v.Session())
			}
			return
		}
		if v.Seq() != commitSeq || v.Epoch() != epoch || v.PieceLen() != pieceLen {
			t.Fatalf("validated seq %d epoch %d len %d, want %d %d %d", v.Seq(), v.Epoch(), v.PieceLen(), commitSeq, epoch, pieceLen)
		}
		if len(v.Plans()) != int(planCount) || len(v.Session()) != int(sessionLen) {
			t.Fatalf("validated %d plans and %d session bytes, want %d and %d", len(v.Plans()), len(v.Session()), planCount, sessionLen)
		}
		sum := uint64(0)
		for i, p := range v.Plans() {
			if p != d.Plans[i] || p.Len == 0 || p.Dst+p.Len < p.Dst {
				t.Fatalf("validated plans[%d] = %+v (Desc has %+v)", i, p, d.Plans[i])
			}
			sum += p.Len
		}
		if sum != pieceLen || !bytes.Equal(v.Session(), d.Session[:sessionLen]) {
			t.Fatalf("validated plans sum to %d for piece len %d; session %q", sum, pieceLen, v.Session())
		}
	})
}

func TestValidateDescParts(t *testing.T) {
	runDescRuleCases(t, ErrDescParts, []descRuleCase{
		{"more parts than the ready line holds", func(d *Desc) { d.Parts = MaxParts + 1 }, DescError{Kind: DescParts, Field: "parts", Plan: -1, Value: MaxParts + 1, Want: MaxParts}},
		{"a first part of no entry", func(d *Desc) { d.Parts = 2; d.PartEnds[0] = 0 }, DescError{Kind: DescParts, Field: "part_ends", Plan: 0, Value: 0, Want: 3}},
		{"a last part of no entry", func(d *Desc) { d.Parts = 2; d.PartEnds[0] = 3 }, DescError{Kind: DescParts, Field: "part_ends", Plan: 0, Value: 3, Want: 3}},
		{"ends that do not increase", func(d *Desc) { d.Parts = 3; d.PartEnds[0], d.PartEnds[1] = 2, 2 }, DescError{Kind: DescParts, Field: "part_ends", Plan: 1, Value: 2, Want: 3}},
		{"an end past the plan", func(d *Desc) { d.Parts = 2; d.PartEnds[0] = 1 << 31 }, DescError{Kind: DescParts, Field: "part_ends", Plan: 0, Value: 1 << 31, Want: 3}},
	})
}

// Ends beyond the parts in use are not read: a Desc of two parts may hold
// anything in PartEnds[1:], and one of 0 or 1 part in all of them.
func TestValidateDescPartsAccepts(t *testing.T) {
	for _, tt := range []struct {
		name  string
		parts uint32
		ends  [MaxParts - 1]uint32
		want  []uint32
	}{
		{"0 parts", 0, [MaxParts - 1]uint32{9, 9}, nil},
		{"1 part", 1, [MaxParts - 1]uint32{9, 9}, nil},
		{"2 parts", 2, [MaxParts - 1]uint32{2, 0, 7}, []uint32{2}},
		{"3 parts, one entry each", 3, [MaxParts - 1]uint32{1, 2}, []uint32{1, 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := validDesc(t)
			d.Parts, d.PartEnds = tt.parts, tt.ends
			var vd ValidDesc
			if err := ValidateDesc(d, testExpect, &vd); err != nil {
				t.Fatal(err)
			}
			if got := vd.PartEnds(); !slicesEqual(got, tt.want) {
				t.Fatalf("PartEnds = %v, want %v", got, tt.want)
			}
		})
	}
}

func slicesEqual(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestFillParts(t *testing.T) {
	var d Desc
	if err := d.Fill(testEpoch, testSession, testPlans, testPieceLen(), []uint32{1, 2}); err != nil {
		t.Fatal(err)
	}
	if d.Parts != 3 || d.PartEnds != [MaxParts - 1]uint32{1, 2} {
		t.Fatalf("parts %d, ends %v; want 3, [1 2 0 ...]", d.Parts, d.PartEnds)
	}
	if err := d.Fill(testEpoch, testSession, testPlans, testPieceLen(), nil); err != nil || d.Parts != 1 || d.PartEnds != [MaxParts - 1]uint32{} {
		t.Fatalf("a Fill of one part after one of three: %v, parts %d, ends %v", err, d.Parts, d.PartEnds)
	}
	for _, ends := range [][]uint32{{0}, {3}, {2, 1}, {1, 1}, {1, 2, 3, 4, 5, 6, 7, 8}} {
		var e Desc
		if err := e.Fill(testEpoch, testSession, testPlans, testPieceLen(), ends); !errors.Is(err, ErrDescParts) {
			t.Errorf("Fill with part ends %v = %v, want %v", ends, err, ErrDescParts)
		}
		if e.Epoch != 0 || e.Parts != 0 {
			t.Errorf("a rejected Fill (ends %v) wrote to the Desc", ends)
		}
	}
}

func TestCutParts(t *testing.T) {
	even := func(n int, l uint64) []PlanEntry {
		ps := make([]PlanEntry, n)
		for i := range ps {
			ps[i] = PlanEntry{Dst: uint64(i) * l, Len: l}
		}
		return ps
	}
	sum := func(ps []PlanEntry) uint64 {
		var n uint64
		for _, p := range ps {
			n += p.Len
		}
		return n
	}
	uneven := []PlanEntry{{Len: 100}, {Len: 900}, {Len: 100}, {Len: 100}, {Len: 100}, {Len: 700}}
	for _, tt := range []struct {
		name  string
		plans []PlanEntry
		parts int
		want  []uint32
	}{
		{"256 blocks in 8", even(256, 16<<10), 8, []uint32{32, 64, 96, 128, 160, 192, 224}},
		{"256 blocks in 4", even(256, 16<<10), 4, []uint32{64, 128, 192}},
		{"more parts than the ready line", even(256, 16<<10), 16, []uint32{32, 64, 96, 128, 160, 192, 224}},
		{"one part", even(256, 16<<10), 1, nil},
		{"one entry", even(1, 8<<20), 8, nil},
		{"fewer entries than parts", even(3, 1<<20), 8, []uint32{1, 2}},
		// 2000 bytes in 4: a part ends with the entry that reaches 500,
		// 1000, 1500; the 900-byte entry reaches both 500 and 1000, and
		// only the last entry reaches 1500: two parts.
		{"an entry longer than a part", uneven, 4, []uint32{2}},
		{"in 8", uneven, 8, []uint32{2, 5}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := CutParts(nil, tt.plans, sum(tt.plans), tt.parts)
			if !slicesEqual(got, tt.want) {
				t.Fatalf("CutParts = %v, want %v", got, tt.want)
			}
			var d Desc
			if err := d.Fill(testEpoch, testSession, tt.plans, sum(tt.plans), got); err != nil {
				t.Fatalf("Fill refuses the cuts: %v", err)
			}
		})
	}
	buf := make([]uint32, 0, MaxParts)
	plans := even(4096, 2<<10)
	if n := testing.AllocsPerRun(100, func() { buf = CutParts(buf[:0], plans, 8<<20, MaxParts) }); n != 0 {
		t.Fatalf("CutParts allocated %v times a call", n)
	}
}
