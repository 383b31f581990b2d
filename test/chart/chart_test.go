// SPDX-License-Identifier: Apache-2.0

// Package chart_test checks the charts/pxn Helm chart: lint, rendering,
// values schema, validation template, and acceptance of every rendered object
// by a real kube-apiserver.
package chart_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/internal/version"
)

// kubeVersion is passed to helm template, as helm install would learn it from
// the cluster; TestTemplateWithoutKubeVersion renders without it.
const kubeVersion = "v1.37.2"

const namespace = "pxn-system"

var (
	chartDir   = filepath.Join(testtools.RepoRoot(), "charts", "pxn")
	customFile = filepath.Join("testdata", "values-custom.yaml")
)

type helm struct {
	bin string
	env []string
}

// newHelm finds helm and keeps its cache, config and data out of $HOME.
func newHelm(t *testing.T) *helm {
	t.Helper()
	bin := testtools.Require(t, "helm")
	home := t.TempDir()
	env := os.Environ()
	for _, v := range []string{"HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"} {
		env = append(env, v+"="+filepath.Join(home, strings.ToLower(strings.TrimPrefix(v, "HELM_"))))
	}
	return &helm{bin: bin, env: env}
}

// run returns helm's stdout, or an error carrying its stderr.
func (h *helm) run(args ...string) (string, error) {
	cmd := exec.Command(h.bin, args...)
	cmd.Env = h.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), errors.New(strings.TrimSpace(stderr.String()) + " (" + err.Error() + ")")
	}
	return stdout.String(), nil
}

func (h *helm) templateArgs(args []string) []string {
	return append([]string{"template", "pxn", chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, args...)
}

// template renders the chart with extra helm arguments and returns the objects.
func (h *helm) template(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := h.run(h.templateArgs(args)...)
	if err != nil {
		t.Fatalf("helm template %v: %v", args, err)
	}
	objs, err := decodeObjects(out)
	if err != nil {
		t.Fatalf("helm template %v: %v", args, err)
	}
	return objs
}

func decodeObjects(manifests string) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifests)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// typed converts a rendered object, failing on fields the Go type lacks.
func typed[T any](t *testing.T, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	o := find(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %q rendered; have %v", kind, name, names(objs))
	}
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
		t.Fatalf("%s %q: %v", kind, name, err)
	}
	return out
}

func names(objs []*unstructured.Unstructured) []string {
	var s []string
	for _, o := range objs {
		s = append(s, o.GetKind()+"/"+o.GetName())
	}
	slices.Sort(s)
	return s
}

func TestLint(t *testing.T) {
	h := newHelm(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"defaults", nil},
		{"custom", []string{"-f", customFile}},
		{"agent only, subnet", []string{"--set", "devicePlugin.enabled=false", "--set", "rails.strategy=subnet"}},
		{"cleanup hook", []string{"--set", "cleanup.removeNodeLabels=true"}},
		{"the DRA driver alone", []string{"--set", "dra.enabled=true", "--set", "agent.enabled=false", "--set", "devicePlugin.enabled=false"}},
		{"nodes to verify listed", []string{"--set", "dra.enabled=true", "--set", "nodeValidation.nodes={gpu-1,gpu-2}"}},
		{"no node validation", []string{"--set", "nodeValidation.enabled=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"lint", "--strict", chartDir}, tc.args...)
			if out, err := h.run(args...); err != nil {
				t.Fatalf("helm %v: %v\n%s", args, err, out)
			}
		})
	}
}

// TestTemplateWithoutKubeVersion renders the chart the way Argo CD and
// `helm template | kubectl apply` do: no cluster, helm's built-in default
// capabilities. It must render what an install against v1.37 renders,
// node-restriction policy included.
func TestTemplateWithoutKubeVersion(t *testing.T) {
	h := newHelm(t)
	for _, args := range [][]string{nil, {"-f", customFile}} {
		plain, err := h.run(append([]string{"template", "pxn", chartDir, "--namespace", namespace}, args...)...)
		if err != nil {
			t.Fatalf("helm template %v without --kube-version: %v", args, err)
		}
		withVersion, err := h.run(h.templateArgs(args)...)
		if err != nil {
			t.Fatal(err)
		}
		if plain != withVersion {
			t.Errorf("helm template %v renders differently without --kube-version", args)
		}
		if !strings.Contains(plain, "kind: ValidatingAdmissionPolicy") {
			t.Errorf("helm template %v renders no ValidatingAdmissionPolicy", args)
		}
	}
}

// TestVersionsAgree: the chart's version and appVersion are the VERSION file's
// release, which the binaries report (internal/version) and the image is
// tagged with.
func TestVersionsAgree(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testtools.RepoRoot(), "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	release := strings.TrimSpace(string(b))
	c, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		Version     string `json:"version"`
		AppVersion  string `json:"appVersion"`
		KubeVersion string `json:"kubeVersion"`
	}
	if err := yaml.Unmarshal(c, &chart); err != nil {
		t.Fatal(err)
	}
	if chart.Version != release || chart.AppVersion != release || version.Release != release {
		t.Errorf("VERSION %q, Chart.yaml version %q appVersion %q, version.Release %q: keep them equal",
			release, chart.Version, chart.AppVersion, version.Release)
	}
	if chart.KubeVersion != "" {
		t.Errorf("Chart.yaml kubeVersion %q: helm template checks it against helm's default, not the cluster", chart.KubeVersion)
	}
}

