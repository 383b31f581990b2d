// SPDX-License-Identifier: Apache-2.0

// Package clitest checks a PXN binary's command tree against the one
// spelling of each flag that several binaries share. Every binary's tests
// run CheckFlags on its root command, so that the flags of any two binaries
// that mean the same thing agree in name, shorthand, type and default.
package clitest

import (
	"fmt"
	"sort"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/railflags"
)

// Shared is the one definition of every flag that several binaries share
// with the same default: bound by the same binders the binaries use.
func Shared() *pflag.FlagSet {
	fs := pflag.NewFlagSet("shared", pflag.ContinueOnError)
	fs.AddFlagSet(cli.LoggingFlags())
	fs.BoolP("help", "h", false, "")
	fs.Bool("version", false, "")
	fs.String("kubeconfig", "", "")
	var node string
	cli.BindNodeName(fs, &node)
	var rails railflags.Flags
	rails.Bind(fs)
	return fs
}

// PerBinary lists the flags that several binaries share with one name,
// shorthand and type but a default of each binary's own (a port, a folder).
var PerBinary = map[string]struct{ Shorthand, Type string }{
	"metrics-bind-address":      {"", "string"},
	"health-probe-bind-address": {"", "string"},
	"metrics-secure":            {"", "bool"},
	"state-dir":                 {"", "string"},
	"shm-dir":                   {"", "string"},
	"container-registry-root":   {"", "string"},
	"group-id":                  {"", "string"},
	"resource-name":             {"", "string"},
	"pod-resources-socket":      {"", "string"},
	"rediscover-interval":       {"", "duration"},
	"output":                    {"o", "string"},
	"json":                      {"", "string"},
}

// Retired lists former spellings of shared flags, with the one that
// replaced them.
var Retired = map[string]string{
	"node":         "node-name",
	"metrics-addr": "metrics-bind-address",
}

// Problems lists where root's tree departs from the shared spellings: every
// flag of every command, hidden ones too, and the root's version flag and
// command.
func Problems(root *cobra.Command) []string {
	shared := Shared()
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.InitDefaultHelpFlag()
		if !c.HasParent() {
			c.InitDefaultVersionFlag()
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			where := c.CommandPath() + " --" + f.Name
			if now, ok := Retired[f.Name]; ok {
				add("%s: retired, the flag is --%s", where, now)
			}
			if f.Shorthand == "v" && f.Name != "v" {
				add("%s: has -v, which is the log level (klog's --v) in every binary", where)
			}
			if want := shared.Lookup(f.Name); want != nil {
				if f.Shorthand != want.Shorthand || f.Value.Type() != want.Value.Type() || f.DefValue != want.DefValue {
					add("%s: -%s %s default %q; the shared flag is -%s %s default %q", where,
						f.Shorthand, f.Value.Type(), f.DefValue, want.Shorthand, want.Value.Type(), want.DefValue)
				}
			}
			if want, ok := PerBinary[f.Name]; ok && (f.Shorthand != want.Shorthand || f.Value.Type() != want.Type) {
				add("%s: -%s %s; the shared flag is -%s %s", where, f.Shorthand, f.Value.Type(), want.Shorthand, want.Type)
			}
			if env := f.Annotations["pxn.io/env"]; f.Name == "node-name" && len(env) > 0 && env[0] != cli.NodeNameEnv {
				add("%s: read from $%s; every binary reads $%s", where, env[0], cli.NodeNameEnv)
			}
		})
		if c.Runnable() && c.Flags().Lookup("v") == nil {
			add("%s: no -v/--v log level", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	if f := root.Flags().Lookup("version"); f == nil {
		add("%s: no --version", root.Name())
	}
	if v, _, err := root.Find([]string{"version"}); err != nil || v == root {
		add("%s: no version command", root.Name())
	}
	sort.Strings(out)
	return out
}

// CheckFlags fails t for every one of Problems(root).
func CheckFlags(t testing.TB, root *cobra.Command) {
	t.Helper()
	for _, p := range Problems(root) {
		t.Error(p)
	}
}
