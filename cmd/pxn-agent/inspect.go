package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/pxn-project/pxn/pkg/staging/registry"
)

func inspectMain(args []string) int { return inspect(args, os.Stdout, os.Stderr) }

func inspect(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pxn-agent inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", "/dev/shm", "folder holding the mooncake-pxn-* registry directories (the engine's MC_PXN_REGISTRY_ROOT)")
	format := fs.String("o", "table", "output format: table or json")
	staleAfter := fs.Duration("stale-after", 3*time.Second, "report a rank whose heartbeat is older than this as stale")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pxn-agent inspect: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *format != "table" && *format != "json" {
		fmt.Fprintf(stderr, "pxn-agent inspect: -o %q: want table or json\n", *format)
		return 2
	}
	groups, err := registry.InspectRoot(*root, *staleAfter)
	if err != nil {
		fmt.Fprintf(stderr, "pxn-agent inspect: %v\n", err)
		return 1
	}
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(groups)
	} else {
		err = writeInspectTable(stdout, *root, groups)
	}
	if err != nil {
		fmt.Fprintf(stderr, "pxn-agent inspect: %v\n", err)
		return 1
	}
	return 0
}

func writeInspectTable(w io.Writer, root string, groups []registry.GroupReport) error {
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
	fmt.Fprintln(tw, "GROUP\tRANK FILE\tSTATE\tPID\tEPOCH\tRAIL\tHCA\tARENA\tHEARTBEAT\tHEALTH")
	for _, g := range groups {
		for _, r := range g.Ranks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n",
				g.Group, r.File, r.State, r.Pid, r.Epoch, dash(r.Rail), dash(r.HCA), r.Arena, heartbeatAge(r.HeartbeatAge), r.Health)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tRANK PID/EPOCH\tLANE\tOWNER PID/EPOCH\tLANE EPOCH\tNEXT\tPUBLISHED\tCOMPLETED\tREAPED\tOWNER")
	for _, g := range groups {
		for _, r := range g.Ranks {
			for _, l := range r.Lanes {
				owner := "-"
				if l.OwnerPid != 0 {
					owner = strconv.Itoa(l.OwnerPid) + "/" + l.OwnerEpoch
				}
				fmt.Fprintf(tw, "%s\t%d/%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n",
					g.Group, r.Pid, r.Epoch, l.Lane, owner, dash(l.LaneEpoch),
					l.Next, l.Published, l.Completed, l.Reaped, freeOr(l.OwnerHealth))
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeInspectNotes(w, groups)
}

// writeInspectNotes lists the problems of directories and every entry that
// is not a control file.
func writeInspectNotes(w io.Writer, groups []registry.GroupReport) error {
	var notes [][3]string
	for _, g := range groups {
		for _, p := range g.Problems {
			notes = append(notes, [3]string{g.Group, "directory", p})
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