// checkCleanupHook: the post-delete hook's Job runs remove-labels under its
// own service account, which may only list and patch nodes; every part is a
// post-delete hook, the RBAC created before the Job.
func checkCleanupHook(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	weights := map[string]string{}
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"} {
		o := find(objs, kind, "pxn-cleanup")
		if o == nil {
			t.Errorf("no %s/pxn-cleanup rendered; have %v", kind, names(objs))
			continue
		}
		a := o.GetAnnotations()
		if a["helm.sh/hook"] != "post-delete" || !strings.Contains(a["helm.sh/hook-delete-policy"], "hook-succeeded") {
			t.Errorf("%s/pxn-cleanup annotations %v, want a post-delete hook deleted on success", kind, a)
		}
		weights[kind] = a["helm.sh/hook-weight"]
	}
	if len(weights) == 4 && !(weights["ClusterRole"] < weights["Job"] && weights["ClusterRoleBinding"] < weights["Job"] && weights["ServiceAccount"] < weights["Job"]) {
		t.Errorf("hook weights %v: the RBAC must come before the Job", weights)
	}
	role := typed[rbacv1.ClusterRole](t, objs, "ClusterRole", "pxn-cleanup")
	checkRules(t, "cleanup", role.Rules, map[string][]string{"/nodes": {"list", "patch"}})
	job := typed[batchv1.Job](t, objs, "Job", "pxn-cleanup")
	spec := job.Spec.Template.Spec
	if spec.ServiceAccountName != "pxn-cleanup" || len(spec.Containers) != 1 ||
		!slices.Equal(spec.Containers[0].Command, []string{"/usr/local/bin/pxn-agent", "remove-labels"}) {
		t.Errorf("cleanup Job: serviceAccount %q containers %+v", spec.ServiceAccountName, spec.Containers)
	}
}

