// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"strings"

	"github.com/pxn-project/pxn/pkg/staging"
)

// fallbackWords says in words why a Piece went direct, by reason.
var fallbackWords = [staging.FallbackReasons]string{
	staging.FallbackCreditTimeout: "the relay's staging ring stayed full longer than the credit timeout",
	staging.FallbackRelayStale:    "the relay's heartbeat was late",
	staging.FallbackRelayGone:     "the relay had left",
	staging.FallbackLaneBroken:    "the lane to the relay broke (a copy or doorbell failed)",
	staging.FallbackSourceEvent:   "the source was not ready in time",
	staging.FallbackNoLane:        "the relay had no free lane",
	staging.FallbackOther:         "another reason",
}

// phaseProblems judges an engine phase the way a reader of its table would:
// nothing failed, every target verified every byte, every byte that had to
// cross rails was relayed (none fell back), and each rank forwarded exactly
// the bytes of the transfers whose target is on its rail, so that every
// byte went through the right peer. It returns what did not hold, in words;
// none when all did.
func phaseProblems(l *layout, pxn *phaseResult) []string {
	var out []string
	bytes, _, failed := pxn.span()
	if failed > 0 {
		out = append(out, fmt.Sprintf("%d writes failed (%s)", failed, pxn.firstError()))
	}
	if !pxn.verified {
		why := pxn.verifyErr
		if why == "" {
			why = "no verification ran"
		}
		out = append(out, "the targets did not verify every byte: "+why)
	}
	var relayed, fallback uint64
	for _, r := range pxn.ranks {
		relayed += r.Counters.RelayedBytes
		fallback += r.Counters.FallbackBytes
	}
	if fallback > 0 {
		out = append(out, fmt.Sprintf("%s of %s went direct instead of through a relay: %s", sizeString(fallback), sizeString(bytes), fallbackInWords(pxn.ranks)))
	}
	expect := make([]uint64, l.Ranks)
	var cross uint64
	for _, t := range l.Transfers {
		if t.Target < len(l.Rails) && l.Rails[t.Rank] != l.Rails[t.Target] {
			expect[t.Target] += t.Len
			cross += t.Len
		}
	}
	if cross == 0 || relayed%cross != 0 || relayed == 0 {
		if fallback == 0 && relayed != cross {
			out = append(out, fmt.Sprintf("%s were relayed where %s had to cross rails", sizeString(relayed), sizeString(cross)))
		}
		return out
	}
	// A run that repeats its transfer relays the same bytes n times.
	n := relayed / cross
	if len(pxn.busy) != l.Ranks {
		return append(out, fmt.Sprintf("the forwarded bytes of %d ranks were not read (%d were)", l.Ranks, len(pxn.busy)))
	}
	for k, b := range pxn.busy {
		if want := n * expect[k]; b.forwardedBytes != want {
			out = append(out, fmt.Sprintf("rank %d (%s) forwarded %s where the writes to its rail were %s", k, l.Rails[k], sizeString(b.forwardedBytes), sizeString(want)))
		}
	}
	return out
}

// fallbackInWords names, for every reason any rank counted, the bytes and
// why, in words.
func fallbackInWords(ranks []rankResult) string {
	bytes, _ := fallbackByReason(ranks)
	var parts []string
	for i, b := range bytes {
		if b > 0 {
			parts = append(parts, fmt.Sprintf("%s because %s (%s)", sizeString(b), fallbackWords[i], staging.FallbackReasonName(i)))
		}
	}
	if len(parts) == 0 {
		return "no reason counted"
	}
	return strings.Join(parts, "; ")
}

// Verdict is a run's outcome in one line: PASS when no scenario's engine
// phase had a problem (see phaseProblems), else FAIL and every problem.
func Verdict(rows []Row) (pass bool, line string) {
	var all []string
	judged := 0
	for _, r := range rows {
		if r.Problems == nil {
			continue
		}
		judged++
		all = append(all, r.Problems...)
	}
	switch {
	case judged == 0:
		return false, "FAIL: no scenario was judged"
	case len(all) == 0:
		return true, "PASS: every cross-rail byte was relayed through the peer on its target's rail, nothing fell back or failed, and the targets verified every byte"
	}
	return false, "FAIL: " + strings.Join(all, "; ")
}
