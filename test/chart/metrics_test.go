// SPDX-License-Identifier: Apache-2.0

package chart_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// TestMetricsServices: with every node daemon on, each DaemonSet has one
// metrics Service, which selects that DaemonSet's pods and no other's and
// sends its port to the container's metrics port; the ServiceMonitor selects
// every one of them, and the PodMonitor the pods of every daemon that serves
// metrics and no other's.
func TestMetricsServices(t *testing.T) {
	h := newHelm(t)
	for _, tc := range []struct {
		name       string
		args       []string
		daemonSets []string
		ports      map[string]int32 // DaemonSet -> its metrics port, for those that serve metrics
	}{
		{
			name:       "defaults",
			args:       []string{"--set", "dra.enabled=true"},
			daemonSets: []string{"pxn-agent", "pxn-device-plugin", "pxn-dra-plugin"},
			ports:      map[string]int32{"pxn-agent": 9640, "pxn-device-plugin": 9641, "pxn-dra-plugin": 9644},
		},
		{
			name: "ports moved",
			args: []string{"--set", "dra.enabled=true", "--set", "agent.metricsBindAddress=:19640",
				"--set", "devicePlugin.metricsBindAddress=127.0.0.1:19641", "--set", "dra.metricsBindAddress=:19644"},
			daemonSets: []string{"pxn-agent", "pxn-device-plugin", "pxn-dra-plugin"},
			ports:      map[string]int32{"pxn-agent": 19640, "pxn-device-plugin": 19641, "pxn-dra-plugin": 19644},
		},
		{
			name:       "the DRA driver alone",
			args:       []string{"--set", "dra.enabled=true", "--set", "agent.enabled=false", "--set", "devicePlugin.enabled=false"},
			daemonSets: []string{"pxn-dra-plugin"},
			ports:      map[string]int32{"pxn-dra-plugin": 9644},
		},
		{
			name:       "the device plugin's metrics off",
			args:       []string{"--set", "dra.enabled=true", "--set", "devicePlugin.metricsBindAddress=0"},
			daemonSets: []string{"pxn-agent", "pxn-device-plugin", "pxn-dra-plugin"},
			ports:      map[string]int32{"pxn-agent": 9640, "pxn-dra-plugin": 9644},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true"}, tc.args...)
			objs := h.template(t, args...)
			var daemonSets []*appsv1.DaemonSet
			var dsNames []string
			for _, o := range objs {
				if o.GetKind() == "DaemonSet" {
					daemonSets = append(daemonSets, typed[appsv1.DaemonSet](t, objs, "DaemonSet", o.GetName()))
					dsNames = append(dsNames, o.GetName())
				}
			}
			if slices.Sort(dsNames); !slices.Equal(dsNames, tc.daemonSets) {
				t.Fatalf("rendered DaemonSets %v, want %v", dsNames, tc.daemonSets)
			}
			var services []*corev1.Service
			for _, o := range objs {
				if o.GetKind() == "Service" && strings.HasSuffix(o.GetName(), "-metrics") {
					services = append(services, typed[corev1.Service](t, objs, "Service", o.GetName()))
				}
			}
			if len(services) != len(tc.ports) {
				t.Errorf("%d metrics Services rendered, want %d: %v", len(services), len(tc.ports), names(objs))
			}
			sm := find(objs, "ServiceMonitor", "pxn")
			pm := find(objs, "PodMonitor", "pxn")
			if sm == nil || pm == nil {
				t.Fatalf("monitors rendered: ServiceMonitor %v, PodMonitor %v; have %v", sm != nil, pm != nil, names(objs))
			}
			for _, ds := range daemonSets {
				want, serves := tc.ports[ds.Name]
				pods := labels.Set(ds.Spec.Template.Labels)
				var selecting []*corev1.Service
				for _, svc := range services {
					if labels.SelectorFromSet(svc.Spec.Selector).Matches(pods) {
						selecting = append(selecting, svc)
					}
				}
				if !serves {
					if len(selecting) != 0 {
						t.Errorf("%s serves no metrics, yet Service %s selects its pods", ds.Name, selecting[0].Name)
					}
					if monitorSelects(t, pm, ds.Spec.Template.Labels) {
						t.Errorf("%s serves no metrics, yet the PodMonitor selects its pods", ds.Name)
					}
					continue
				}
				if len(selecting) != 1 {
					t.Errorf("%s: %d metrics Services select its pods, want 1", ds.Name, len(selecting))
					continue
				}
				svc := selecting[0]
				if svc.Name != ds.Name+"-metrics" || svc.Spec.ClusterIP != corev1.ClusterIPNone {
					t.Errorf("%s: selected by Service %s (clusterIP %q), want %s-metrics, headless", ds.Name, svc.Name, svc.Spec.ClusterIP, ds.Name)
				}
				c := onlyContainer(t, ds)
				var containerPort int32
				for _, p := range c.Ports {
					if p.Name == "metrics" {
						containerPort = p.ContainerPort
					}
				}
				if !strings.HasSuffix(metricsArg(c.Args), fmt.Sprintf(":%d", want)) || containerPort != want {
					t.Errorf("%s: container metrics port %d (args %q), want %d", ds.Name, containerPort, c.Args, want)
				}
				if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != want || svc.Spec.Ports[0].TargetPort.String() != "metrics" ||
					svc.Spec.Ports[0].Protocol != corev1.ProtocolTCP {
					t.Errorf("Service %s ports %+v, want %d to the container's metrics port", svc.Name, svc.Spec.Ports, want)
				}
				if !monitorSelects(t, sm, svc.Labels) {
					t.Errorf("the ServiceMonitor does not select Service %s (labels %v)", svc.Name, svc.Labels)
				}
				if !monitorSelects(t, pm, ds.Spec.Template.Labels) {
					t.Errorf("the PodMonitor does not select the pods of %s (labels %v)", ds.Name, ds.Spec.Template.Labels)
				}
			}
		})
	}
}

// metricsArg is the value of --metrics-bind-address in args.
func metricsArg(args []string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--metrics-bind-address="); ok {
			return v
		}
	}
	return ""
}

// monitorSelects reports whether a ServiceMonitor's or PodMonitor's
// spec.selector matches an object with these labels.
func monitorSelects(t *testing.T, monitor *unstructured.Unstructured, objLabels map[string]string) bool {
	t.Helper()
	sel, _, err := unstructured.NestedMap(monitor.Object, "spec", "selector")
	if err != nil {
		t.Fatal(err)
	}
	var ls metav1.LabelSelector
	if err := fromUnstructured(&unstructured.Unstructured{Object: sel}, &ls); err != nil {
		t.Fatal(err)
	}
	s, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		t.Fatalf("%s selector: %v", monitor.GetKind(), err)
	}
	return s.Matches(labels.Set(objLabels))
}
