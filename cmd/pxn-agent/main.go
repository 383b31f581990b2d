// SPDX-License-Identifier: Apache-2.0

// Command pxn-agent is PXN's node agent. Subcommands:
//
//	pxn-agent run         discover the node's rails and publish its PxnRailMap (the default)
//	pxn-agent discover    print the node's layout without contacting Kubernetes
//	pxn-agent inspect     show the live engine registries under a folder
//	pxn-agent remove-labels   remove PXN's labels from every node (the chart's post-delete hook)
//	pxn-agent version     print the version
//
// Every flag can also be set from the environment, PXN_AGENT_<FLAG> (see
// docs/operations.md); --node-name reads NODE_NAME, as in every binary.
package main

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/daemon"
)

// envPrefix is the prefix of the agent's environment variables.
const envPrefix = "PXN_AGENT"

func main() { daemon.Main(execute) }

// execute runs the command line args: exit 0, 1 when the command failed, 2
// on bad usage. No arguments, or flags without a subcommand, are run's, as
// before subcommands existed.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		args = []string{"run"}
	} else if len(args[0]) > 1 && args[0][0] == '-' {
		switch args[0] {
		case "-h", "--help", "--version":
		default:
			args = append([]string{"run"}, args...)
		}
	}
	return cli.Execute(newRootCommand(ctx, stdout, stderr, nil), args, stderr)
}

// newRootCommand builds the command tree; onRun, when not nil, receives run's
// configuration instead of running the agent.
func newRootCommand(ctx context.Context, stdout, stderr io.Writer, onRun func(*runConfig) error) *cobra.Command {
	root := &cobra.Command{
		Use:   "pxn-agent",
		Short: "PXN's node agent",
		Long: `pxn-agent discovers a GPU node's rails (which HCA serves which GPU), publishes
them as the node's PxnRailMap and labels the node. Without a subcommand it runs
the agent (pxn-agent run).`,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(
		newRunCommand(ctx, onRun),
		newDiscoverCommand(ctx),
		newInspectCommand(),
		newRemoveLabelsCommand(ctx),
		newVerifyNodeCommand(ctx),
	)
	cli.Setup(root, envPrefix, nil)
	return root
}
