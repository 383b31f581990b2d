// SPDX-License-Identifier: Apache-2.0

// Package cli gives PXN's commands one shape: cobra commands with pflag long
// flags, every flag of the tool readable from an environment variable, klog's
// flags in their own help section, and --version / a version subcommand.
//
// Precedence of a flag's value: the command line, then its environment
// variable, then the default.
package cli

import (
	goflag "flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/internal/version"
)

// envAnnotation is the pflag annotation that names a flag's environment
// variable.
const envAnnotation = "pxn.io/env"

// EnvName is the environment variable of a flag: PREFIX_FLAG_NAME, with the
// flag's dashes as underscores, upper case.
func EnvName(prefix, flag string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// BindEnv gives every flag of fs an environment variable: the one named in
// override, or EnvName(prefix, flag). A flag named in override with "" has
// none. The variable is shown in the flag's help.
func BindEnv(fs *pflag.FlagSet, prefix string, override map[string]string) {
	fs.VisitAll(func(f *pflag.Flag) {
		env, ok := override[f.Name]
		if !ok {
			env = EnvName(prefix, f.Name)
		}
		if env == "" {
			return
		}
		_ = fs.SetAnnotation(f.Name, envAnnotation, []string{env})
		f.Usage += " [$" + env + "]"
	})
}

// ApplyEnv sets every flag that the command line left alone from its
// environment variable, when that is set. A flag and its deprecated alias
// count as one: either given on the command line, neither variable is read,
// and the current name's variable wins over the alias's. The error names the
// variable and its value.
func ApplyEnv(fs *pflag.FlagSet) error {
	changed := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) {
		changed[f.Name] = true
		for _, t := range f.Annotations[aliasAnnotation] {
			changed[t] = true
		}
	})
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		names := f.Annotations[envAnnotation]
		if err != nil || changed[f.Name] || len(names) == 0 {
			return
		}
		if t := f.Annotations[aliasAnnotation]; len(t) > 0 && changed[t[0]] {
			return
		}
		v, ok := os.LookupEnv(names[0])
		if !ok {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("%s=%q (for --%s): %w", names[0], v, f.Name, e)
		}
	})
	return err
}

// aliasAnnotation is the pflag annotation of a deprecated alias that names
// the flag it stands for.
const aliasAnnotation = "pxn.io/alias-of"

// DeprecatedAlias adds the hidden flag old to fs as another name of the flag
// current: it sets the same value. The first time it is set, from the command
// line or its environment variable, it writes one line to warn saying so.
// Set it up before Setup, so that the alias gets its environment variable
// too.
func DeprecatedAlias(fs *pflag.FlagSet, old, current string, warn io.Writer) {
	f := fs.Lookup(current)
	if f == nil {
		panic("cli: DeprecatedAlias of unknown flag --" + current)
	}
	fs.Var(&aliasValue{Value: f.Value, old: old, current: current, warn: warn}, old, "deprecated: use --"+current)
	_ = fs.SetAnnotation(old, aliasAnnotation, []string{current})
	_ = fs.MarkHidden(old)
}

// aliasValue is the value of a deprecated alias: the current flag's value,
// and a warning on its first Set.
type aliasValue struct {
	pflag.Value
	old, current string
	warn         io.Writer
	warned       bool
}

func (a *aliasValue) Set(s string) error {
	if !a.warned {
		a.warned = true
		fmt.Fprintf(a.warn, "warning: --%s is deprecated and will be removed; use --%s\n", a.old, a.current)
	}
	return a.Value.Set(s)
}

// LoggingFlags is klog's flags as a pflag set of their own, so that help can
// show them apart from the tool's.
func LoggingFlags() *pflag.FlagSet {
	gfs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gfs)
	fs := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	fs.AddGoFlagSet(gfs)
	return fs
}

