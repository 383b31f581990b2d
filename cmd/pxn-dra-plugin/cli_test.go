// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/version"
)

// TestCommandLine: help, --version and bad usage, in-process; none of these
// starts the driver.
func TestCommandLine(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		code   int
		stdout []string
		stderr string
	}{
		{name: "help", args: []string{"--help"}, stdout: []string{
			"Usage:\n  pxn-dra-plugin [flags]", "--cdi-dir string", `(default "/var/run/cdi")`, "[$PXN_DRA_PLUGIN_CDI_DIR]",
			`--kubelet-plugins-dir string`, `"/var/lib/kubelet/plugins")`,
			`--kubelet-registry-dir string`, `"/var/lib/kubelet/plugins_registry")`,
			`--shm-dir string`, `(default "/dev/shm/pxn-dra")`, "--container-registry-root string", "--group-id string",
			"--state-dir string", "--node-name string", "--rail-strategy string", "--static-file string", "Logging flags:\n"}},
		{name: "version flag", args: []string{"--version"}, stdout: []string{"pxn-dra-plugin " + version.String() + " (revision "}},
		{name: "unknown flag", args: []string{"--no-such-flag"}, code: 2, stderr: "pxn-dra-plugin: unknown flag: --no-such-flag"},
		{name: "argument", args: []string{"extra"}, code: 2, stderr: `unknown command "extra" for "pxn-dra-plugin"`},
		{name: "no node name", env: map[string]string{"NODE_NAME": ""}, code: 2, stderr: "--node-name is empty and NODE_NAME is not set"},
		{name: "node name from the environment, bad interval", env: map[string]string{"NODE_NAME": "n1", "PXN_DRA_PLUGIN_REDISCOVER_INTERVAL": "0s"},
			code: 2, stderr: "--rediscover-interval=0s: must be positive"},
		{name: "flag wins over the environment", args: []string{"--node-name=", "--rediscover-interval=1s"},
			env: map[string]string{"NODE_NAME": "n1"}, code: 2, stderr: "--node-name is empty"},
		{name: "the node name reads no variable of the driver's own", env: map[string]string{"NODE_NAME": "", "PXN_DRA_PLUGIN_NODE_NAME": "n1"},
			code: 2, stderr: "--node-name is empty and NODE_NAME is not set"},
		{name: "static strategy without its table", args: []string{"--node-name=n1", "--rail-strategy=static"}, code: 2,
			stderr: "pxn-dra-plugin: --rail-strategy=static needs --static-file"},
		{name: "bad container registry root", args: []string{"--node-name=n1", "--container-registry-root=relative"}, code: 2,
			stderr: "pxn-dra-plugin: --container-registry-root="},
		{name: "no API server", args: []string{"--node-name=n1", "--kubeconfig=/nonexistent/kubeconfig", "--metrics-bind-address=0", "--health-probe-bind-address=0"},
			code: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := execute(context.Background(), tc.args, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr.String(), tc.code, tc.stderr)
			}
			for _, w := range tc.stdout {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
		})
	}
}
