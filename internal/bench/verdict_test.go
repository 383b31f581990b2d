// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/staging"
)

// ringPhase is three ranks on three rails, each writing n bytes to the
// target on the next rail (cross-rail), all relayed and forwarded by the
// rank on the target's rail, and verified.
func ringPhase(n uint64) (*layout, *phaseResult) {
	l := &layout{Ranks: 3, Rails: []string{"rail0", "rail1", "rail2"}}
	p := &phaseResult{verified: true}
	for r := range 3 {
		next := (r + 1) % 3
		l.Transfers = append(l.Transfers, transfer{Rank: r, Target: next, Len: n})
		rr := rankResult{Rank: r, Bytes: n, StartNs: 1, EndNs: 2}
		rr.Counters.RelayedBytes = n
		p.ranks = append(p.ranks, rr)
		p.busy = append(p.busy, busyWindow{forwardedBytes: n})
	}
	return l, p
}

func TestVerdict(t *testing.T) {
	const n = 1 << 20
	cases := []struct {
		name  string
		spoil func(*layout, *phaseResult)
		want  []string // each a part of the FAIL line; none: PASS
	}{
		{"all relayed by the right peers", func(*layout, *phaseResult) {}, nil},
		{"twice the same transfer", func(_ *layout, p *phaseResult) {
			for k := range p.ranks {
				p.ranks[k].Counters.RelayedBytes *= 2
				p.busy[k].forwardedBytes *= 2
			}
		}, nil},
		{"credit timeout", func(_ *layout, p *phaseResult) {
			p.ranks[1].Counters.RelayedBytes -= 256 << 10
			p.ranks[1].Counters.FallbackBytes = 256 << 10
			p.ranks[1].Counters.FallbackBytesByReason[staging.FallbackCreditTimeout] = 256 << 10
			p.busy[2].forwardedBytes -= 256 << 10
		}, []string{"256KiB of 3MiB went direct", "credit timeout (credit_timeout)"}},
		{"wrong peer", func(_ *layout, p *phaseResult) {
			p.busy[0].forwardedBytes, p.busy[1].forwardedBytes = 2*n, 0
		}, []string{"rank 0 (rail0) forwarded 2MiB where the writes to its rail were 1MiB", "rank 1 (rail1) forwarded 0"}},
		{"failed", func(_ *layout, p *phaseResult) {
			p.ranks[2].Failed, p.ranks[2].FirstError = 3, "hop: refused"
		}, []string{"3 writes failed (rank 2: hop: refused)"}},
		{"not verified", func(_ *layout, p *phaseResult) {
			p.verified, p.verifyErr = false, "target 1: byte 7 differs"
		}, []string{"did not verify every byte: target 1: byte 7 differs"}},
		{"nothing relayed", func(_ *layout, p *phaseResult) {
			for k := range p.ranks {
				p.ranks[k].Counters.RelayedBytes = 0
				p.busy[k].forwardedBytes = 0
			}
		}, []string{"0 were relayed where 3MiB had to cross rails"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, p := ringPhase(n)
			c.spoil(l, p)
			rows := []Row{{Scenario: "main", Problems: append([]string{}, phaseProblems(l, p)...)}, {Scenario: "baseline"}}
			pass, line := Verdict(rows)
			if pass != (c.want == nil) {
				t.Fatalf("pass = %v, want %v: %s", pass, c.want == nil, line)
			}
			if pass && !strings.HasPrefix(line, "PASS: ") || !pass && !strings.HasPrefix(line, "FAIL: ") {
				t.Errorf("line %q does not start with its outcome", line)
			}
			for _, w := range c.want {
				if !strings.Contains(line, w) {
					t.Errorf("line %q lacks %q", line, w)
				}
			}
		})
	}
	if pass, line := Verdict([]Row{{Scenario: "baseline"}}); pass {
		t.Errorf("rows without a judged scenario passed: %s", line)
	}
}