// Setup finishes a command tree: klog's flags on every command that runs
// (root's persistent flags), environment variables for the tool's own flags
// of every command, --version and a version subcommand on the root, help in
// sections, and errors printed once as "<binary>: <error>".
func Setup(root *cobra.Command, prefix string, override map[string]string) {
	logging := LoggingFlags()
	root.PersistentFlags().AddFlagSet(logging)
	root.Version = version.String()
	root.SetVersionTemplate(version.Line(root.Name()) + "\n")
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(VersionCommand(root.Name()))
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		BindEnv(c.LocalNonPersistentFlags(), prefix, override)
		c.SetUsageFunc(func(c *cobra.Command) error { return usage(c, logging) })
		c.SetHelpFunc(func(c *cobra.Command, _ []string) {
			out := c.OutOrStdout()
			if d := strings.TrimSpace(c.Long); d != "" {
				fmt.Fprintf(out, "%s\n\n", d)
			} else if c.Short != "" {
				fmt.Fprintf(out, "%s\n\n", c.Short)
			}
			_ = usage(c, logging)
		})
		if c.Runnable() {
			prev := c.PreRunE
			c.PreRunE = func(c *cobra.Command, args []string) error {
				if err := ApplyEnv(c.Flags()); err != nil {
					return err
				}
				if prev != nil {
					return prev(c, args)
				}
				return nil
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// VersionCommand is the version subcommand of binary: it prints the same
// line as --version.
func VersionCommand(binary string) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), version.Line(binary))
		},
	}
}

// usage writes a command's usage in kubectl's order: commands, the tool's
// flags, logging flags, then how to learn more.
func usage(c *cobra.Command, logging *pflag.FlagSet) error {
	w := c.OutOrStderr()
	fmt.Fprintln(w, "Usage:")
	if c.Runnable() {
		fmt.Fprintf(w, "  %s\n", c.UseLine())
	}
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(w, "  %s [command]\n", c.CommandPath())
	}
	if c.Example != "" {
		fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
	}
	if c.HasAvailableSubCommands() {
		fmt.Fprintln(w, "\nAvailable Commands:")
		subs := c.Commands()
		sort.Slice(subs, func(i, j int) bool { return subs[i].Name() < subs[j].Name() })
		for _, s := range subs {
			if s.IsAvailableCommand() {
				fmt.Fprintf(w, "  %-12s %s\n", s.Name(), s.Short)
			}
		}
	}
	own := pflag.NewFlagSet(c.Name(), pflag.ContinueOnError)
	c.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if logging.Lookup(f.Name) == nil {
			own.AddFlag(f)
		}
	})
	c.InheritedFlags().VisitAll(func(f *pflag.Flag) {
		if logging.Lookup(f.Name) == nil {
			own.AddFlag(f)
		}
	})
	if own.HasAvailableFlags() {
		fmt.Fprintf(w, "\nFlags:\n%s", own.FlagUsagesWrapped(100))
	}
	if c.Runnable() && c.Name() != "version" {
		fmt.Fprintf(w, "\nLogging flags:\n%s", logging.FlagUsagesWrapped(100))
	}
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\nUse \"%s [command] --help\" for more information about a command.\n", c.CommandPath())
	}
	return nil
}

// Execute runs root with args and returns the process's exit code: 0, 1 when
// the command failed, 2 on bad usage (flags, arguments, environment). The
// error goes to stderr once, prefixed with the command's path.
func Execute(root *cobra.Command, args []string, stderr io.Writer) int {
	root.SetArgs(args)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	if cmd == nil {
		cmd = root
	}
	if ee, ok := err.(ExitError); ok {
		if ee.Err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), ee.Err)
		}
		return ee.Code
	}
	fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
	return 2
}

// ExitError is an error a command returns to choose the exit code; a nil Err
// prints nothing (the command reported it already).
type ExitError struct {
	Code int
	Err  error
}

func (e ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit %d", e.Code)
	}
	return e.Err.Error()
}

// Failed wraps a run-time failure: exit 1.
func Failed(err error) error { return ExitError{Code: 1, Err: err} }