func TestTemplateDefaults(t *testing.T) {
	objs := newHelm(t).template(t)
	want := []string{
		"ClusterRole/pxn-agent", "ClusterRole/pxn-device-plugin", "ClusterRole/pxn-verify",
		"ClusterRoleBinding/pxn-agent", "ClusterRoleBinding/pxn-device-plugin", "ClusterRoleBinding/pxn-verify",
		"DaemonSet/pxn-agent", "DaemonSet/pxn-device-plugin",
		"Role/pxn-agent-events", "RoleBinding/pxn-agent-events",
		"Service/pxn-agent-metrics", "Service/pxn-device-plugin-metrics",
		"ServiceAccount/pxn-agent", "ServiceAccount/pxn-device-plugin", "ServiceAccount/pxn-verify",
		"ValidatingAdmissionPolicy/pxn-agent-node-restriction", "ValidatingAdmissionPolicyBinding/pxn-agent-node-restriction",
	}
	if got := names(objs); !slices.Equal(got, want) {
		t.Errorf("rendered objects:\n got %v\nwant %v", got, want)
	}
	for _, o := range objs {
		wantNS := namespace
		switch o.GetKind() {
		case "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			wantNS = ""
		case "Role", "RoleBinding":
			wantNS = "default" // where Events about cluster-scoped objects go
		}
		if o.GetNamespace() != wantNS {
			t.Errorf("%s/%s: namespace %q, want %q", o.GetKind(), o.GetName(), o.GetNamespace(), wantNS)
		}
	}

	agent := typed[appsv1.DaemonSet](t, objs, "DaemonSet", "pxn-agent")
	checkDaemonSetCommon(t, agent, map[string]string{"nvidia.com/gpu.present": "true"})
	c := onlyContainer(t, agent)
	if c.Image != "ghcr.io/pxn-project/pxn:0.1.0" {
		t.Errorf("agent image %q, want the appVersion tag", c.Image)
	}
	if c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("agent pullPolicy %q", c.ImagePullPolicy)
	}
	wantArgs := []string{"run", "--host-root=/host", "--rail-strategy=pci-order", "--resync=60s",
		"--poll-interval=2s", "--metrics-bind-address=:9640", "--health-probe-bind-address=:9642",
		"--shm-dirs=/dev/shm/pxn", "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
		"--rank-metric-labels=node,rail,hca,device,group,namespace,pod", "--rank-stale-after=10s"}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("agent args:\n got %q\nwant %q", c.Args, wantArgs)
	}
	if env := envVar(c, "NODE_NAME"); env == nil || env.ValueFrom == nil || env.ValueFrom.FieldRef == nil ||
		env.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("agent NODE_NAME env %+v, want fieldRef spec.nodeName", env)
	}
	for name, value := range map[string]string{"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"} {
		if env := envVar(c, name); env == nil || env.Value != value {
			t.Errorf("agent %s env %+v, want %q (agent.nvml.mode runtime)", name, env, value)
		}
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("agent probes: liveness %+v readiness %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	checkPorts(t, c, map[string]int32{"metrics": 9640, "health": 9642})
	checkSysfsMounts(t, agent, "/sys")
	// The rank metrics read the node plugins' shm folders, and nothing more.
	checkHostMount(t, agent, "/dev/shm/pxn", "/dev/shm/pxn", true)
	checkNoHostPath(t, agent, "/run/pxn")
	checkHostMount(t, agent, "/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources", true)
	if sc := c.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"DAC_READ_SEARCH"}) ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("agent securityContext %+v, want root with DAC_READ_SEARCH only, read-only root, no escalation", sc)
	}
	if spec := agent.Spec.Template.Spec; spec.HostPID || spec.HostNetwork {
		t.Errorf("agent uses host PID or network namespace")
	}
	for _, comp := range []string{"agent", "device-plugin"} {
		svc := typed[corev1.Service](t, objs, "Service", "pxn-"+comp+"-metrics")
		if svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
			t.Errorf("metrics Service %s: %+v", comp, svc.Spec)
		}
	}

	plugin := typed[appsv1.DaemonSet](t, objs, "DaemonSet", "pxn-device-plugin")
	checkDaemonSetCommon(t, plugin, map[string]string{"nvidia.com/gpu.present": "true"})
	c = onlyContainer(t, plugin)
	wantArgs = []string{
		"--resource-name=pxn.io/relay", "--devices=16",
		"--device-plugin-dir=/var/lib/kubelet/device-plugins",
		"--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
		"--host-root=/host", "--rail-strategy=pci-order",
		"--state-dir=/run/pxn", "--shm-dir=/dev/shm/pxn", "--container-registry-root=/run/pxn",
		"--group-id=k8s", "--metrics-bind-address=:9641", "--health-probe-bind-address=:9643", "--gc-interval=30s", "--gc-grace=5m",
		"--rediscover-interval=30s", "--pod-lookup-timeout=5s",
	}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("device plugin args:\n got %q\nwant %q", c.Args, wantArgs)
	}
	checkPorts(t, c, map[string]int32{"metrics": 9641, "health": 9643})
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.LivenessProbe.HTTPGet.Port.String() != "health" ||
		c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("device plugin probes: liveness %+v readiness %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	checkSysfsMounts(t, plugin, "/sys")
	checkHostMount(t, plugin, "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins", false)
	checkHostMount(t, plugin, "/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources", true)
	checkHostMount(t, plugin, "/run/pxn", "/run/pxn", false)
	checkHostMount(t, plugin, "/dev/shm/pxn", "/dev/shm/pxn", false)
	if plugin.Spec.Template.Spec.HostPID || plugin.Spec.Template.Spec.HostNetwork {
		t.Errorf("device plugin uses host PID or network namespace")
	}

	agentRole := typed[rbacv1.ClusterRole](t, objs, "ClusterRole", "pxn-agent")
	checkRules(t, "agent", agentRole.Rules, map[string][]string{
		"pxn.io/pxnrailmaps":        {"create", "list", "patch", "watch"},
		"pxn.io/pxnrailmaps/status": {"patch"},
		"/nodes":                    {"list", "patch", "watch"},
	})
	eventsRole := typed[rbacv1.Role](t, objs, "Role", "pxn-agent-events")
	checkRules(t, "agent events", eventsRole.Rules, map[string][]string{"events.k8s.io/events": {"create"}})
	pluginRole := typed[rbacv1.ClusterRole](t, objs, "ClusterRole", "pxn-device-plugin")
	checkRules(t, "device plugin", pluginRole.Rules, map[string][]string{"/pods": {"get"}})
	for _, comp := range []string{"agent", "device-plugin"} {
		b := typed[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", "pxn-"+comp)
		if b.RoleRef.Name != "pxn-"+comp || len(b.Subjects) != 1 || b.Subjects[0].Name != "pxn-"+comp ||
			b.Subjects[0].Namespace != namespace {
			t.Errorf("binding %s: roleRef %+v subjects %+v", comp, b.RoleRef, b.Subjects)
		}
	}
	if sa := agent.Spec.Template.Spec.ServiceAccountName; sa != "pxn-agent" {
		t.Errorf("agent serviceAccountName %q", sa)
	}
	if sa := plugin.Spec.Template.Spec.ServiceAccountName; sa != "pxn-device-plugin" {
		t.Errorf("device plugin serviceAccountName %q", sa)
	}
}

func TestTemplateCustom(t *testing.T) {
	objs := newHelm(t).template(t, "-f", customFile)
	nodeSelector := map[string]string{"example.com/rdma-rails": "8"}

	agent := typed[appsv1.DaemonSet](t, objs, "DaemonSet", "pxn-agent")
	checkDaemonSetCommon(t, agent, nodeSelector)
	spec := agent.Spec.Template.Spec
	if spec.RuntimeClassName == nil || *spec.RuntimeClassName != "nvidia" {
		t.Errorf("runtimeClassName %v", spec.RuntimeClassName)
	}
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil {
		t.Errorf("affinity not rendered")
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists || spec.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v, want the single tolerate-all entry", spec.Tolerations)
	}
	if len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "registry-creds" {
		t.Errorf("imagePullSecrets %+v", spec.ImagePullSecrets)
	}
	if got := agent.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String(); got != "10%" {
		t.Errorf("maxUnavailable %q, want 10%%", got)
	}
	ann := agent.Spec.Template.Annotations
	if ann["example.com/team"] != "inference" || ann["example.com/agent"] != "yes" || ann["checksum/rails"] == "" {
		t.Errorf("agent pod annotations %v", ann)
	}
	if agent.Spec.Template.Labels["example.com/tier"] != "node" {
		t.Errorf("agent pod labels %v", agent.Spec.Template.Labels)
	}
	if spec.ServiceAccountName != "rail-agent" {
		t.Errorf("agent serviceAccountName %q", spec.ServiceAccountName)
	}
	c := onlyContainer(t, agent)
	if c.Image != "registry.example.com/gpu/pxn:0.1.0-rc.1" || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("agent image %q pullPolicy %q", c.Image, c.ImagePullPolicy)
	}
	wantArgs := []string{"run", "--host-root=/host", "--rail-strategy=static", "--static-file=/etc/pxn/rails/rails.json",
		"--resync=2m30s", "--poll-interval=500ms", "--metrics-bind-address=:19640", "--health-probe-bind-address=:19642",
		"--shm-dirs=/dev/shm/pxn-test", "--pod-resources-socket=/var/lib/k0s/kubelet/pod-resources/kubelet.sock",
		"--rank-metric-labels=node,rail,namespace", "--rank-stale-after=30s", "-v=4"}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("agent args:\n got %q\nwant %q", c.Args, wantArgs)
	}
	if e := envVar(c, "GODEBUG"); e == nil || e.Value != "madvdontneed=1" {
		t.Errorf("agent extraEnv not rendered: %+v", c.Env)
	}
	if c.Resources.Requests.Cpu().String() != "50m" {
		t.Errorf("agent cpu request %s", c.Resources.Requests.Cpu())
	}
	checkPorts(t, c, map[string]int32{"metrics": 19640, "health": 19642})
	if c.LivenessProbe == nil || c.LivenessProbe.PeriodSeconds != 60 || c.LivenessProbe.TimeoutSeconds != 5 || c.ReadinessProbe != nil {
		t.Errorf("agent probes: liveness %+v readiness %+v, want the custom liveness probe and no readiness probe", c.LivenessProbe, c.ReadinessProbe)
	}
	checkSysfsMounts(t, agent, "/mnt/host-sys")
	checkHostMount(t, agent, "/dev/shm/pxn-test", "/dev/shm/pxn-test", true)
	checkNoHostPath(t, agent, "/run/pxn-test")
	checkHostMount(t, agent, "/var/lib/k0s/kubelet/pod-resources", "/var/lib/k0s/kubelet/pod-resources", true)

	plugin := typed[appsv1.DaemonSet](t, objs, "DaemonSet", "pxn-device-plugin")
	checkDaemonSetCommon(t, plugin, nodeSelector)
	c = onlyContainer(t, plugin)
	wantArgs = []string{
		"--resource-name=example.com/relay", "--devices=64",
		"--device-plugin-dir=/var/lib/k0s/kubelet/device-plugins",
		"--pod-resources-socket=/var/lib/k0s/kubelet/pod-resources/kubelet.sock",
		"--host-root=/host", "--rail-strategy=static", "--static-file=/etc/pxn/rails/rails.json",
		"--state-dir=/run/pxn-test", "--shm-dir=/dev/shm/pxn-test", "--container-registry-root=/var/run/pxn-registry",
		"--group-id=team-a", "--metrics-bind-address=:19641", "--health-probe-bind-address=127.0.0.1:19643", "--gc-interval=10s", "--gc-grace=90s",
		"--rediscover-interval=1m", "--pod-lookup-timeout=2s", "-v=2",
	}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("device plugin args:\n got %q\nwant %q", c.Args, wantArgs)
	}
	if c.LivenessProbe != nil || c.ReadinessProbe == nil || c.ReadinessProbe.InitialDelaySeconds != 3 {
		t.Errorf("device plugin probes: liveness %+v readiness %+v, want no liveness probe and the custom readiness probe", c.LivenessProbe, c.ReadinessProbe)
	}
	checkSysfsMounts(t, plugin, "/mnt/host-sys")
	checkHostMount(t, plugin, "/var/lib/k0s/kubelet/device-plugins", "/var/lib/k0s/kubelet/device-plugins", false)
	checkHostMount(t, plugin, "/var/lib/k0s/kubelet/pod-resources", "/var/lib/k0s/kubelet/pod-resources", true)
	checkHostMount(t, plugin, "/run/pxn-test", "/run/pxn-test", false)
	checkHostMount(t, plugin, "/dev/shm/pxn-test", "/dev/shm/pxn-test", false)
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/scratch" }) {
		t.Errorf("device plugin extraVolumeMounts not rendered: %+v", c.VolumeMounts)
	}

	cm := typed[corev1.ConfigMap](t, objs, "ConfigMap", "pxn-rails")
	if len(cm.Data) != 1 || cm.Data["rails.json"] != `{"mlx5_0":"rail0","mlx5_1":"rail1"}` {
		t.Errorf("rails ConfigMap data %q, want one rails.json", cm.Data)
	}
	if a, p := agent.Spec.Template.Annotations["checksum/rails"], plugin.Spec.Template.Annotations["checksum/rails"]; a == "" || a != p {
		t.Errorf("checksum/rails: agent %q, device plugin %q; want one, equal", a, p)
	}
	checkCleanupHook(t, objs)

	for comp, port := range map[string]int32{"agent": 19640, "device-plugin": 19641} {
		svc := typed[corev1.Service](t, objs, "Service", "pxn-"+comp+"-metrics")
		if svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != port ||
			svc.Spec.Ports[0].TargetPort.String() != "metrics" || svc.Spec.Selector["app.kubernetes.io/component"] != comp {
			t.Errorf("metrics Service %s: %+v", comp, svc.Spec)
		}
	}
	sm := find(objs, "ServiceMonitor", "pxn")
	if sm == nil {
		t.Fatalf("no ServiceMonitor rendered; have %v", names(objs))
	}
	if sm.GetAPIVersion() != "monitoring.coreos.com/v1" || sm.GetLabels()["release"] != "prometheus" {
		t.Errorf("ServiceMonitor %s labels %v", sm.GetAPIVersion(), sm.GetLabels())
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != "metrics" || eps[0].(map[string]any)["interval"] != "15s" ||
		eps[0].(map[string]any)["honorLabels"] != true {
		t.Errorf("ServiceMonitor endpoints %v", eps)
	}
	pm := find(objs, "PodMonitor", "pxn")
	if pm == nil {
		t.Fatalf("no PodMonitor rendered; have %v", names(objs))
	}
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	peps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if pm.GetLabels()["release"] != "kube-prometheus" || sel["app.kubernetes.io/instance"] != "pxn" || len(peps) != 1 ||
		peps[0].(map[string]any)["port"] != "metrics" || peps[0].(map[string]any)["scrapeTimeout"] != "5s" || peps[0].(map[string]any)["honorLabels"] != true {
		t.Errorf("PodMonitor labels %v selector %v endpoints %v", pm.GetLabels(), sel, peps)
	}
	for k, v := range sel {
		if agent.Spec.Template.Labels[k] != v || plugin.Spec.Template.Labels[k] != v {
			t.Errorf("PodMonitor selector %s=%s does not select both components' pods", k, v)
		}
	}

	dcm := find(objs, "ConfigMap", "pxn-dashboard")
	if dcm == nil {
		t.Fatalf("no dashboard ConfigMap rendered; have %v", names(objs))
	}
	dash, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "pxn.json"))
	if err != nil {
		t.Fatal(err)
	}
	data, _, _ := unstructured.NestedStringMap(dcm.Object, "data")
	if dcm.GetNamespace() != "monitoring" || dcm.GetLabels()["grafana_dashboard"] != "1" || dcm.GetLabels()["team"] != "ml" ||
		dcm.GetAnnotations()["grafana_folder"] != "PXN" {
		t.Errorf("dashboard ConfigMap %s/%s labels %v annotations %v", dcm.GetNamespace(), dcm.GetName(), dcm.GetLabels(), dcm.GetAnnotations())
	}
	if len(data) != 1 || data["pxn.json"] != strings.TrimSpace(string(dash)) {
		t.Errorf("dashboard ConfigMap data keys %v: pxn.json is not the chart's dashboards/pxn.json", slices.Collect(maps.Keys(data)))
	}
}

