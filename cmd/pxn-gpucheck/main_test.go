// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/version"
)

// TestCommandLine runs the commands that need no GPU. Each case says what
// both streams hold: a substring of the one that should carry output, and
// the other empty, so that help printed to the wrong stream or an error
// printed beside help fails. Environment set for a case stays in it.
func TestCommandLine(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		code   int
		stdout string
		stderr string
	}{
		{name: "help", args: []string{"--help"}, stdout: "Available Commands:\n  info "},
		{name: "ring help", args: []string{"ring", "--help"}, stdout: "[$PXN_GPUCHECK_PIECES]"},
		{name: "version flag", args: []string{"--version"}, stdout: "pxn-gpucheck " + version.String() + " (revision "},
		{name: "version command", args: []string{"version"}, stdout: "pxn-gpucheck " + version.String() + " (revision "},
		{name: "unknown command", args: []string{"bench"}, code: 2, stderr: `unknown command "bench" for "pxn-gpucheck"`},
		{name: "bad flag", args: []string{"ring", "--pieces=x"}, code: 2, stderr: `pxn-gpucheck ring: invalid argument "x" for "--pieces"`},
		{name: "bad environment", args: []string{"ring"}, env: map[string]string{"PXN_GPUCHECK_WARMUP": "lots"}, code: 2,
			stderr: `PXN_GPUCHECK_WARMUP="lots" (for --warmup)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := cli.Execute(newRootCommand(&stdout, &stderr), tc.args, &stderr)
			if code != tc.code {
				t.Errorf("%q: exit %d, want %d (stdout %q, stderr %q)", tc.args, code, tc.code, stdout.String(), stderr.String())
			}
			for _, s := range []struct {
				name      string
				got, want string
			}{{"stdout", stdout.String(), tc.stdout}, {"stderr", stderr.String(), tc.stderr}} {
				if s.want == "" && s.got != "" || !strings.Contains(s.got, s.want) {
					t.Errorf("%q: %s %q, want %s", tc.args, s.name, s.got, describe(s.want))
				}
			}
		})
	}
	if v, ok := os.LookupEnv("PXN_GPUCHECK_WARMUP"); ok {
		t.Errorf("PXN_GPUCHECK_WARMUP=%q outlived the case that set it", v)
	}
}

func describe(want string) string {
	if want == "" {
		return "nothing"
	}
	return fmt.Sprintf("one holding %q", want)
}
