// SPDX-License-Identifier: Apache-2.0

package chart_test

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestTemplateMetricsAuth: metricsAuth puts every daemon that serves
// metrics behind --metrics-secure, gives exactly those daemons the reviews
// it needs, offers a reader role and makes the ServiceMonitor scrape with
// a token over HTTPS; off (the default), none of it is rendered.
func TestTemplateMetricsAuth(t *testing.T) {
	h := newHelm(t)
	secure := func(objs []*unstructured.Unstructured, name string) bool {
		ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet", name)
		return slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--metrics-secure")
	}

	off := h.template(t, "--set", "dra.enabled=true", "--set", "serviceMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1")
	for _, d := range []string{"pxn-agent", "pxn-device-plugin", "pxn-dra-plugin"} {
		if secure(off, d) {
			t.Errorf("%s gets --metrics-secure by default", d)
		}
	}
	for _, name := range []string{"pxn-metrics-auth", "pxn-metrics-reader"} {
		if find(off, "ClusterRole", name) != nil {
			t.Errorf("ClusterRole %s rendered by default", name)
		}
	}
	if ep := serviceMonitorEndpoint(t, off); ep["scheme"] != nil || ep["bearerTokenFile"] != nil {
		t.Errorf("default ServiceMonitor endpoint %v scrapes with a token or HTTPS", ep)
	}

	on := h.template(t, "--set", "metricsAuth.enabled=true", "--set", "dra.enabled=true", "--set", "dra.metricsBindAddress=0",
		"--set", "serviceMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1")
	for d, want := range map[string]bool{"pxn-agent": true, "pxn-device-plugin": true, "pxn-dra-plugin": false} {
		if got := secure(on, d); got != want {
			t.Errorf("%s: --metrics-secure %v, want %v (metrics served: %v)", d, got, want, want)
		}
	}
	role := typed[rbacv1.ClusterRole](t, on, "ClusterRole", "pxn-metrics-auth")
	var granted []string
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			granted = append(granted, r.APIGroups[0]+"/"+res+":"+r.Verbs[0])
		}
	}
	slices.Sort(granted)
	if want := []string{"authentication.k8s.io/tokenreviews:create", "authorization.k8s.io/subjectaccessreviews:create"}; !slices.Equal(granted, want) {
		t.Errorf("pxn-metrics-auth grants %v, want %v", granted, want)
	}
	binding := typed[rbacv1.ClusterRoleBinding](t, on, "ClusterRoleBinding", "pxn-metrics-auth")
	var subjects []string
	for _, s := range binding.Subjects {
		subjects = append(subjects, s.Namespace+"/"+s.Name)
	}
	slices.Sort(subjects)
	if want := []string{namespace + "/pxn-agent", namespace + "/pxn-device-plugin"}; !slices.Equal(subjects, want) {
		t.Errorf("pxn-metrics-auth is bound to %v, want the daemons that serve metrics %v", subjects, want)
	}
	reader := typed[rbacv1.ClusterRole](t, on, "ClusterRole", "pxn-metrics-reader")
	if len(reader.Rules) != 1 || !slices.Equal(reader.Rules[0].NonResourceURLs, []string{"/metrics"}) || !slices.Equal(reader.Rules[0].Verbs, []string{"get"}) {
		t.Errorf("pxn-metrics-reader rules %+v, want get /metrics only", reader.Rules)
	}
	ep := serviceMonitorEndpoint(t, on)
	if ep["scheme"] != "https" || ep["bearerTokenFile"] == nil {
		t.Errorf("ServiceMonitor endpoint %v, want HTTPS with Prometheus' token", ep)
	}
}

func serviceMonitorEndpoint(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	sm := find(objs, "ServiceMonitor", "pxn")
	if sm == nil {
		t.Fatalf("no ServiceMonitor rendered; have %v", names(objs))
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v, want one", eps)
	}
	return eps[0].(map[string]any)
}