func TestTemplateVariants(t *testing.T) {
	h := newHelm(t)
	for _, tc := range []struct {
		name       string
		args       []string
		agentArgs  []string // nil: no agent DaemonSet
		pluginArgs []string // substrings of the plugin's args; nil: no plugin DaemonSet
	}{
		{
			name:       "subnet strategy passes the prefix length",
			args:       []string{"--set", "rails.strategy=subnet", "--set", "rails.subnetPrefixLen=20"},
			agentArgs:  []string{"--rail-strategy=subnet", "--subnet-prefix-len=20"},
			pluginArgs: []string{"--rail-strategy=subnet", "--subnet-prefix-len=20"},
		},
		{
			name:      "agent only, static file, metrics and probes off",
			args:      []string{"--set", "devicePlugin.enabled=false", "--set", "rails.strategy=static", "--set", "rails.staticFile=/etc/rails/table.json", "--set", "agent.metricsBindAddress=0", "--set", "agent.healthProbeBindAddress=0", "--set", "agent.kubeconfig=/etc/kube/config"},
			agentArgs: []string{"--static-file=/etc/rails/table.json", "--metrics-bind-address=0", "--kubeconfig=/etc/kube/config"},
		},
		{
			name:       "with the DRA driver, the rank metrics read its shm folder too",
			args:       []string{"--set", "dra.enabled=true", "--set", "dra.shmDir=/dev/shm/pxn-claims"},
			agentArgs:  []string{"--shm-dirs=/dev/shm/pxn,/dev/shm/pxn-claims"},
			pluginArgs: []string{"--shm-dir=/dev/shm/pxn"},
		},
		{
			name:       "rank metrics off",
			args:       []string{"--set", "agent.rankMetrics.enabled=false"},
			agentArgs:  []string{"--shm-dirs="},
			pluginArgs: []string{"--shm-dir=/dev/shm/pxn"},
		},
		{
			name:       "plugin only, digest, pod-resources inside the plugin dir, metrics and probes off",
			args:       []string{"--set", "agent.enabled=false", "--set", "image.digest=sha256:" + strings.Repeat("ab", 32), "--set", "devicePlugin.podResourcesSocket=/var/lib/kubelet/device-plugins/pr.sock", "--set", "devicePlugin.metricsBindAddress=0", "--set", "devicePlugin.healthProbeBindAddress=0"},
			pluginArgs: []string{"--pod-resources-socket=/var/lib/kubelet/device-plugins/pr.sock", "--metrics-bind-address=0", "--health-probe-bind-address=0"},
		},
		{
			name:       "the plugin's deprecated metricsAddr and an empty health address still turn them off",
			args:       []string{"--set", "devicePlugin.metricsAddr=", "--set", "devicePlugin.healthProbeBindAddress="},
			agentArgs:  []string{"--metrics-bind-address=:9640"},
			pluginArgs: []string{"--metrics-bind-address=0", "--health-probe-bind-address=0"},
		},
		{
			name:       "the plugin's deprecated metricsAddr, when set, is the address",
			args:       []string{"--set", "devicePlugin.metricsAddr=:7777"},
			agentArgs:  []string{"--metrics-bind-address=:9640"},
			pluginArgs: []string{"--metrics-bind-address=:7777"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := h.template(t, tc.args...)
			if (find(objs, "DaemonSet", "pxn-agent") != nil) != (tc.agentArgs != nil) {
				t.Fatalf("agent DaemonSet rendered=%v, want %v", find(objs, "DaemonSet", "pxn-agent") != nil, tc.agentArgs != nil)
			}
			if (find(objs, "DaemonSet", "pxn-device-plugin") != nil) != (tc.pluginArgs != nil) {
				t.Fatalf("device plugin DaemonSet rendered=%v, want %v", find(objs, "DaemonSet", "pxn-device-plugin") != nil, tc.pluginArgs != nil)
			}
			if tc.agentArgs != nil {
				ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet", "pxn-agent")
				c := onlyContainer(t, ds)
				for _, a := range tc.agentArgs {
					if !slices.Contains(c.Args, a) {
						t.Errorf("agent args %q lack %q", c.Args, a)
					}
				}
				for _, a := range c.Args {
					if dirs, ok := strings.CutPrefix(a, "--shm-dirs="); ok && dirs != "" {
						for _, d := range strings.Split(dirs, ",") {
							checkHostMount(t, ds, d, d, true)
						}
					}
				}
				if tc.pluginArgs == nil && (find(objs, "ClusterRole", "pxn-device-plugin") != nil || find(objs, "ServiceAccount", "pxn-device-plugin") != nil) {
					t.Errorf("RBAC of the disabled device plugin rendered: %v", names(objs))
				}
				if slices.Contains(tc.agentArgs, "--metrics-bind-address=0") && (len(c.Ports) != 0 || c.LivenessProbe != nil) {
					t.Errorf("agent with endpoints off has ports %+v / probe %+v", c.Ports, c.LivenessProbe)
				}
				if slices.Contains(tc.agentArgs, "--shm-dirs=") {
					for _, v := range ds.Spec.Template.Spec.Volumes {
						if v.HostPath != nil && !strings.HasPrefix(v.Name, "host-sys-") {
							t.Errorf("agent without rank metrics mounts host %s", v.HostPath.Path)
						}
					}
					for _, a := range c.Args {
						if strings.HasPrefix(a, "--rank-") || strings.HasPrefix(a, "--state-dir") {
							t.Errorf("agent without rank metrics gets %s", a)
						}
					}
				}
			}
			if tc.pluginArgs != nil {
				ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet", "pxn-device-plugin")
				c := onlyContainer(t, ds)
				for _, a := range tc.pluginArgs {
					if !slices.Contains(c.Args, a) {
						t.Errorf("device plugin args %q lack %q", c.Args, a)
					}
				}
				if slices.Contains(tc.pluginArgs, "--health-probe-bind-address=") && (len(c.Ports) != 0 || c.LivenessProbe != nil || c.ReadinessProbe != nil) {
					t.Errorf("device plugin with endpoints off has ports %+v / probes %+v %+v", c.Ports, c.LivenessProbe, c.ReadinessProbe)
				}
				if strings.Contains(tc.name, "digest") && c.Image != "ghcr.io/pxn-project/pxn@sha256:"+strings.Repeat("ab", 32) {
					t.Errorf("image %q, want the digest reference", c.Image)
				}
				mounts := map[string]int{}
				for _, m := range c.VolumeMounts {
					mounts[m.MountPath]++
				}
				for p, n := range mounts {
					if n > 1 {
						t.Errorf("mountPath %s used %d times", p, n)
					}
				}
			}
		})
	}
}

