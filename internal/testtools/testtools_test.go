// SPDX-License-Identifier: Apache-2.0

package testtools

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The five Kubernetes programs are links to one binary that picks the
// program by the name it runs as: each name must run its own program, stamped
// with the version hack/tools.sh builds.
func TestKubernetesProgramsRunByName(t *testing.T) {
	out, err := exec.Command("bash", filepath.Join(RepoRoot(), "hack", "tools.sh"), "version", "kubelet").Output()
	if err != nil {
		t.Fatalf("tools.sh version kubelet: %v", err)
	}
	version := strings.TrimSpace(string(out))
	for _, tc := range []struct {
		name, versionArgs, wantVersion string
	}{
		{"kube-apiserver", "--version", "Kubernetes " + version},
		{"kube-controller-manager", "--version", "Kubernetes " + version},
		{"kube-scheduler", "--version", "Kubernetes " + version},
		{"kubelet", "--version", "Kubernetes " + version},
		{"kubectl", "version --client", "Client Version: " + version},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := Require(t, tc.name)
			help, err := exec.Command(bin, "--help").CombinedOutput()
			if err != nil {
				t.Fatalf("%s --help: %v\n%s", bin, err, help)
			}
			if want := "Usage:\n  " + tc.name + " ["; !strings.Contains(string(help), want) {
				t.Errorf("%s --help does not show %q: another program ran\n%.400s", bin, want, help)
			}
			got, err := exec.Command(bin, strings.Fields(tc.versionArgs)...).CombinedOutput()
			if err != nil {
				t.Fatalf("%s %s: %v\n%s", bin, tc.versionArgs, err, got)
			}
			if !strings.Contains(string(got), tc.wantVersion) {
				t.Errorf("%s %s = %q, want it to contain %q", bin, tc.versionArgs, got, tc.wantVersion)
			}
		})
	}
}
