// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
)

// RailMapGetter reads a node's PxnRailMap.
type RailMapGetter interface {
	GetRailMap(ctx context.Context, node string) (*pxnv1alpha1.PxnRailMap, error)
}

// RelayResult is what a cross-rail write on the node showed: the bytes
// written, the bytes a relay on the target's rail carried, whether the
// targets held exactly what was written, and a note when something failed.
type RelayResult struct {
	Bytes, Relayed uint64
	Failed         int
	Verified       bool
	Note           string
}

// RelayChecker runs a cross-rail write on the node, through PXN.
type RelayChecker interface {
	CheckRelay(ctx context.Context) (RelayResult, error)
}

// Verdict is a node's validation: whether it passed, and the one line a
// person reads.
type Verdict struct {
	Node string
	Pass bool
	Line string
}

// VerifyNode judges a node: its PxnRailMap must be Ready and Consistent,
// and a cross-rail write there must be carried by a relay and arrive
// verified. The write runs even when the map fails, so that the line says
// everything that is wrong.
func VerifyNode(ctx context.Context, node string, maps RailMapGetter, relay RelayChecker) Verdict {
	var good, bad []string
	m, err := maps.GetRailMap(ctx, node)
	switch {
	case err != nil:
		bad = append(bad, fmt.Sprintf("PxnRailMap %s: %v", node, err))
	default:
		ok := true
		for _, typ := range []string{pxnv1alpha1.ConditionReady, pxnv1alpha1.ConditionConsistent} {
			c := meta.FindStatusCondition(m.Status.Conditions, typ)
			switch {
			case c == nil:
				ok = false
				bad = append(bad, fmt.Sprintf("rail map has no %s condition", typ))
			case c.Status != "True":
				ok = false
				bad = append(bad, fmt.Sprintf("rail map %s=%s (%s: %s)", typ, c.Status, c.Reason, c.Message))
			}
		}
		if ok {
			good = append(good, fmt.Sprintf("rail map Ready and Consistent (%d rails)", m.Status.Rails))
		}
	}
	r, err := relay.CheckRelay(ctx)
	switch {
	case err != nil:
		bad = append(bad, fmt.Sprintf("cross-rail write: %v", err))
	case !r.Verified || r.Failed > 0:
		bad = append(bad, fmt.Sprintf("cross-rail write of %s: %d tasks failed, verified %v (%s)", mib(r.Bytes), r.Failed, r.Verified, r.Note))
	case r.Relayed == 0:
		bad = append(bad, fmt.Sprintf("cross-rail write of %s arrived verified but no relay carried it (%s)", mib(r.Bytes), r.Note))
	default:
		good = append(good, fmt.Sprintf("cross-rail write of %s relayed %s and arrived verified", mib(r.Bytes), mib(r.Relayed)))
	}
	v := Verdict{Node: node, Pass: len(bad) == 0}
	if v.Pass {
		v.Line = fmt.Sprintf("pxn node %s: PASS: %s", node, strings.Join(good, "; "))
	} else {
		v.Line = fmt.Sprintf("pxn node %s: FAIL: %s", node, strings.Join(bad, "; "))
	}
	return v
}

func mib(n uint64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d B", n)
}

// BenchRelay runs pxn-bench's cross-rail pattern on the host path with two
// ranks (in the pod's own registry folder, which the device plugin mounts)
// and reads its first row. The agent does not link the engine: it runs
// the benchmark binary the image ships.
type BenchRelay struct {
	// Bench is the pxn-bench binary.
	Bench string
	// Bytes each rank writes, as pxn-bench's --bytes reads it.
	Bytes string
	// Dir is a writable folder for the rows.
	Dir string
}

// CheckRelay runs the benchmark and reads its first row (the PXN
// transfer). Its output goes into the error when it fails.
func (b BenchRelay) CheckRelay(ctx context.Context) (RelayResult, error) {
	rows := filepath.Join(b.Dir, "pxn-verify-rows.json")
	cmd := exec.CommandContext(ctx, b.Bench, "run", "--device=host", "--ranks=2", "--pattern=cross-rail", "--bytes="+b.Bytes, "--json="+rows)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	data, err := os.ReadFile(rows)
	if err != nil {
		if runErr != nil {
			return RelayResult{}, fmt.Errorf("%s: %w: %s", b.Bench, runErr, lastLine(out.String()))
		}
		return RelayResult{}, fmt.Errorf("%s wrote no rows: %w", b.Bench, err)
	}
	var got []struct {
		Bytes    uint64 `json:"bytes"`
		Relayed  uint64 `json:"relayed_bytes"`
		Failed   int    `json:"failed_tasks"`
		Verified bool   `json:"verified"`
		Note     string `json:"note"`
	}
	if err := json.Unmarshal(data, &got); err != nil || len(got) == 0 {
		return RelayResult{}, fmt.Errorf("%s: rows %s: %v", b.Bench, rows, err)
	}
	r := got[0]
	return RelayResult{Bytes: r.Bytes, Relayed: r.Relayed, Failed: r.Failed, Verified: r.Verified, Note: r.Note}, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