func checkDaemonSetCommon(t *testing.T, ds *appsv1.DaemonSet, nodeSelector map[string]string) {
	t.Helper()
	s := ds.Spec.UpdateStrategy
	if s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate == nil || s.RollingUpdate.MaxSurge == nil ||
		s.RollingUpdate.MaxSurge.IntValue() != 0 || s.RollingUpdate.MaxSurge.String() != "0" {
		t.Errorf("%s: update strategy %+v, want RollingUpdate with maxSurge 0", ds.Name, s)
	}
	spec := ds.Spec.Template.Spec
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("%s: priorityClassName %q", ds.Name, spec.PriorityClassName)
	}
	if len(spec.NodeSelector) != len(nodeSelector) {
		t.Errorf("%s: nodeSelector %v, want %v", ds.Name, spec.NodeSelector, nodeSelector)
	}
	for k, v := range nodeSelector {
		if spec.NodeSelector[k] != v {
			t.Errorf("%s: nodeSelector %v, want %v", ds.Name, spec.NodeSelector, nodeSelector)
		}
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("%s: pod labels %v do not match selector %v", ds.Name, ds.Spec.Template.Labels, ds.Spec.Selector.MatchLabels)
		}
	}
}

func onlyContainer(t *testing.T, ds *appsv1.DaemonSet) corev1.Container {
	t.Helper()
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("%s: %d containers, want 1", ds.Name, len(cs))
	}
	return cs[0]
}

