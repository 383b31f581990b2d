// SPDX-License-Identifier: Apache-2.0

package chart_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/pxn-project/pxn/internal/testtools"
)

// TestChartCRDsMatchGenerated fails when charts/pxn/crds differs from the
// CRDs controller-gen writes to config/crd.
func TestChartCRDsMatchGenerated(t *testing.T) {
	generatedDir := filepath.Join(testtools.RepoRoot(), "config", "crd")
	generated, err := filepath.Glob(filepath.Join(generatedDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(generated) == 0 {
		t.Fatalf("%s holds no generated CRDs (hack/generate.sh writes them, and they are committed)", generatedDir)
	}
	chartCRDs, err := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	base := func(paths []string) []string {
		var s []string
		for _, p := range paths {
			s = append(s, filepath.Base(p))
		}
		return s
	}
	if !slices.Equal(base(generated), base(chartCRDs)) {
		t.Fatalf("chart CRDs %v differ from config/crd %v: run hack/sync-chart-crds.sh", base(chartCRDs), base(generated))
	}
	for _, p := range generated {
		want, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(chartDir, "crds", filepath.Base(p)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("charts/pxn/crds/%s differs from config/crd: run hack/sync-chart-crds.sh", filepath.Base(p))
		}
	}
}

// TestChartCRDShape checks the fields the chart, the docs and kubectl users
// rely on: the kind's names, scope and status subresource.
func TestChartCRDShape(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "crds", "pxn.io_pxnrailmaps.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatalf("decode CRD: %v", err)
	}
	if crd.Name != "pxnrailmaps.pxn.io" || crd.Spec.Group != "pxn.io" || crd.Spec.Names.Kind != "PxnRailMap" ||
		crd.Spec.Scope != apiextensionsv1.ClusterScoped || !slices.Contains(crd.Spec.Names.ShortNames, "prm") {
		t.Errorf("CRD %s: group %s kind %s scope %s short names %v", crd.Name, crd.Spec.Group, crd.Spec.Names.Kind,
			crd.Spec.Scope, crd.Spec.Names.ShortNames)
	}
	var served bool
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1alpha1" && v.Served && v.Storage {
			served = true
			if v.Subresources == nil || v.Subresources.Status == nil {
				t.Errorf("v1alpha1 has no status subresource")
			}
		}
	}
	if !served {
		t.Errorf("v1alpha1 is not the served storage version")
	}
}
