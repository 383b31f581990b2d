// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/pkg/agent"
)

type fixedMap struct {
	m   *pxnv1alpha1.PxnRailMap
	err error
}

func (f fixedMap) GetRailMap(context.Context, string) (*pxnv1alpha1.PxnRailMap, error) {
	return f.m, f.err
}

type fixedRelay struct {
	r   agent.RelayResult
	err error
}

func (f fixedRelay) CheckRelay(context.Context) (agent.RelayResult, error) { return f.r, f.err }

func railMap(ready, consistent metav1.ConditionStatus) *pxnv1alpha1.PxnRailMap {
	m := &pxnv1alpha1.PxnRailMap{}
	m.Status.Rails = 8
	m.Status.Conditions = []metav1.Condition{
		{Type: pxnv1alpha1.ConditionReady, Status: ready, Reason: "PortsNotActive", Message: "not active: mlx5_4 port 1 DOWN"},
		{Type: pxnv1alpha1.ConditionConsistent, Status: consistent, Reason: "RailsConflict", Message: "HCA mlx5_0 differs"},
	}
	return m
}

func TestVerifyNode(t *testing.T) {
	good := agent.RelayResult{Bytes: 32 << 20, Relayed: 32 << 20, Verified: true}
	for _, tc := range []struct {
		name  string
		maps  fixedMap
		relay fixedRelay
		pass  bool
		line  string
	}{
		{"pass", fixedMap{m: railMap("True", "True")}, fixedRelay{r: good}, true,
			"pxn node n1: PASS: rail map Ready and Consistent (8 rails); cross-rail write of 32 MiB relayed 32 MiB and arrived verified"},
		{"not ready", fixedMap{m: railMap("False", "True")}, fixedRelay{r: good}, false,
			"pxn node n1: FAIL: rail map Ready=False (PortsNotActive: not active: mlx5_4 port 1 DOWN)"},
		{"not consistent", fixedMap{m: railMap("True", "False")}, fixedRelay{r: good}, false,
			"pxn node n1: FAIL: rail map Consistent=False (RailsConflict: HCA mlx5_0 differs)"},
		{"no map", fixedMap{err: errors.New(`pxnrailmaps "n1" not found`)}, fixedRelay{r: good}, false,
			`pxn node n1: FAIL: PxnRailMap n1: pxnrailmaps "n1" not found`},
		{"nothing relayed", fixedMap{m: railMap("True", "True")}, fixedRelay{r: agent.RelayResult{Bytes: 32 << 20, Verified: true, Note: "not every rank found its relay in time"}}, false,
			"pxn node n1: FAIL: cross-rail write of 32 MiB arrived verified but no relay carried it (not every rank found its relay in time)"},
		{"corrupt", fixedMap{m: railMap("True", "True")}, fixedRelay{r: agent.RelayResult{Bytes: 32 << 20, Relayed: 32 << 20, Note: "target 1: byte 7 differs"}}, false,
			"pxn node n1: FAIL: cross-rail write of 32 MiB: 0 tasks failed, verified false (target 1: byte 7 differs)"},
		{"bench failed, map bad too", fixedMap{m: railMap("False", "False")}, fixedRelay{err: errors.New("pxn-bench: exit status 1")}, false,
			"pxn node n1: FAIL: rail map Ready=False (PortsNotActive: not active: mlx5_4 port 1 DOWN); rail map Consistent=False (RailsConflict: HCA mlx5_0 differs); cross-rail write: pxn-bench: exit status 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := agent.VerifyNode(context.Background(), "n1", tc.maps, tc.relay)
			if v.Pass != tc.pass || v.Node != "n1" || !strings.HasPrefix(v.Line, tc.line) {
				t.Errorf("VerifyNode = %+v\nwant pass %v, line %q", v, tc.pass, tc.line)
			}
			if strings.Contains(v.Line, "\n") {
				t.Errorf("the verdict spans lines: %q", v.Line)
			}
		})
	}
}

// BenchRelay reads the rows of a real process standing in for pxn-bench,
// and reports a benchmark that fails or writes nothing.
func TestBenchRelay(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The stand-in checks the arguments it is given and writes its rows to --json.
	rows := script("rows", `for a; do case $a in --json=*) out=${a#--json=};; esac; done
[ "$*" = "run --device=host --ranks=2 --pattern=cross-rail --bytes=4MiB --json=$out" ] || { echo "args: $*"; exit 2; }
echo '[{"bytes":8388608,"relayed_bytes":4194304,"failed_tasks":0,"verified":true},{"bytes":1}]' >"$out"
`)
	r, err := agent.BenchRelay{Bench: rows, Bytes: "4MiB", Dir: t.TempDir()}.CheckRelay(context.Background())
	if err != nil || r != (agent.RelayResult{Bytes: 8 << 20, Relayed: 4 << 20, Verified: true}) {
		t.Errorf("CheckRelay = %+v, %v", r, err)
	}
	fails := script("fails", "echo first\necho 'pxn-bench: no registry root'\nexit 1\n")
	if _, err := (agent.BenchRelay{Bench: fails, Bytes: "4MiB", Dir: t.TempDir()}).CheckRelay(context.Background()); err == nil ||
		!strings.Contains(err.Error(), "no registry root") {
		t.Errorf("a failing benchmark: %v, want its last line", err)
	}
	silent := script("silent", "exit 0\n")
	if _, err := (agent.BenchRelay{Bench: silent, Bytes: "4MiB", Dir: t.TempDir()}).CheckRelay(context.Background()); err == nil {
		t.Error("a benchmark that wrote no rows passed")
	}
}