func envVar(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func checkPorts(t *testing.T, c corev1.Container, want map[string]int32) {
	t.Helper()
	got := map[string]int32{}
	for _, p := range c.Ports {
		got[p.Name] = p.ContainerPort
	}
	if len(got) != len(want) {
		t.Errorf("%s: ports %v, want %v", c.Name, got, want)
	}
	for n, p := range want {
		if got[n] != p {
			t.Errorf("%s: port %s = %d, want %d", c.Name, n, got[n], p)
		}
	}
}

// checkNoHostPath asserts that ds mounts no host path hostPath.
func checkNoHostPath(t *testing.T, ds *appsv1.DaemonSet, hostPath string) {
	t.Helper()
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == hostPath {
			t.Errorf("%s: volume %s mounts host %s", ds.Name, v.Name, hostPath)
		}
	}
}

// checkHostMount asserts that host path hostPath is mounted at mountPath.
func checkHostMount(t *testing.T, ds *appsv1.DaemonSet, hostPath, mountPath string, readOnly bool) {
	t.Helper()
	var volume string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == hostPath {
			volume = v.Name
		}
	}
	if volume == "" {
		t.Errorf("%s: no hostPath volume for %s", ds.Name, hostPath)
		return
	}
	for _, m := range ds.Spec.Template.Spec.Containers[0].VolumeMounts {
		if m.Name == volume {
			if m.MountPath != mountPath || m.ReadOnly != readOnly {
				t.Errorf("%s: host %s mounted at %s readOnly=%v, want %s readOnly=%v",
					ds.Name, hostPath, m.MountPath, m.ReadOnly, mountPath, readOnly)
			}
			return
		}
	}
	t.Errorf("%s: volume %s (host %s) is not mounted", ds.Name, volume, hostPath)
}

