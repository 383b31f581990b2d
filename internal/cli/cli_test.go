// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestDeprecatedAlias: the old name sets the current flag's value and warns
// once; the current name, on the command line or from its variable, wins
// over the alias's variable; help does not list the alias.
func TestDeprecatedAlias(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		want  string
		warns int
	}{
		{name: "default", want: ":1"},
		{name: "current name", args: []string{"--metrics-bind-address=0"}, want: "0"},
		{name: "old name", args: []string{"--metrics-addr=:2"}, want: ":2", warns: 1},
		{name: "old name twice warns once", args: []string{"--metrics-addr=:2", "--metrics-addr=:3"}, want: ":3", warns: 1},
		{name: "old variable", env: map[string]string{"TOOL_METRICS_ADDR": ":4"}, want: ":4", warns: 1},
		{name: "current variable wins over the old one", env: map[string]string{"TOOL_METRICS_ADDR": ":4", "TOOL_METRICS_BIND_ADDRESS": ":5"}, want: ":5", warns: 1},
		{name: "old name on the command line wins over the current variable", args: []string{"--metrics-addr=:6"},
			env: map[string]string{"TOOL_METRICS_BIND_ADDRESS": ":5"}, want: ":6", warns: 1},
		{name: "current name on the command line wins over the old variable", args: []string{"--metrics-bind-address=:7"},
			env: map[string]string{"TOOL_METRICS_ADDR": ":4"}, want: ":7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var addr string
			var stderr bytes.Buffer
			root := &cobra.Command{Use: "tool", RunE: func(*cobra.Command, []string) error { return nil }}
			root.Flags().StringVar(&addr, "metrics-bind-address", ":1", "address")
			DeprecatedAlias(root.Flags(), "metrics-addr", "metrics-bind-address", &stderr)
			Setup(root, "TOOL", nil)
			if code := Execute(root, tc.args, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if addr != tc.want {
				t.Errorf("address %q, want %q", addr, tc.want)
			}
			if n := strings.Count(stderr.String(), "warning: --metrics-addr is deprecated and will be removed; use --metrics-bind-address"); n != tc.warns {
				t.Errorf("%d warnings, want %d:\n%s", n, tc.warns, stderr.String())
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	c := VersionCommand("tool")
	c.SetOut(&out)
	c.SetArgs(nil)
	if err := c.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "tool ") || !strings.Contains(out.String(), "(revision ") {
		t.Errorf("version line %q", out.String())
	}
}
