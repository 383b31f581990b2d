// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestNodeNameVariable: --node-name reads NODE_NAME in every tool, never a
// variable of the tool's prefix; the command line wins over it.
func TestNodeNameVariable(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{name: "from NODE_NAME", env: map[string]string{"NODE_NAME": "a", "TOOL_NODE_NAME": "b"}, want: "a"},
		{name: "the command line wins", args: []string{"--node-name=c"}, env: map[string]string{"NODE_NAME": "a"}, want: "c"},
		{name: "no variable of the prefix", env: map[string]string{"NODE_NAME": "", "TOOL_NODE_NAME": "b"}, want: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var node string
			var stderr bytes.Buffer
			root := &cobra.Command{Use: "tool", RunE: func(*cobra.Command, []string) error { return nil }}
			BindNodeName(root.Flags(), &node)
			Setup(root, "TOOL", nil)
			if code := Execute(root, tc.args, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if node != tc.want {
				t.Errorf("node %q, want %q", node, tc.want)
			}
		})
	}
}

// TestUsageErrors: a flag's bad value exits 2 naming the flag, from the
// command line, its variable or the command's own check; a failure exits 1.
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		code   int
		stderr string
	}{
		{name: "value cobra refuses", args: []string{"--count=x"}, code: 2, stderr: `tool: invalid argument "x" for "--count" flag`},
		{name: "value from a variable", env: map[string]string{"TOOL_COUNT": "x"}, code: 2, stderr: `tool: TOOL_COUNT="x" (for --count)`},
		{name: "value the command refuses", args: []string{"--count=0"}, code: 2, stderr: "tool: --count=0: want at least 1\n"},
		{name: "failure", args: []string{"--count=2"}, code: 1, stderr: "tool: two is too many\n"},
		{name: "-v is the log level", args: []string{"-v=0", "--count=1"}, code: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var count int
			root := &cobra.Command{Use: "tool", RunE: func(*cobra.Command, []string) error {
				switch {
				case count < 1:
					return FlagError("count", count, errors.New("want at least 1"))
				case count > 1:
					return Failed(errors.New("two is too many"))
				}
				return nil
			}}
			root.Flags().IntVar(&count, "count", 1, "")
			Setup(root, "TOOL", nil)
			var stderr bytes.Buffer
			if code := Execute(root, tc.args, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr.String(), tc.code, tc.stderr)
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
