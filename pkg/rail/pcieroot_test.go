// SPDX-License-Identifier: Apache-2.0

package rail_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/pxn-project/pxn/pkg/rail"
)

// TestPCIeRootIsKubernetesStandard checks every GPU's and HCA's PCIe root
// against what Kubernetes' deviceattribute helper reads for the same bus ID
// from the same sysfs, so that a matchAttribute on
// resource.kubernetes.io/pcieRoot pairs PXN's devices with another driver's.
func TestPCIeRootIsKubernetesStandard(t *testing.T) {
	root := filepath.Join("testdata", "sysfs", "hgx-8gpu")
	l, err := rail.Discover(t.Context(), rail.Options{FS: os.DirFS(root), NodeRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	sys, err := fs.Sub(os.DirFS(root), "sys")
	if err != nil {
		t.Fatal(err)
	}
	check := func(what, busID, got string) {
		t.Helper()
		want, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(busID, deviceattribute.WithFS(sys.(fs.ReadLinkFS)))
		if err != nil {
			t.Fatalf("%s %s: %v", what, busID, err)
		}
		if got == "" || got != *want.Value.StringValue {
			t.Errorf("%s %s: PCIe root %q, Kubernetes reads %q", what, busID, got, *want.Value.StringValue)
		}
	}
	if len(l.HCAs) == 0 || len(l.GPUs) == 0 {
		t.Fatalf("%d HCAs, %d GPUs", len(l.HCAs), len(l.GPUs))
	}
	for _, h := range l.HCAs {
		check("HCA "+h.Name, h.PCIBusID, h.PCIeRoot)
	}
	for _, g := range l.GPUs {
		check("GPU", g.PCIBusID, g.PCIeRoot)
	}
}
