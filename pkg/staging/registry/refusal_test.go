// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/contract"
)

func TestRefusalRecord(t *testing.T) {
	root := t.TempDir()
	long := strings.Repeat("x", 1000)
	in := []Refusal{
		{Pid: 42, Variables: []RefusedVariable{
			{Name: contract.EnvRailMap, Value: `{"mlx5_0":`, Reason: "unexpected end of JSON input"},
			{Name: contract.EnvGroupID, Reason: "required"},
		}},
		{Pid: 7, Variables: []RefusedVariable{{Name: contract.EnvInflightDepth, Value: long, Reason: "out of range 1..64"}}},
	}
	for _, r := range in {
		if err := WriteRefusal(root, r); err != nil {
			t.Fatalf("WriteRefusal(%d): %v", r.Pid, err)
		}
	}
	// A rewrite of the same pid replaces its record.
	if err := WriteRefusal(root, in[0]); err != nil {
		t.Fatal(err)
	}
	got, bad, err := ReadRefusals(root)
	if err != nil || bad != 0 {
		t.Fatalf("ReadRefusals = %d bad, %v", bad, err)
	}
	want := []Refusal{in[1], in[0]}
	want[0].Variables = []RefusedVariable{{Name: contract.EnvInflightDepth, Value: long[:maxRefusedValue], Reason: "out of range 1..64"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadRefusals = %+v, want %+v", got, want)
	}
	st, err := os.Stat(filepath.Join(root, RefusalPrefix+"42"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("record mode = %v, %v; want 0600", st, err)
	}
	if err := RemoveRefusal(root, 42); err != nil {
		t.Fatal(err)
	}
	if err := RemoveRefusal(root, 42); err != nil {
		t.Errorf("RemoveRefusal of no record: %v", err)
	}
	if got, _, _ := ReadRefusals(root); len(got) != 1 || got[0].Pid != 7 {
		t.Errorf("after RemoveRefusal(42): %+v, want only pid 7", got)
	}
	if err := WriteRefusal(root, Refusal{Pid: 0}); err == nil {
		t.Error("WriteRefusal of pid 0 succeeded")
	}
	if err := WriteRefusal(filepath.Join(root, "missing"), in[0]); err == nil {
		t.Error("WriteRefusal into a missing root succeeded")
	}
}

// The records are read from a folder the workload writes: whatever is not
// a canonical record is left out and counted, never trusted.
func TestReadRefusalsHostile(t *testing.T) {
	root := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	good := `{"pid":5,"variables":[{"name":"MC_PXN_RAIL_MAP","value":"x","reason":"bad"}]}`
	write(RefusalPrefix+"5", good)
	write(RefusalPrefix+"6", `{"pid":6,"variables":[{"name":"PATH","value":"x","reason":"bad"}]}`)
	write(RefusalPrefix+"8", `{"pid":9,"variables":[{"name":"MC_PXN_RAIL_MAP","value":"x","reason":"bad"}]}`)
	write(RefusalPrefix+"10", `{"pid":10,"variables":[]}`)
	write(RefusalPrefix+"11", `not json`)
	write(RefusalPrefix+"12", `{"pid":12,"extra":1,"variables":[{"name":"MC_PXN_RAIL_MAP"}]}`)
	write(RefusalPrefix+"13", strings.Repeat(" ", maxRefusalBytes+1)+good)
	write(RefusalPrefix+"013", strings.Replace(good, `"pid":5`, `"pid":13`, 1))
	write(RefusalPrefix+"x", good)
	write("unrelated", good)
	if err := os.Symlink(filepath.Join(root, RefusalPrefix+"5"), filepath.Join(root, RefusalPrefix+"14")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, RefusalPrefix+"15"), 0o700); err != nil {
		t.Fatal(err)
	}
	got, bad, err := ReadRefusals(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Pid != 5 {
		t.Errorf("ReadRefusals = %+v, want only pid 5", got)
	}
	if bad != 10 {
		t.Errorf("bad = %d, want 10 (every refusal-named entry but pid 5)", bad)
	}
	if _, _, err := ReadRefusals(filepath.Join(root, "missing")); err == nil {
		t.Error("ReadRefusals of a missing root succeeded")
	}
}

func TestReadRefusalsBounded(t *testing.T) {
	root := t.TempDir()
	for pid := 1; pid <= MaxRefusalsPerRoot+3; pid++ {
		if err := WriteRefusal(root, Refusal{Pid: pid, Variables: []RefusedVariable{{Name: contract.EnvEnable, Value: "yes"}}}); err != nil {
			t.Fatal(err)
		}
	}
	got, bad, err := ReadRefusals(root)
	if err != nil || len(got) != MaxRefusalsPerRoot || bad != 3 {
		t.Errorf("ReadRefusals = %d records, %d bad, %v; want %d, 3", len(got), bad, err, MaxRefusalsPerRoot)
	}
}
