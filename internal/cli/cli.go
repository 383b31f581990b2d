// SPDX-License-Identifier: Apache-2.0

// Package cli gives PXN's commands one shape: cobra commands with pflag long
// flags, every flag of the tool readable from an environment variable, klog's
// flags (-v/--v the log level) in their own help section, --version and a
// version subcommand, errors that name the flag, and exit status 2 for bad
// usage.
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

// NodeNameEnv is the environment variable of --node-name in every binary:
// the name the downward API is usually given.
const NodeNameEnv = "NODE_NAME"

// BindNodeName adds --node-name, the one spelling of this node's name; its
// variable is NodeNameEnv.
func BindNodeName(fs *pflag.FlagSet, p *string) {
	fs.StringVar(p, "node-name", "", "this node's name, as its Node object is named")
}

// FlagError is a bad value of the flag named flag: "--flag=value: err".
func FlagError(flag string, value any, err error) error {
	return fmt.Errorf("--%s=%v: %w", flag, value, err)
}

// BindEnv gives every flag of fs an environment variable: the one named in
// override, NodeNameEnv for --node-name, or EnvName(prefix, flag). A flag
// named in override with "" has none. The variable is shown in the flag's
// help.
func BindEnv(fs *pflag.FlagSet, prefix string, override map[string]string) {
	fs.VisitAll(func(f *pflag.Flag) {
		env, ok := override[f.Name]
		switch {
		case ok:
		case f.Name == "node-name":
			env = NodeNameEnv
		default:
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
// environment variable, when that is set. The error names the variable, its
// value and the flag.
func ApplyEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		names := f.Annotations[envAnnotation]
		if err != nil || f.Changed || len(names) == 0 {
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

// LoggingFlags is klog's flags as a pflag set of their own, so that help can
// show them apart from the tool's.
func LoggingFlags() *pflag.FlagSet {
	gfs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gfs)
	fs := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	fs.AddGoFlagSet(gfs)
	return fs
}

// Conventions gives root what every PXN binary has: klog's flags on every
// command (root's persistent flags; -v/--v is the log level), --version
// (no shorthand) and a version subcommand that print the same line, no
// completion command, and errors and usage left to the caller to print once.
// It returns klog's flags.
func Conventions(root *cobra.Command) *pflag.FlagSet {
	logging := LoggingFlags()
	root.PersistentFlags().AddFlagSet(logging)
	root.Version = version.String()
	root.SetVersionTemplate(version.Line(root.Name()) + "\n")
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(VersionCommand(root.Name()))
	return logging
}

// Setup finishes a command tree: Conventions, environment variables for the
// tool's own flags of every command, help in sections, and errors printed
// once as "<binary>: <error>" by Execute.
func Setup(root *cobra.Command, prefix string, override map[string]string) {
	logging := Conventions(root)
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
