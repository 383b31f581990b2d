// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/version"
)

func TestCommandLine(t *testing.T) {
	tests := []struct {
		args   []string
		env    map[string]string
		code   int
		stdout string
		stderr string
	}{
		{args: []string{"--help"}, stdout: "Available Commands:\n  info "},
		{args: []string{"ring", "--help"}, stdout: "[$PXN_GPUCHECK_PIECES]"},
		{args: []string{"--version"}, stdout: "pxn-gpucheck " + version.String() + " (revision "},
		{args: []string{"version"}, stdout: "pxn-gpucheck " + version.String() + " (revision "},
		{args: []string{"bench"}, code: 2, stderr: `unknown command "bench" for "pxn-gpucheck"`},
		{args: []string{"ring", "--pieces=x"}, code: 2, stderr: `pxn-gpucheck ring: invalid argument "x" for "--pieces"`},
		{args: []string{"ring"}, env: map[string]string{"PXN_GPUCHECK_WARMUP": "lots"}, code: 2,
			stderr: `PXN_GPUCHECK_WARMUP="lots" (for --warmup)`},
	}
	for _, tc := range tests {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		var stdout, stderr bytes.Buffer
		code := cli.Execute(newRootCommand(&stdout, &stderr), tc.args, &stderr)
		if code != tc.code || !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d, %q, %q", tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
}
