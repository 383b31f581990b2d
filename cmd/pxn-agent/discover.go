package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"

	"github.com/pxn-project/pxn/pkg/rail"
)

func discoverMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return discoverRun(ctx, args, os.Stdout, os.Stderr)
}

// discoverRun prints the node's layout: exit 0 when discovered, 1 when
// discovery failed, 2 on bad usage.
func discoverRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pxn-agent discover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	hostRoot := fs.String("host-root", "/", "folder where the host's / is visible (its sys/ is read)")
	strategy := fs.String("rail-strategy", rail.StrategyPCIOrder, "how rails are named: pci-order, subnet or static")
	prefixLen := fs.Int("subnet-prefix-len", rail.DefaultSubnetPrefixLen, "IPv4 prefix length of the subnet strategy")
	staticFile := fs.String("static-file", "", "static strategy: JSON object of HCA name to rail name")
	output := fs.String("o", "table", "output format: table or json")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: pxn-agent discover [--host-root DIR] [--rail-strategy pci-order|subnet|static] [--subnet-prefix-len N] [--static-file F] [-o table|json]")
		fmt.Fprintln(stderr, "Prints the node's GPUs, HCAs, PCIe distances and rails without contacting Kubernetes.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pxn-agent discover: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "pxn-agent discover: output format %q: want table or json\n", *output)
		return 2
	}
	layout, err := rail.Discover(ctx, rail.Options{
		HostRoot:        *hostRoot,
		Strategy:        *strategy,
		SubnetPrefixLen: *prefixLen,
		StaticFile:      *staticFile,
	})
	if err != nil {
		fmt.Fprintf(stderr, "pxn-agent discover: %v\n", err)
		return 1
	}
	for _, w := range layout.Warnings {
		fmt.Fprintf(stderr, "pxn-agent discover: warning: %s\n", w)
	}
	if *output == "json" {
		b, err := json.MarshalIndent(layout, "", "  ")
		if err != nil {
			fmt.Fprintf(stderr, "pxn-agent discover: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s\n", b)
		return 0
	}
	discoverTable(stdout, layout)
	return 0
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
