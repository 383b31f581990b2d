// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/rail"
)

type discoverConfig struct {
	rail   rail.Options
	output string
}

func newDiscoverCommand(ctx context.Context) *cobra.Command {
	c := &discoverConfig{}
	cmd := &cobra.Command{
		Use:   "discover",
		Short: "Print the node's GPUs, HCAs, PCIe distances and rails",
		Long: `Prints the node's GPUs, HCAs, PCIe distances and rails without contacting Kubernetes.
Exits 0 when the node is ready for PXN, 3 when it is not (the layout is
printed all the same, and stderr says why), 1 when discovery failed and 2 on
bad usage.`,
		Example: `  pxn-agent discover
  pxn-agent discover --host-root /host -o json
  pxn-agent discover -o railmap    # the ` + contract.EnvRailMap + ` a pod on this node gets`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.run(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	bindRailFlags(cmd.Flags(), &c.rail)
	cmd.Flags().StringVarP(&c.output, "output", "o", "table", "output format: table, json, or railmap (the rail map alone, as "+contract.EnvRailMap+")")
	return cmd
}

// exitNotReady is discover's exit status for a node that is not ready.
const exitNotReady = 3

// run prints the node's layout; a failed discovery exits 1, a node that is
// not ready exitNotReady.
func (c *discoverConfig) run(ctx context.Context, stdout, stderr io.Writer) error {
	if c.output != "table" && c.output != "json" && c.output != "railmap" {
		return fmt.Errorf("output format %q: want table, json or railmap", c.output)
	}
	layout, err := rail.Discover(ctx, c.rail)
	if err != nil {
		return cli.Failed(err)
	}
	for _, w := range layout.Warnings {
		fmt.Fprintf(stderr, "pxn-agent discover: warning: %s\n", w)
	}
	if c.output == "json" {
		b, err := json.MarshalIndent(layout, "", "  ")
		if err != nil {
			return cli.Failed(err)
		}
		fmt.Fprintf(stdout, "%s\n", b)
	} else if c.output == "railmap" {
		fmt.Fprintln(stdout, layout.RailMapJSON())
	} else {
		discoverTable(stdout, layout)
	}
	return notReady(layout, c.rail.NodeRoot)
}

// notReady is the exit of a node that is not ready, saying why; nil when it
// is. Where nothing at all was found, the host root is the likely mistake.
func notReady(l *rail.Layout, nodeRoot string) error {
	ready, why := l.Ready()
	if ready {
		return nil
	}
	err := fmt.Errorf("node not ready: %s", why)
	if len(l.GPUs) == 0 && len(l.HCAs) == 0 {
		err = fmt.Errorf("node not ready: no GPU and no HCA under %s: is --host-root the folder where the host's / is visible?", filepath.Join(nodeRoot, "sys"))
	}
	return cli.ExitError{Code: exitNotReady, Err: err}
}

// discoverTable writes the layout for an operator: GPUs with their nearest
// HCA and rail, then HCAs with their port state, then the verdict.
func discoverTable(w io.Writer, l *rail.Layout) {
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tPCI BUS ID\tNUMA\tHCA\tDISTANCE\tRAIL")
	for _, g := range l.GPUs {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", g.Index, g.PCIBusID, g.NUMANode, dash(g.HCA), dash(g.Distance), dash(g.Rail))
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HCA\tPCI BUS ID\tNUMA\tPORT\tLINK\tSTATE\tPHYS STATE\tRATE\tNETDEV\tRAIL")
	for _, h := range l.HCAs {
		port := "-"
		if h.Port > 0 {
			port = strconv.Itoa(h.Port)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, h.PCIBusID, h.NUMANode, port,
			dash(h.LinkLayer), dash(h.State), dash(h.PhysState), dash(h.Rate), dash(h.Netdev), dash(h.Rail))
	}
	tw.Flush()
	fmt.Fprintln(w)
	ready, why := l.Ready()
	verdict := "ready: yes"
	if !ready {
		verdict = "ready: no (" + why + ")"
	}
	summary := fmt.Sprintf("strategy %s, %d rails, GPUs from %s; %s", l.Strategy, l.Rails, l.GPUSource, verdict)
	if n := len(l.Warnings); n > 0 {
		summary += fmt.Sprintf("; %d warnings on stderr", n)
	}
	fmt.Fprintln(w, summary)
}
