// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

type inspectConfig struct {
	root       string
	output     string
	staleAfter time.Duration
}

func newInspectCommand() *cobra.Command {
	c := &inspectConfig{}
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Show the live engine registries under a folder",
		Long: `Shows the ranks, lanes, counters and leftovers of the engine registries
(mooncake-pxn-* directories) under a folder, read without changing them. The
counters are each rank's running totals as its pump last published them (once
a heartbeat).`,
		Example: `  pxn-agent inspect --root /run/pxn/pxn-bench-registry-1
  pxn-agent inspect -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.run(cmd.OutOrStdout())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&c.root, "root", "/dev/shm", "folder holding the mooncake-pxn-* registry directories (the engine's "+contract.EnvRegistryRoot+")")
	fs.StringVarP(&c.output, "output", "o", "table", "output format: table or json")
	fs.DurationVar(&c.staleAfter, "stale-after", 3*time.Second, "report a rank whose heartbeat is older than this as stale")
	return cmd
}

func (c *inspectConfig) run(stdout io.Writer) error {
	if c.output != "table" && c.output != "json" {
		return cli.FlagError("output", strconv.Quote(c.output), errors.New("want table or json"))
	}
	groups, err := inspect.Root(c.root, c.staleAfter)
	if err != nil {
		return cli.Failed(err)
	}
	if c.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(groups)
	} else {
		err = writeInspectTable(stdout, c.root, groups)
	}
	if err != nil {
		return cli.Failed(err)
	}
	return nil
}

func writeInspectTable(w io.Writer, root string, groups []inspect.GroupReport) error {
	if len(groups) == 0 {
		_, err := fmt.Fprintf(w, "no registry directories under %s\n", root)
		return err
	}
	ranks := 0
	for _, g := range groups {
		ranks += len(g.Ranks)
	}
	if ranks == 0 {
		fmt.Fprintf(w, "no ranks in %d registry directories under %s\n", len(groups), root)
		return writeInspectNotes(w, groups)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tRANK FILE\tSTATE\tPID\tEPOCH\tRAIL\tHCA\tARENA\tSHARED BY\tPID NS\tJUDGED BY\tHEARTBEAT\tHEALTH")
	for _, g := range groups {
		for _, r := range g.Ranks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
				g.Group, r.File, r.State, r.Pid, r.Epoch, dash(r.Rail), dash(r.HCA), r.Arena, dash(r.Shares), r.PidNS, r.Liveness, heartbeatAge(r.HeartbeatAge), r.Health)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tRANK PID/EPOCH\tLANE\tOWNER PID/EPOCH\tLANE EPOCH\tNEXT\tPUBLISHED\tCOMPLETED\tREAPED\tOWNER JUDGED BY\tOWNER")
	for _, g := range groups {
		for _, r := range g.Ranks {
			for _, l := range r.Lanes {
				owner := "-"
				if l.OwnerPid != 0 {
					owner = strconv.Itoa(l.OwnerPid) + "/" + l.OwnerEpoch
				}
				fmt.Fprintf(tw, "%s\t%d/%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n",
					g.Group, r.Pid, r.Epoch, l.Lane, owner, dash(l.LaneEpoch),
					l.Next, l.Published, l.Completed, l.Reaped, dash(l.OwnerLiveness), freeOr(l.OwnerHealth))
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := writeInspectCounters(w, groups); err != nil {
		return err
	}
	return writeInspectNotes(w, groups)
}

// writeInspectCounters shows each rank's counters as its pump last
// published them: bytes (Pieces), fallbacks by reason.
func writeInspectCounters(w io.Writer, groups []inspect.GroupReport) error {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tRANK PID/EPOCH\tDEVICE\tRELAYED\tFORWARDED\tDIRECT\tFALLBACK\tFAILED\tCREDIT WAITS\tLANES OUT/IN\tPUMP CPU\tPUBLISHED")
	for _, g := range groups {
		for _, r := range g.Ranks {
			s := r.Stats
			if s == nil {
				fmt.Fprintf(tw, "%s\t%d/%s\t-\t%s\n", g.Group, r.Pid, r.Epoch, "counters unreadable: "+r.StatsError)
				continue
			}
			published := "never"
			if s.Published {
				published = s.Age.Round(time.Millisecond).String() + " ago"
			}
			fmt.Fprintf(tw, "%s\t%d/%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d/%d\t%s\t%s\n",
				g.Group, r.Pid, r.Epoch, dash(s.Device),
				bytesPieces(s.RelayedBytes, s.RelayedPieces), bytesPieces(s.ForwardedBytes, s.ForwardedPieces),
				byteSize(s.DirectBytes), fallbacks(s), s.FailedPieces, s.CreditWaits,
				s.OutboundLanes, s.InboundLanes, s.PumpCPU.Round(time.Microsecond), published)
		}
	}
	return tw.Flush()
}

// fallbacks is the fallback bytes (Pieces) and the reasons that have any.
func fallbacks(s *inspect.StatsReport) string {
	out := bytesPieces(s.FallbackBytes.Total(), s.FallbackPieces.Total())
	var why []string
	for r, n := range s.FallbackPieces {
		if n > 0 {
			why = append(why, fmt.Sprintf("%s %d", staging.FallbackReasonName(r), n))
		}
	}
	if len(why) > 0 {
		out += " [" + strings.Join(why, ", ") + "]"
	}
	return out
}

func bytesPieces(b, pieces uint64) string {
	return fmt.Sprintf("%s (%d)", byteSize(b), pieces)
}

// byteSize is n in binary units: 512B, 64.0KiB, 3.0MiB.
func byteSize(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	v, u := float64(n)/1024, 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	return fmt.Sprintf("%.1f%ciB", v, units[u])
}

// writeInspectNotes lists the problems of directories and every entry that
// is not a control file.
func writeInspectNotes(w io.Writer, groups []inspect.GroupReport) error {
	var notes [][3]string
	for _, g := range groups {
		for _, p := range g.Problems {
			notes = append(notes, [3]string{g.Group, "directory", p})
		}
		if g.Truncated {
			notes = append(notes, [3]string{g.Group, "directory", fmt.Sprintf("more than %d entries: only %d were read", inspect.MaxGroupEntries, inspect.MaxGroupEntries)})
		}
		for _, e := range g.Entries {
			notes = append(notes, [3]string{g.Group, e.Kind + " " + e.Name, e.Note})
		}
	}
	if len(notes) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tENTRY\tNOTE")
	for _, n := range notes {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n[0], n[1], dash(n[2]))
	}
	return tw.Flush()
}

func heartbeatAge(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Millisecond).String()
}

func freeOr(health string) string {
	if health == "" {
		return "free"
	}
	return health
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
