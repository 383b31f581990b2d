// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestCLI runs the binary's help, version and usage errors as a user would.
func TestCLI(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"-h"}, 0, []string{"Usage:", "pxn-bench [command]", "run ", "soak "}},
		{[]string{"--help"}, 0, []string{"Available Commands:"}},
		{[]string{"help"}, 0, []string{"Available Commands:"}},
		{nil, 0, []string{"Available Commands:"}},
		{[]string{"help", "run"}, 0, []string{"--device", "--pattern", "--registry-root", "--suite"}},
		{[]string{"run", "-h"}, 0, []string{"--alloc-pass", "--credit-timeout", "--hold-after"}},
		{[]string{"--version"}, 0, []string{"pxn-bench ", "revision"}},
		{[]string{"frobnicate"}, 2, []string{`unknown command "frobnicate"`}},
		{[]string{"run", "--frobnicate"}, 2, []string{"unknown flag: --frobnicate"}},
		{[]string{"run", "extra"}, 2, []string{`takes no arguments`}},
		{[]string{"run", "--bytes", "lots"}, 2, []string{`--bytes: size "lots"`}},
		{[]string{"run", "--device", "tpu", "--ranks", "2", "--bytes", "1KiB"}, 1, []string{`--device "tpu": want host or cuda`}},
		{[]string{"run", "--suite", "p1"}, 1, []string{"--device cuda"}},
		{[]string{"run", "--raw"}, 2, []string{"--raw", "--device cuda"}},
		{[]string{"run", "--arena-share", "posix"}, 2, []string{`--arena-share: arena share "posix": want auto, ipc or fd`}},
		{[]string{"help", "run"}, 0, []string{"--pidns", "--arena-share"}},
		{[]string{"run", "--ranks", "2", "--pattern", "kv", "--kv-shape", "kv-huge"}, 1, []string{`--kv-shape "kv-huge": want one of kv-small, kv-medium, kv-large`}},
		{[]string{"run", "--ranks", "2", "--pattern", "kv", "--kv-traffic", "ring"}, 1, []string{`--kv-traffic "ring"`}},
		{[]string{"run", "--ranks", "2", "--pattern", "kv", "--latency", "10"}, 1, []string{"--pattern kv: --raw, --latency"}},
		{[]string{"help", "run"}, 0, []string{"--kv-shape", "--kv-traffic", "--kv-requests", "--kv-inflight", "--first-piece"}},
		{[]string{"run", "--first-piece", "2KiB"}, 2, []string{`--first-piece "2KiB": want a whole number of KiB from 4KiB to 8192KiB`}},
		{[]string{"run", "--first-piece", "16MiB"}, 2, []string{`--first-piece "16MiB"`}},
		{[]string{"run", "--first-piece", "5000"}, 2, []string{`--first-piece "5000"`}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, err := exec.Command(benchBin, tt.args...).CombinedOutput()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.code {
				t.Errorf("exit status %d, want %d\n%s", code, tt.code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