// checkSysfsMounts asserts that the parts of sysfs rail discovery reads, and
// no other, are mounted read-only below /host/sys.
func checkSysfsMounts(t *testing.T, ds *appsv1.DaemonSet, hostSys string) {
	t.Helper()
	for _, p := range []string{"class", "bus/pci", "devices"} {
		checkHostMount(t, ds, hostSys+"/"+p, "/host/sys/"+p, true)
	}
	checkNoHostPath(t, ds, hostSys)
}

// checkRules compares rules keyed by "group/resource" with sorted verbs.
func checkRules(t *testing.T, who string, rules []rbacv1.PolicyRule, want map[string][]string) {
	t.Helper()
	got := map[string][]string{}
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				k := g + "/" + res
				got[k] = append(got[k], r.Verbs...)
				slices.Sort(got[k])
			}
		}
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("%s: unexpected rule %+v", who, r)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s rules %v, want %v", who, got, want)
	}
	for k, verbs := range want {
		if !slices.Equal(got[k], verbs) {
			t.Errorf("%s rules for %s: %v, want %v", who, k, got[k], verbs)
		}
	}
}

// TestTemplateNVML checks how each agent.nvml mode makes the driver's NVML
// library reachable in the agent.
func TestTemplateNVML(t *testing.T) {
	h := newHelm(t)
	for _, tc := range []struct {
		name         string
		args         []string
		wantEnv      map[string]string // and no other of NVIDIA_*, LD_LIBRARY_PATH
		wantRuntime  string
		wantHostLibs string // host folder mounted at /usr/local/nvidia/lib64
	}{
		{name: "runtime on the default runtime", wantEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}},
		{name: "runtime class of the agent", args: []string{"--set", "agent.nvml.runtimeClassName=nvidia"},
			wantEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}, wantRuntime: "nvidia"},
		{name: "the top-level runtime class wins", args: []string{"--set", "agent.nvml.runtimeClassName=nvidia", "--set", "runtimeClassName=nvidia-cdi"},
			wantEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}, wantRuntime: "nvidia-cdi"},
		{name: "host library folder", args: []string{"--set", "agent.nvml.mode=hostPath", "--set", "agent.nvml.hostLibraryDir=/home/kubernetes/bin/nvidia/lib64"},
			wantEnv: map[string]string{"LD_LIBRARY_PATH": "/usr/local/lib:/usr/local/nvidia/lib64"}, wantHostLibs: "/home/kubernetes/bin/nvidia/lib64"},
		{name: "none", args: []string{"--set", "agent.nvml.mode=none", "--set", "agent.nvml.runtimeClassName=nvidia"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := typed[appsv1.DaemonSet](t, h.template(t, tc.args...), "DaemonSet", "pxn-agent")
			c := onlyContainer(t, ds)
			for _, e := range c.Env {
				if strings.HasPrefix(e.Name, "NVIDIA_") || e.Name == "LD_LIBRARY_PATH" {
					if want, ok := tc.wantEnv[e.Name]; !ok || e.Value != want {
						t.Errorf("env %s=%q, want %q (set: %v)", e.Name, e.Value, want, ok)
					}
				}
			}
			for name := range tc.wantEnv {
				if envVar(c, name) == nil {
					t.Errorf("no %s env", name)
				}
			}
			if got := ptrValue(ds.Spec.Template.Spec.RuntimeClassName); got != tc.wantRuntime {
				t.Errorf("runtimeClassName %q, want %q", got, tc.wantRuntime)
			}
			if tc.wantHostLibs != "" {
				checkHostMount(t, ds, tc.wantHostLibs, "/usr/local/nvidia/lib64", true)
			} else {
				for _, m := range c.VolumeMounts {
					if m.MountPath == "/usr/local/nvidia/lib64" {
						t.Errorf("driver library folder mounted in mode %s", tc.name)
					}
				}
			}
		})
	}
}

