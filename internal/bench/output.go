// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"golang.org/x/sys/unix"
)

// Row is one line of the table and of the JSON output.
type Row struct {
	Scenario      string  `json:"scenario"`
	Bytes         uint64  `json:"bytes"`
	Pieces        uint64  `json:"pieces"`
	GBps          float64 `json:"gbps"`
	USPerPiece    float64 `json:"us_per_piece"`
	Baseline      string  `json:"baseline,omitempty"`
	BaselineGBps  float64 `json:"baseline_gbps,omitempty"`
	Ratio         float64 `json:"ratio,omitempty"`
	RelayedBytes  uint64  `json:"relayed_bytes"`
	FallbackBytes uint64  `json:"fallback_bytes"`
	DirectBytes   uint64  `json:"direct_bytes"`
	Failed        int     `json:"failed_tasks"`
	Verified      bool    `json:"verified"`
	Value         float64 `json:"value,omitempty"`
	Unit          string  `json:"unit,omitempty"`
	Note          string  `json:"note,omitempty"`
	// MPS is "on" or "off" on the CUDA path: whether the processes shared
	// their GPUs through an MPS control daemon or time-sliced them.
	MPS string `json:"mps,omitempty"`
	// Settings are the engine settings the run's flags changed.
	Settings string `json:"settings,omitempty"`
	// Problems is what a scenario's main row found wrong with its engine
	// phase (phaseProblems): empty but not nil when nothing was, nil on rows
	// that judge nothing.
	Problems []string `json:"problems"`

	// BoundGBps is, for a row of traffic through NICs at a wire rate with
	// a direct phase, what one NIC per rank at that rate gives the traffic
	// (wireBound); DirectOfBound is the direct phase's rate over it. Below
	// 0.95 the direct stand-in (the emulated NIC as the baseline posts to
	// it) did not keep up with the writes, and the row's ratio measures
	// it, not the engine.
	BoundGBps     float64 `json:"bound_gbps,omitempty"`
	DirectOfBound float64 `json:"direct_of_bound,omitempty"`
}

// printRows prints rows as a table; rows of the CUDA path get an MPS
// column, and the engine settings the flags changed follow the table.
func printRows(w io.Writer, rows []Row) {
	if len(rows) == 0 {
		return
	}
	mps := rows[0].MPS != ""
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "SCENARIO\tBYTES\tPIECES\tGB/S\tµS/PIECE\tBASELINE GB/S\tRATIO\tRELAYED\tFALLBACK\tDIRECT\tFAILED\tVERIFIED"
	if mps {
		head += "\tMPS"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		end := "\n"
		if mps {
			end = "\t" + r.MPS + "\n"
		}
		if r.Unit != "" {
			fmt.Fprintf(tw, "%s\t\t%s\t%.3g %s\t\t\t\t\t\t\t\t%v%s", r.Scenario, count(r.Pieces), r.Value, r.Unit, r.Verified, end)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%v%s", r.Scenario, sizeString(r.Bytes), count(r.Pieces), r.GBps,
			opt(r.USPerPiece, "%.1f"), opt(r.BaselineGBps, "%.2f"), opt(r.Ratio, "%.3f"),
			sizeString(r.RelayedBytes), sizeString(r.FallbackBytes), sizeString(r.DirectBytes), r.Failed, r.Verified, end)
	}
	tw.Flush()
	if rows[0].Settings != "" {
		fmt.Fprintf(w, "settings: %s\n", rows[0].Settings)
	}
	for _, r := range rows {
		if r.Note != "" {
			fmt.Fprintf(w, "note (%s): %s\n", r.Scenario, r.Note)
		}
	}
}

func opt(v float64, f string) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf(f, v)
}

func count(n uint64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatUint(n, 10)
}

func gbpsOf(bytes uint64, secs float64) float64 {
	if secs <= 0 {
		return 0
	}
	return float64(bytes) / secs / 1e9
}

func maxAbs(a, b int64) int64 {
	if b < 0 {
		b = -b
	}
	return max(a, b)
}

// CheckOutput checks, before any work, that the file path of flag can be
// written: its folder exists, is a folder and is writable, and path is not
// a folder itself. The error names the flag and the path.
func CheckOutput(flag, path string) error {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("%s %s: is a folder, want a file name", flag, path)
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%s %s: %s is not a folder", flag, path, dir)
	}
	if err := unix.Access(dir, unix.W_OK); err != nil {
		return fmt.Errorf("%s %s: cannot write in %s: %w", flag, path, dir, err)
	}
	return nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}

var sizeUnits = []struct {
	suffix string
	mult   uint64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}

// ParseSize reads 4096, 10KiB, 8MiB, 1GiB (binary units).
func ParseSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	mult := uint64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want a number with an optional KiB/MiB/GiB suffix", s)
	}
	if n > (1<<63)/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return n * mult, nil
}

func sizeString(n uint64) string {
	switch {
	case n == 0:
		return "0"
	case n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return strconv.FormatUint(n, 10)
}
