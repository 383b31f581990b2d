// SPDX-License-Identifier: Apache-2.0

package chart_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/pxn-project/pxn/internal/testtools"
)

// serviceMonitorStub stands in for the Prometheus Operator's CRD so that the
// rendered ServiceMonitor can be dry-run; it checks the object's envelope, not
// its spec.
const serviceMonitorStub = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  names:
    kind: ServiceMonitor
    listKind: ServiceMonitorList
    plural: servicemonitors
    singular: servicemonitor
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              x-kubernetes-preserve-unknown-fields: true
`

// podMonitorStub stands in for the Prometheus Operator's PodMonitor CRD, as
// serviceMonitorStub does for ServiceMonitor.
var podMonitorStub = strings.NewReplacer("ServiceMonitor", "PodMonitor", "servicemonitor", "podmonitor").Replace(serviceMonitorStub)

// TestServerDryRun installs the chart's CRDs into a real kube-apiserver and
// has it accept, in a server-side dry run with strict field validation, every
// object the chart renders for several value sets.
func TestServerDryRun(t *testing.T) {
	h := newHelm(t)
	assets := testtools.EnvtestAssets(t)

	stubDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(stubDir, "servicemonitors.yaml"), []byte(serviceMonitorStub), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stubDir, "podmonitors.yaml"), []byte(podMonitorStub), 0o644); err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(chartDir, "crds"), stubDir},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop kube-apiserver: %v", err)
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clients := kubernetes.NewForConfigOrDie(cfg)
	for _, name := range []string{namespace, "monitoring"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if _, err := clients.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create namespace %s: %v", name, err)
		}
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"defaults", nil},
		{"node validation pods", []string{"--set", "nodeValidation.nodes={gpu-1,gpu-2}"}},
		{"custom", []string{"-f", customFile}},
		{"DRA driver beside the others, monitors on", []string{"--set", "dra.enabled=true", "--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true"}},
		{"agent only", []string{"--set", "devicePlugin.enabled=false", "--set", "rails.strategy=subnet", "--set", "rbac.create=false",
			"--set", "agent.serviceAccount.create=false", "--set", "agent.serviceAccount.name=pxn-agent"}},
		{"plugin only", []string{"--set", "agent.enabled=false", "--set", "devicePlugin.podResourcesSocket=/var/lib/kubelet/device-plugins/pr.sock",
			"--set", "serviceMonitor.enabled=true", "--set", "updateStrategy.maxUnavailable=25%"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := h.template(t, tc.args...)
			if len(objs) == 0 {
				t.Fatal("nothing rendered")
			}
			for _, o := range objs {
				if err := dryRunCreate(ctx, dyn, mapper, o); err != nil {
					t.Errorf("%s %s/%s rejected: %v", o.GetAPIVersion(), o.GetKind(), o.GetName(), err)
				}
			}
		})
	}

	// The control: values the chart renders but the API server must refuse,
	// so a pass above means the server really checked the objects.
	t.Run("server refuses a bad pod spec", func(t *testing.T) {
		objs := h.template(t, "--set-json", `agent.extraEnv=[{"name":"X","valueFrom":{"noSuchSource":{}}}]`)
		ds := find(objs, "DaemonSet", "pxn-agent")
		if ds == nil {
			t.Fatalf("no agent DaemonSet rendered; have %v", names(objs))
		}
		err := dryRunCreate(ctx, dyn, mapper, ds)
		if err == nil || !strings.Contains(err.Error(), "noSuchSource") {
			t.Fatalf("dry run of a DaemonSet with an unknown field: %v, want a rejection naming the field", err)
		}
	})
}

func dryRunCreate(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured) error {
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		r = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	_, err = r.Create(ctx, o, metav1.CreateOptions{
		DryRun:          []string{metav1.DryRunAll},
		FieldValidation: metav1.FieldValidationStrict,
	})
	return err
}