func ptrValue(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// TestTemplateNodeRestriction checks that the chart renders its
// ValidatingAdmissionPolicy whenever the agent gets its RBAC, or fails
// saying why, unless told to go without it.
func TestTemplateNodeRestriction(t *testing.T) {
	h := newHelm(t)
	const ack = "rbac.acknowledgeNoNodeRestriction=true"
	for _, tc := range []struct {
		name    string
		args    []string
		want    bool
		wantErr string
	}{
		{"default", nil, true, ""},
		{"turned off", []string{"--set", "rbac.nodeRestriction=false"}, false, "set rbac.acknowledgeNoNodeRestriction=true"},
		{"turned off, acknowledged", []string{"--set", "rbac.nodeRestriction=false", "--set", ack}, false, ""},
		{"no RBAC", []string{"--set", "rbac.create=false"}, false, ""},
		{"no agent", []string{"--set", "agent.enabled=false"}, false, ""},
		{"an API server without the v1 policy API", []string{"--kube-version", "v1.29.0"}, false, "Kubernetes v1.29.0 does not serve"},
		{"an API server without the v1 policy API, acknowledged", []string{"--kube-version", "v1.29.0", "--set", ack}, false, ""},
		{"a server that lists the API", []string{"--kube-version", "v1.29.0", "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"}, true, ""},
		{"acknowledged where served", []string{"--set", ack}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := h.run(append([]string{"template", "pxn", chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, tc.args...)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("helm template %v = %v, want a failure saying %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decodeObjects(out)
			if err != nil {
				t.Fatal(err)
			}
			policy := find(objs, "ValidatingAdmissionPolicy", "pxn-agent-node-restriction")
			binding := find(objs, "ValidatingAdmissionPolicyBinding", "pxn-agent-node-restriction")
			if (policy != nil) != tc.want || (binding != nil) != tc.want {
				t.Fatalf("policy rendered %v, binding %v; want %v", policy != nil, binding != nil, tc.want)
			}
			if !tc.want {
				return
			}
			cond, _, _ := unstructured.NestedSlice(policy.Object, "spec", "matchConditions")
			if len(cond) != 1 || !strings.Contains(fmt.Sprint(cond[0]), "'system:serviceaccount:"+namespace+":pxn-agent'") {
				t.Errorf("matchConditions %v, want the agent's service account", cond)
			}
		})
	}
}
