// SPDX-License-Identifier: Apache-2.0

package chart_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// daemonAccess is everything a node daemon's pod may reach on its node and
// in the API: a new mount, capability or verb fails TestDaemonHostAccess
// until it is added to the table on purpose (and to docs/security.md).
type daemonAccess struct {
	// mounts: host path -> "<container path> ro" or "<container path> rw".
	mounts map[string]string
	// user is the container's uid; nonRoot says runAsNonRoot is set.
	user    int64
	nonRoot bool
	caps    []string // added, sorted; every other capability is dropped
	// rules: "group/resource" (cluster-wide) or "namespace:group/resource"
	// -> sorted verbs, of every role bound to the daemon's service account.
	rules map[string][]string
}

var (
	sysfsMounts = map[string]string{
		"/sys/class":   "/host/sys/class ro",
		"/sys/bus/pci": "/host/sys/bus/pci ro",
		"/sys/devices": "/host/sys/devices ro",
	}
	agentRules = map[string][]string{
		"pxn.io/pxnrailmaps":           {"create", "list", "patch", "watch"},
		"pxn.io/pxnrailmaps/status":    {"patch"},
		"/nodes":                       {"list", "patch", "watch"},
		"default:events.k8s.io/events": {"create"},
	}
	devicePluginRules = map[string][]string{"/pods": {"get"}}
	draRules          = map[string][]string{
		"resource.k8s.io/resourceclaims": {"get"},
		"resource.k8s.io/resourceslices": {"create", "delete", "list", "update", "watch"},
		"/pods":                          {"get"},
		"/nodes":                         {"get"},
	}
	metricsAuthRules = map[string][]string{
		"authentication.k8s.io/tokenreviews":        {"create"},
		"authorization.k8s.io/subjectaccessreviews": {"create"},
	}
)

