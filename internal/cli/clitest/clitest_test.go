// SPDX-License-Identifier: Apache-2.0

package clitest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/railflags"
	"github.com/pxn-project/pxn/internal/testtools"
)

func run(*cobra.Command, []string) error { return nil }

// TestProblems: a tree built with the shared binders and cli.Setup has none;
// each departure from them is reported.
func TestProblems(t *testing.T) {
	good := func() *cobra.Command {
		root := &cobra.Command{Use: "tool", RunE: run}
		var node string
		var rails railflags.Flags
		cli.BindNodeName(root.Flags(), &node)
		rails.Bind(root.Flags())
		sub := &cobra.Command{Use: "sub", RunE: run}
		sub.Flags().String("metrics-bind-address", ":1", "")
		root.AddCommand(sub)
		return root
	}
	root := good()
	cli.Setup(root, "TOOL", nil)
	if p := Problems(root); len(p) != 0 {
		t.Errorf("a tree of the shared binders has problems: %q", p)
	}

	tests := []struct {
		name  string
		build func(root *cobra.Command)
		want  string
	}{
		{"retired flag", func(r *cobra.Command) { r.Flags().String("node", "", "") }, "tool --node: retired, the flag is --node-name"},
		{"other default", func(r *cobra.Command) { r.Commands()[0].Flags().String("host-root", "/host", "") }, `tool sub --host-root: - string default "/host"; the shared flag is - string default "/"`},
		{"other type", func(r *cobra.Command) { r.Commands()[0].Flags().Int("kubeconfig", 0, "") }, "tool sub --kubeconfig: - int"},
		{"per-binary flag of another type", func(r *cobra.Command) { r.Flags().Int("state-dir", 0, "") }, "tool --state-dir: - int; the shared flag is - string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := good()
			tc.build(root)
			cli.Setup(root, "TOOL", nil)
			p := strings.Join(Problems(root), "\n")
			if !strings.Contains(p, tc.want) {
				t.Errorf("problems:\n%s\nwant one containing %q", p, tc.want)
			}
		})
	}

	root = good()
	cli.Setup(root, "TOOL", map[string]string{"node-name": "TOOL_NODE"})
	if p := strings.Join(Problems(root), "\n"); !strings.Contains(p, "tool --node-name: read from $TOOL_NODE; every binary reads $NODE_NAME") {
		t.Errorf("problems:\n%s\nwant the node name's variable", p)
	}
	// Without cli.Setup, as cobra's own --version would take -v.
	root = good()
	root.Commands()[0].Flags().BoolP("verbose", "v", false, "")
	if p := strings.Join(Problems(root), "\n"); !strings.Contains(p, "tool sub --verbose: has -v, which is the log level") {
		t.Errorf("problems:\n%s\nwant -v taken", p)
	}
	root = good()
	if p := strings.Join(Problems(root), "\n"); !strings.Contains(p, "tool: no -v/--v log level") || !strings.Contains(p, "tool: no version command") {
		t.Errorf("problems of a tree without cli.Setup:\n%s", p)
	}
}

// TestEveryBinaryIsChecked: every command of cmd/ built on cobra runs
// CheckFlags on its root command in its tests.
func TestEveryBinaryIsChecked(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join(testtools.RepoRoot(), "cmd", "*"))
	if err != nil {
		t.Fatal(err)
	}
	binaries := 0
	for _, dir := range dirs {
		sources, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		cobraMain, checked := false, false
		for _, f := range sources {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(f, "_test.go") {
				checked = checked || strings.Contains(string(b), "clitest.CheckFlags(")
			} else {
				cobraMain = cobraMain || strings.Contains(string(b), `"github.com/spf13/cobra"`)
			}
		}
		if cobraMain {
			binaries++
			if !checked {
				t.Errorf("%s: no test runs clitest.CheckFlags on its root command", filepath.Base(dir))
			}
		}
	}
	if binaries < 5 {
		t.Errorf("%d binaries built on cobra under cmd/, want at least 5", binaries)
	}
}
