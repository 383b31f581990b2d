// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/version"
)

// TestCommandLine: help, --version and bad usage, in-process; none of these
// starts the plugin.
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
			"Usage:\n  pxn-device-plugin [flags]", "--devices int", "[$PXN_DEVICE_PLUGIN_DEVICES]",
			"--static-file string", "[$PXN_DEVICE_PLUGIN_STATIC_FILE]", "Logging flags:\n", "-v, --v Level"}},
		{name: "version flag", args: []string{"--version"}, stdout: []string{"pxn-device-plugin " + version.String() + " (revision "}},
		{name: "version command", args: []string{"version"}, stdout: []string{"pxn-device-plugin " + version.String() + " (revision "}},
		{name: "unknown flag", args: []string{"--no-such-flag"}, code: 2, stderr: "pxn-device-plugin: unknown flag: --no-such-flag"},
		{name: "argument", args: []string{"extra"}, code: 2, stderr: `unknown command "extra" for "pxn-device-plugin"`},
		{name: "bad flag value", args: []string{"--gc-grace=0s"}, code: 2, stderr: "--gc-grace=0s: must be positive"},
		{name: "value from the environment", env: map[string]string{"PXN_DEVICE_PLUGIN_GC_GRACE": "-1s"}, code: 2,
			stderr: "--gc-grace=-1s: must be positive"},
		{name: "flag wins over the environment", args: []string{"--pod-lookup-timeout=0s"},
			env: map[string]string{"PXN_DEVICE_PLUGIN_POD_LOOKUP_TIMEOUT": "1s"}, code: 2, stderr: "--pod-lookup-timeout=0s: must be positive"},
		{name: "metrics flag", args: []string{"--help"}, stdout: []string{"--metrics-bind-address string", `address of the Prometheus /metrics endpoint; "0"`, `/readyz (the daemon is ready); "0" disables`}},
		{name: "the retired metrics flag", args: []string{"--metrics-addr=:1"}, code: 2, stderr: "pxn-device-plugin: unknown flag: --metrics-addr"},
		{name: "bad rail strategy", args: []string{"--rail-strategy=nearest"}, code: 2, stderr: `pxn-device-plugin: --rail-strategy="nearest": want pci-order, subnet or static`},
		{name: "static strategy without its table", args: []string{"--rail-strategy=static"}, code: 2, stderr: "--rail-strategy=static needs --static-file"},
		{name: "no devices", args: []string{"--devices=0"}, code: 2, stderr: "pxn-device-plugin: --devices=0: want 1..1000"},
		{name: "bad resource name", args: []string{"--resource-name=relay"}, code: 2, stderr: `pxn-device-plugin: --resource-name=relay: resource name "relay" is not <domain>/<name>`},
		{name: "bad group id", args: []string{"--group-id=.."}, code: 2, stderr: `pxn-device-plugin: --group-id=`},
		{name: "bad environment value", env: map[string]string{"PXN_DEVICE_PLUGIN_DEVICES": "many"}, code: 2,
			stderr: `PXN_DEVICE_PLUGIN_DEVICES="many" (for --devices)`},
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
	var stdout bytes.Buffer
	execute(context.Background(), []string{"--help"}, &stdout, io.Discard)
	if i, j := strings.Index(stdout.String(), "Logging flags:"), strings.Index(stdout.String(), "--shm-dir"); j < 0 || j > i {
		t.Errorf("the tool's flags are not listed before the logging flags:\n%s", stdout.String())
	}
}

// TestServerFailureEnds: when the plugin cannot serve while nothing asked it
// to stop, the command ends with exit 1 instead of waiting for its rail
// monitor and collector, which only a stop ends.
func TestServerFailureEnds(t *testing.T) {
	dir := t.TempDir()
	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--device-plugin-dir=" + filepath.Join(notADir, "plugins"), "--state-dir=" + filepath.Join(dir, "state"),
		"--shm-dir=" + filepath.Join(dir, "shm"), "--host-root=" + dir, "--metrics-bind-address=0", "--health-probe-bind-address=0"}
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() { done <- execute(context.Background(), args, io.Discard, &stderr) }()
	select {
	case code := <-done:
		if code != 1 {
			t.Fatalf("exit %d, want 1; stderr %q", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("the command still runs a minute after its server failed")
	}
}
