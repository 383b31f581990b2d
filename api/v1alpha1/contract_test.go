// SPDX-License-Identifier: Apache-2.0

package v1alpha1_test

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/contract"
)

// TestCRDRailNamesFollowTheContract: every rail field of the generated CRD
// accepts exactly the contract's rail names, so the API server stores only
// what the engine would take.
func TestCRDRailNamesFollowTheContract(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testtools.RepoRoot(), "config", "crd", "pxn.io_pxnrailmaps.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	var rails []map[string]any
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if props, ok := v["properties"].(map[string]any); ok {
				if r, ok := props["rail"].(map[string]any); ok {
					r["path"] = path + ".rail"
					rails = append(rails, r)
				}
			}
			for k, c := range v {
				walk(path+"."+k, c)
			}
		case []any:
			for _, c := range v {
				walk(path+"[]", c)
			}
		}
	}
	walk("", crd)
	if len(rails) != 2 {
		t.Fatalf("found %d rail fields in the CRD, want 2 (gpus[].rail and hcas[].rail)", len(rails))
	}
	for _, r := range rails {
		if r["pattern"] != contract.RailNamePattern {
			t.Errorf("%s: pattern %v, want contract.RailNamePattern %s", r["path"], r["pattern"], contract.RailNamePattern)
		}
		if r["maxLength"] != float64(contract.MaxRailName) {
			t.Errorf("%s: maxLength %v, want contract.MaxRailName %d", r["path"], r["maxLength"], contract.MaxRailName)
		}
	}
}