// with returns base's mounts plus more (a value "" removes a path).
func with(base map[string]string, more map[string]string) map[string]string {
	out := maps.Clone(base)
	for k, v := range more {
		if v == "" {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return out
}

func rulesOf(sets ...map[string][]string) map[string][]string {
	out := map[string][]string{}
	for _, s := range sets {
		for k, v := range s {
			if v != nil {
				out[k] = v
			}
		}
	}
	return out
}

func agentRanksOn(more map[string]string) daemonAccess {
	return daemonAccess{
		mounts: with(sysfsMounts, with(map[string]string{
			"/dev/shm/pxn":                   "/dev/shm/pxn ro",
			"/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources ro",
		}, more)),
		caps:  []string{"DAC_READ_SEARCH"},
		rules: rulesOf(agentRules),
	}
}

func devicePlugin() daemonAccess {
	return daemonAccess{
		mounts: with(sysfsMounts, map[string]string{
			"/var/lib/kubelet/device-plugins": "/var/lib/kubelet/device-plugins rw",
			"/var/lib/kubelet/pod-resources":  "/var/lib/kubelet/pod-resources ro",
			"/run/pxn":                        "/run/pxn rw",
			"/dev/shm/pxn":                    "/dev/shm/pxn rw",
		}),
		caps:  []string{"DAC_OVERRIDE", "FOWNER"},
		rules: rulesOf(devicePluginRules),
	}
}

func draPlugin() daemonAccess {
	return daemonAccess{
		mounts: with(sysfsMounts, map[string]string{
			"/var/lib/kubelet/plugins/pxn.io":   "/var/lib/kubelet/plugins/pxn.io rw",
			"/var/lib/kubelet/plugins_registry": "/var/lib/kubelet/plugins_registry rw",
			"/var/run/cdi":                      "/var/run/cdi rw",
			"/run/pxn-dra":                      "/run/pxn-dra rw",
			"/dev/shm/pxn-dra":                  "/dev/shm/pxn-dra rw",
		}),
		caps:  []string{"DAC_OVERRIDE", "FOWNER"},
		rules: rulesOf(draRules),
	}
}

// TestDaemonHostAccess renders the chart with its defaults and with each
// value that changes what a daemon reaches, and compares, per daemon, the
// host paths it mounts and how, its user and capabilities, its pod's
// namespaces and seccomp profile, and the RBAC rules bound to its service
// account with the table above.
func TestDaemonHostAccess(t *testing.T) {
	h := newHelm(t)
	withAuth := func(a daemonAccess) daemonAccess {
		a.rules = rulesOf(a.rules, metricsAuthRules)
		return a
	}
	for _, tc := range []struct {
		name string
		args []string
		want map[string]daemonAccess // by component; nil: not rendered
	}{
		{
			name: "defaults",
			want: map[string]daemonAccess{"agent": agentRanksOn(nil), "device-plugin": devicePlugin()},
		},
		{
			name: "rank metrics off: the agent reads sysfs alone, as a user with no capability",
			args: []string{"--set", "agent.rankMetrics.enabled=false"},
			want: map[string]daemonAccess{
				"agent":         {mounts: sysfsMounts, user: 65532, nonRoot: true, rules: rulesOf(agentRules)},
				"device-plugin": devicePlugin(),
			},
		},
		{
			name: "with the DRA driver",
			args: []string{"--set", "dra.enabled=true"},
			want: map[string]daemonAccess{
				"agent":         agentRanksOn(map[string]string{"/dev/shm/pxn-dra": "/dev/shm/pxn-dra ro"}),
				"device-plugin": devicePlugin(),
				"dra-plugin":    draPlugin(),
			},
		},
		{
			name: "metrics behind authentication",
			args: []string{"--set", "dra.enabled=true", "--set", "metricsAuth.enabled=true"},
			want: map[string]daemonAccess{
				"agent":         withAuth(agentRanksOn(map[string]string{"/dev/shm/pxn-dra": "/dev/shm/pxn-dra ro"})),
				"device-plugin": withAuth(devicePlugin()),
				"dra-plugin":    withAuth(draPlugin()),
			},
		},
		{
			name: "the driver's NVML library from a host folder",
			args: []string{"--set", "agent.nvml.mode=hostPath", "--set", "agent.nvml.hostLibraryDir=/run/nvidia/driver/usr/lib64"},
			want: map[string]daemonAccess{
				"agent":         agentRanksOn(map[string]string{"/run/nvidia/driver/usr/lib64": "/usr/local/nvidia/lib64 ro"}),
				"device-plugin": devicePlugin(),
			},
		},
		{
			name: "other host folders",
			args: []string{"--set", "hostSysPath=/mnt/host-sys/", "--set", "dra.enabled=true", "--set", "devicePlugin.enabled=false",
				"--set", "dra.kubeletPluginsDir=/var/lib/k0s/kubelet/plugins", "--set", "dra.shmDir=/dev/shm/claims"},
			want: map[string]daemonAccess{
				"agent": {
					mounts: map[string]string{
						"/mnt/host-sys/class":            "/host/sys/class ro",
						"/mnt/host-sys/bus/pci":          "/host/sys/bus/pci ro",
						"/mnt/host-sys/devices":          "/host/sys/devices ro",
						"/dev/shm/pxn":                   "/dev/shm/pxn ro",
						"/dev/shm/claims":                "/dev/shm/claims ro",
						"/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources ro",
					},
					caps:  []string{"DAC_READ_SEARCH"},
					rules: rulesOf(agentRules),
				},
				"dra-plugin": {
					mounts: map[string]string{
						"/mnt/host-sys/class":                 "/host/sys/class ro",
						"/mnt/host-sys/bus/pci":               "/host/sys/bus/pci ro",
						"/mnt/host-sys/devices":               "/host/sys/devices ro",
						"/var/lib/k0s/kubelet/plugins/pxn.io": "/var/lib/k0s/kubelet/plugins/pxn.io rw",
						"/var/lib/kubelet/plugins_registry":   "/var/lib/kubelet/plugins_registry rw",
						"/var/run/cdi":                        "/var/run/cdi rw",
						"/run/pxn-dra":                        "/run/pxn-dra rw",
						"/dev/shm/claims":                     "/dev/shm/claims rw",
					},
					caps:  []string{"DAC_OVERRIDE", "FOWNER"},
					rules: rulesOf(draRules),
				},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := h.template(t, tc.args...)
			for _, comp := range []string{"agent", "device-plugin", "dra-plugin"} {
				want, on := tc.want[comp]
				if !on {
					if o := find(objs, "DaemonSet", "pxn-"+comp); o != nil {
						t.Errorf("DaemonSet %s rendered", o.GetName())
					}
					continue
				}
				ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet", "pxn-"+comp)
				checkAccess(t, comp, objs, ds, want)
			}
		})
	}
}

// TestDaemonSecurityContextValue: a daemon's securityContext value, when
// set, is the container's securityContext as it is; the pod keeps its
// seccomp profile.
func TestDaemonSecurityContextValue(t *testing.T) {
	objs := newHelm(t).template(t, "--set", "agent.securityContext.runAsUser=1000", "--set", "agent.securityContext.runAsNonRoot=true")
	ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet", "pxn-agent")
	sc := onlyContainer(t, ds).SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 1000 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.Capabilities != nil || sc.ReadOnlyRootFilesystem != nil {
		t.Errorf("agent securityContext %+v, want the value as it is", sc)
	}
	if p := ds.Spec.Template.Spec.SecurityContext; p == nil || p.SeccompProfile == nil || p.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("agent pod securityContext %+v, want seccomp RuntimeDefault", p)
	}
}

func checkAccess(t *testing.T, comp string, objs []*unstructured.Unstructured, ds *appsv1.DaemonSet, want daemonAccess) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	c := onlyContainer(t, ds)

	hostVolumes := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostVolumes[v.Name] = v.HostPath.Path
		}
	}
	got := map[string]string{}
	for _, m := range c.VolumeMounts {
		p, ok := hostVolumes[m.Name]
		if !ok {
			continue
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		if prev, dup := got[p]; dup {
			t.Errorf("%s: host %s mounted twice (%s, %s %s)", comp, p, prev, m.MountPath, mode)
		}
		got[p] = m.MountPath + " " + mode
		delete(hostVolumes, m.Name)
	}
	for name, p := range hostVolumes {
		t.Errorf("%s: hostPath volume %s (%s) is not mounted", comp, name, p)
	}
	if !maps.Equal(got, want.mounts) {
		t.Errorf("%s host mounts:\n got %s\nwant %s", comp, sortedPairs(got), sortedPairs(want.mounts))
	}

	if spec.HostPID || spec.HostIPC || spec.HostNetwork {
		t.Errorf("%s: hostPID %v hostIPC %v hostNetwork %v, want none", comp, spec.HostPID, spec.HostIPC, spec.HostNetwork)
	}
	if p := spec.SecurityContext; p == nil || p.SeccompProfile == nil || p.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod securityContext %+v, want seccomp RuntimeDefault", comp, p)
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Fatalf("%s: no container securityContext", comp)
	}
	var caps []string
	if sc.Capabilities != nil {
		for _, a := range sc.Capabilities.Add {
			caps = append(caps, string(a))
		}
		slices.Sort(caps)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(caps, want.caps) {
		t.Errorf("%s: capabilities %+v, want drop ALL, add %v", comp, sc.Capabilities, want.caps)
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != want.user || (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) != want.nonRoot {
		t.Errorf("%s: runAsUser %v runAsNonRoot %v, want %d, %v", comp, ptrString(sc.RunAsUser), ptrString(sc.RunAsNonRoot), want.user, want.nonRoot)
	}
	if sc.RunAsGroup == nil || *sc.RunAsGroup != want.user {
		t.Errorf("%s: runAsGroup %v, want %d", comp, ptrString(sc.RunAsGroup), want.user)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		(sc.Privileged != nil && *sc.Privileged) {
		t.Errorf("%s: readOnlyRootFilesystem %v allowPrivilegeEscalation %v privileged %v, want a read-only root, no escalation, unprivileged",
			comp, ptrString(sc.ReadOnlyRootFilesystem), ptrString(sc.AllowPrivilegeEscalation), ptrString(sc.Privileged))
	}

	rules := boundRules(t, objs, spec.ServiceAccountName, ds.Namespace)
	if !maps.EqualFunc(rules, want.rules, slices.Equal) {
		t.Errorf("%s RBAC:\n got %v\nwant %v", comp, rules, want.rules)
	}
}

// boundRules collects the rules of every Role and ClusterRole bound to the
// service account, keyed as daemonAccess.rules.
func boundRules(t *testing.T, objs []*unstructured.Unstructured, sa, ns string) map[string][]string {
	t.Helper()
	got := map[string][]string{}
	add := func(scope string, rules []rbacv1.PolicyRule) {
		for _, r := range rules {
			if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
				t.Errorf("service account %s: rule %+v names objects or URLs", sa, r)
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					k := scope + g + "/" + res
					got[k] = append(got[k], r.Verbs...)
					slices.Sort(got[k])
					got[k] = slices.Compact(got[k])
				}
			}
		}
	}
	subject := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == ns
		})
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRoleBinding":
			b := typed[rbacv1.ClusterRoleBinding](t, objs, o.GetKind(), o.GetName())
			if subject(b.Subjects) {
				add("", typed[rbacv1.ClusterRole](t, objs, "ClusterRole", b.RoleRef.Name).Rules)
			}
		case "RoleBinding":
			b := typed[rbacv1.RoleBinding](t, objs, o.GetKind(), o.GetName())
			if !subject(b.Subjects) {
				continue
			}
			if b.RoleRef.Kind == "ClusterRole" {
				add(o.GetNamespace()+":", typed[rbacv1.ClusterRole](t, objs, "ClusterRole", b.RoleRef.Name).Rules)
			} else {
				add(o.GetNamespace()+":", typed[rbacv1.Role](t, objs, "Role", b.RoleRef.Name).Rules)
			}
		}
	}
	return got
}

func sortedPairs(m map[string]string) string {
	var s []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		s = append(s, k+" -> "+m[k])
	}
	return "[" + strings.Join(s, ", ") + "]"
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "<unset>"
	}
	return fmt.Sprint(*p)
}
