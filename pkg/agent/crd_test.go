// SPDX-License-Identifier: Apache-2.0

package agent_test

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
)

func TestCRDValidation(t *testing.T) {
	c := newClient(t, controlPlane(t))
	ctx := context.Background()
	valid := func(name string) *pxnv1alpha1.PxnRailMap {
		return &pxnv1alpha1.PxnRailMap{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       pxnv1alpha1.PxnRailMapSpec{NodeName: name},
		}
	}
	tests := []struct {
		name    string
		status  func(*pxnv1alpha1.PxnRailMapStatus)
		wantErr string // empty: accepted
	}{
		{name: "valid", status: func(s *pxnv1alpha1.PxnRailMapStatus) {
			s.Rails, s.Strategy = 1, "pci-order"
			s.GPUs = []pxnv1alpha1.GPU{{Index: 0, PCIBusID: "0000:18:00.0", NUMANode: -1, HCA: "mlx5_0", Distance: "PIX", Rail: "rail0"}}
			s.HCAs = []pxnv1alpha1.HCA{{Name: "mlx5_0", PCIBusID: "0000:19:00.0", LinkLayer: "InfiniBand", State: "ACTIVE", Port: 1}}
			s.RailMap = map[string]string{"mlx5_0": "rail0"}
		}},
		{name: "bad distance", status: func(s *pxnv1alpha1.PxnRailMapStatus) {
			s.GPUs = []pxnv1alpha1.GPU{{PCIBusID: "0000:18:00.0", Distance: "FAR"}}
		}, wantErr: "status.gpus[0].distance"},
		{name: "negative rails", status: func(s *pxnv1alpha1.PxnRailMapStatus) { s.Rails = -1 }, wantErr: "status.rails"},
		{name: "unknown strategy", status: func(s *pxnv1alpha1.PxnRailMapStatus) { s.Strategy = "random" }, wantErr: "status.strategy"},
		{name: "negative GPU index", status: func(s *pxnv1alpha1.PxnRailMapStatus) {
			s.GPUs = []pxnv1alpha1.GPU{{Index: -2, PCIBusID: "0000:18:00.0"}}
		}, wantErr: "status.gpus[0].index"},
		{name: "subnet rail names", status: func(s *pxnv1alpha1.PxnRailMapStatus) {
			s.Rails, s.Strategy = 2, "subnet"
			s.HCAs = []pxnv1alpha1.HCA{{Name: "mlx5_0", Rail: "10.1.0.0/24"}, {Name: "mlx5_2", Rail: "fe80:0000:0000:0002"}}
		}},
		{name: "rail name with a space", status: func(s *pxnv1alpha1.PxnRailMapStatus) {
			s.HCAs = []pxnv1alpha1.HCA{{Name: "mlx5_0", Rail: "rail 0"}}
		}, wantErr: "status.hcas[0].rail"},
		{name: "rail name longer than the engine takes", status: func(s *pxnv1alpha1.PxnRailMapStatus) {
			s.GPUs = []pxnv1alpha1.GPU{{PCIBusID: "0000:18:00.0", Rail: strings.Repeat("r", 49)}}
		}, wantErr: "status.gpus[0].rail"},
		{name: "HCA name too long", status: func(s *pxnv1alpha1.PxnRailMapStatus) {
			s.HCAs = []pxnv1alpha1.HCA{{Name: strings.Repeat("m", 65)}}
		}, wantErr: "status.hcas[0].name"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := valid("crd-check-" + string(rune('a'+i)))
			if err := c.Create(ctx, m); err != nil {
				t.Fatalf("create: %v", err)
			}
			t.Cleanup(func() { _ = c.Delete(context.Background(), m) })
			tc.status(&m.Status)
			err := c.Status().Update(ctx, m)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("valid status rejected: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("invalid status accepted")
			case tc.wantErr != "" && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want Invalid naming %s", err, tc.wantErr)
			}
		})
	}

	t.Run("spec needs a node name", func(t *testing.T) {
		m := valid("crd-check-spec")
		m.Spec.NodeName = ""
		err := c.Create(ctx, m)
		if err == nil {
			_ = c.Delete(ctx, m)
		}
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.nodeName") {
			t.Fatalf("error %v, want Invalid naming spec.nodeName", err)
		}
	})

	t.Run("short name and cluster scope", func(t *testing.T) {
		out := kubectl(t, "api-resources", "--api-group=pxn.io", "-o", "wide")
		for _, want := range []string{"pxnrailmaps", "prm", "pxn.io/v1alpha1", "false", "PxnRailMap"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl api-resources lacks %q:\n%s", want, out)
			}
		}
	})
}
