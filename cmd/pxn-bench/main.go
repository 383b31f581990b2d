// SPDX-License-Identifier: Apache-2.0

// Command pxn-bench measures the PXN engine with real ranks as separate
// processes and checks every byte it moves. One scenario engine runs every
// traffic pattern on either device: host memory with a TCP hop standing in
// for RDMA, or CUDA GPUs with an emulated NIC.
//
//	pxn-bench run --device host --ranks 8 --bytes 256MiB --pattern cross-rail --json out.json
//	pxn-bench run --device cuda --suite all --json out.json
//	pxn-bench soak --ranks 8 --duration 10m
//
// The scenario engine lives in internal/bench; this command wires its flags
// to it. docs/benchmarks.md explains the scenarios and records the results.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pxn-project/pxn/internal/bench"
	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/sim/ringcheck"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/staging"
)

func main() {
	if ringcheck.IsRelay() {
		if err := ringcheck.RelayMain(); err != nil {
			fmt.Fprintln(os.Stderr, "ring relay:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(execute(os.Args[1:]))
}

// exitCode is a command's exit status other than 0 and 1.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// usageError is a flag or argument the command cannot use: exit status 2.
type usageError struct{ error }

func execute(args []string) int {
	root := newRootCommand()
	root.SetArgs(args)
	err := root.Execute()
	var code exitCode
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	case errors.As(err, &usage):
		fmt.Fprintf(os.Stderr, "pxn-bench: %v\nRun 'pxn-bench --help' for usage.\n", usage.error)
		return 2
	default:
		fmt.Fprintf(os.Stderr, "pxn-bench: %v\n", err)
		return 1
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "pxn-bench",
		Short: "Measure the PXN engine with real ranks as processes, checking every byte",
		Long: `pxn-bench runs the PXN engine end to end: every rank and every remote target
is a separate process, the ranks write their traffic pattern through the
engine and then through the second hop alone, and every target checks each
byte it received. The same scenarios run on host memory (--device host, a
TCP hop on loopback stands in for RDMA) and on CUDA GPUs (--device cuda, an
emulated NIC copies into the targets' device memory).`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q (want run, soak or version)", args[0])}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		command("run", "Run one traffic pattern, or the CUDA performance suites, and print the table", false, runFlags),
		command("soak", "Run all-to-all rounds on the host path while killing, restarting and stalling ranks", false, soakFlags),
		command("rank", "One rank of a run (started by run)", true, rankFlags),
		command("target", "One remote target of a run (started by run)", true, targetFlags),
		command("soak-rank", "One rank of a soak (started by soak)", true, soakRankFlags),
		command("cuda-firsthop", "The P2 first-hop ring (started by run --suite p2)", true, firsthopFlags),
	)
	cli.Conventions(root)
	return root
}

// command wires a flag set to a body that returns an exit status.
func command(use, short string, hidden bool, flags func(*pflag.FlagSet) func() int) *cobra.Command {
	var body func() int
	c := &cobra.Command{
		Use:    use,
		Short:  short,
		Hidden: hidden,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("%s takes no arguments, got %q", use, args)}
			}
			return nil
		},
		RunE: func(*cobra.Command, []string) error {
			switch code := body(); code {
			case 0:
				return nil
			default:
				return exitCode(code)
			}
		},
	}
	c.Flags().SortFlags = false
	body = flags(c.Flags())
	return c
}

func runFlags(fs *pflag.FlagSet) func() int {
	o := bench.RunOptions{Out: os.Stdout, ErrOut: os.Stderr, Getenv: os.Getenv}
	var bytesFlag, blockFlag, firstPieceFlag, railMapFlag string
	var verdict bool
	fs.StringVar(&o.Device, "device", "host", "host (CPU memory stands in for GPU memory) or cuda")
	fs.IntVar(&o.Ranks, "ranks", 8, "ranks, one per GPU and HCA (2..8)")
	fs.StringVar(&bytesFlag, "bytes", "256MiB", "bytes each rank writes")
	fs.StringVar(&blockFlag, "block", "0", "request size (0: one request per transfer)")
	fs.StringVar(&o.Pattern, "pattern", "cross-rail", "cross-rail, fan-in, same-rail, all-to-all, or kv (KV-cache-shaped requests sized by --kv-*, not --bytes and --block)")
	fs.StringVar(&o.JSON, "json", "", "also write the rows as JSON to this file")
	fs.StringVar(&o.Credit, "credit-timeout", "", contract.EnvCreditTimeout+" for the ranks (empty: the engine default, 1000)")
	fs.StringVar(&firstPieceFlag, "first-piece", "", "the most bytes of a request's first Piece, each next twice the one before up to the 8 MiB slot ("+contract.EnvFirstPiece+" for the ranks; empty: the engine default, "+strconv.Itoa(contract.DefaultFirstPieceKiB)+"KiB; 8MiB: no ramp)")
	fs.IntVar(&o.SlotParts, "slot-parts", 0, "the most parts a Piece alone on its lane is copied and forwarded in ("+contract.EnvSlotParts+" for the ranks; 0: the engine default, "+strconv.Itoa(contract.DefaultSlotParts)+"; 1: none)")
	fs.IntVar(&o.PerSubmit, "per-submit", 0, "requests per Submit (0: all at once; with --device cuda 16); a Submit is one Piece per 8 MiB, and the sender joins queued whole Pieces of several Submits into one slot")
	fs.DurationVar(&o.HoldAfter, "hold-after", 0, "keep the engine phase's ranks registered, idle, this long after their transfer, so that a metrics scraper (pxn-agent) sees their counters; single runs only")
	fs.BoolVar(&o.AllocPass, "alloc-pass", false, "run the PXN phase's transfer a second time and report P5 heap allocations per piece from that warm pass (steady state) rather than from the first")
	fs.StringVar(&o.RegistryRoot, "registry-root", "",
		"folder in which the ranks' registry folder (their "+contract.EnvRegistryRoot+") is created; the staging arenas live there, so it must be a large tmpfs. "+
			"Default: $"+contract.EnvRegistryRoot+" (in a pod holding pxn.io/relay, the device plugin's group folder), else /dev/shm")
	fs.StringVar(&railMapFlag, "rail-map", "",
		"a node's rail map (JSON object of HCA to rail, as "+contract.EnvRailMap+"): rank k then uses the first HCA of the map's k-th rail, so the ranks' HCA and rail names are the node's. "+
			"Default: $"+contract.EnvRailMap+" (in a pod holding pxn.io/relay, the node's map), else mlx5_k on railk")
	fs.StringVar(&o.CUDA.Suite, "suite", "", "cuda: run the performance scenarios instead of one pattern: all (p1, p2, p3), or a comma list of p1 (with P4, P5, P6), p2, p3, p8 (same-rail through the engine against the NIC alone), p9 (KV-shaped throughput), p10 (kv-small completion time), p14 (small KV blocks and one-block requests; or one of its parts by traffic: p14-1to1, p14-7to1, p14-a2a)")
	fs.StringVar(&o.CUDA.GPUs, "gpus", "", "cuda: GPU of each rank, comma-separated (default: rank r on GPU r % number of GPUs)")
	fs.Float64Var(&o.CUDA.Rate, "rate", 0, "cuda: the emulated NIC's rate cap in GB/s (0: the copy engine's own rate)")
	fs.BoolVar(&o.CUDA.Raw, "raw", false, "cuda: also time a raw copy-engine copy of the same traffic")
	fs.IntVar(&o.CUDA.Latency, "latency", 0, "also time this many 10 KiB writes through PXN and direct")
	fs.StringVar(&o.CUDA.GatherPTX, "gather-ptx", "", "cuda: load the gather kernel from this PTX file instead of the embedded one (kernel development)")
	fs.BoolVar(&o.CUDA.NoInlinePlan, "no-inline-plan", false, "cuda: upload every gather plan, small ones too, instead of passing a plan of up to 512 entries as the kernel's parameter (to measure what that saves)")
	kvFlags(fs, &o.KV)
	fs.StringVar(&o.CUDA.CopyMode, "copy-mode", "", "cuda: "+contract.EnvCopyMode+" for the ranks (ce, sm or auto)")
	fs.DurationVar(&o.CUDA.PollSpin, "poll-spin", 0, "cuda: how long the pump polls without sleeping after progress while one Piece moves (0: the default, negative: never)")
	fs.DurationVar(&o.CUDA.PollNap, "poll-nap", 0, "cuda: the longest sleep of the pump while work is in flight (0: the default, negative: never sleep while busy)")
	fs.StringVar(&o.CUDA.ArenaShare, "arena-share", "auto", "cuda: how each rank shares its device arena: auto (by descriptor where the device can), fd or ipc (a legacy CUDA IPC handle)")
	fs.BoolVar(&verdict, "verdict", false, "end with a verdict line: PASS when every cross-rail byte was relayed through the peer on its target's rail, nothing fell back or failed and every byte was verified, else FAIL and what went wrong (exit status 1)")
	fs.BoolVar(&o.PIDNS, "pidns", false, "start each rank in a PID and mount namespace of its own, with its own /proc, as ranks in separate pods without hostPID (needs root); the targets stay in this one")
	return func() int {
		var err error
		if msg := ignoredFlags(fs, o.Pattern, o.CUDA.Suite); msg != "" {
			fmt.Fprintf(os.Stderr, "pxn-bench: %s\n", msg)
			return 2
		}
		if o.Bytes, err = bench.ParseSize(bytesFlag); err != nil {
			fmt.Fprintf(os.Stderr, "pxn-bench: --bytes: %v\n", err)
			return 2
		}
		if o.Block, err = bench.ParseSize(blockFlag); err != nil {
			fmt.Fprintf(os.Stderr, "pxn-bench: --block: %v\n", err)
			return 2
		}
		if firstPieceFlag != "" {
			n, err := bench.ParseSize(firstPieceFlag)
			if err != nil || n%1024 != 0 || n>>10 < contract.MinFirstPieceKiB || n>>10 > contract.MaxFirstPieceKiB {
				fmt.Fprintf(os.Stderr, "pxn-bench: --first-piece %q: want a whole number of KiB from %dKiB to %dKiB\n", firstPieceFlag, contract.MinFirstPieceKiB, contract.MaxFirstPieceKiB)
				return 2
			}
			o.FirstPiece = strconv.FormatUint(n>>10, 10)
		}
		if o.SlotParts != 0 && (o.SlotParts < contract.MinSlotParts || o.SlotParts > contract.MaxSlotParts) {
			fmt.Fprintf(os.Stderr, "pxn-bench: --slot-parts %d: want %d to %d\n", o.SlotParts, contract.MinSlotParts, contract.MaxSlotParts)
			return 2
		}
		if railMapFlag == "" {
			if o.RailMap, err = engineconfig.RailMapFromEnv(nil); err != nil {
				fmt.Fprintf(os.Stderr, "pxn-bench: --rail-map default: %v\n", err)
				return 2
			}
		} else if o.RailMap, err = contract.ParseRailMap(railMapFlag); err != nil {
			fmt.Fprintf(os.Stderr, "pxn-bench: --rail-map: %v\n", err)
			return 2
		}
		if o.RegistryRoot == "" {
			if o.RegistryRoot, err = engineconfig.RegistryRootFromEnv(nil); err != nil {
				fmt.Fprintf(os.Stderr, "pxn-bench: --registry-root default: %v\n", err)
				return 2
			}
		}
		if _, err := gpu.ParseArenaShare(o.CUDA.ArenaShare); err != nil {
			fmt.Fprintf(os.Stderr, "pxn-bench: --arena-share: %v\n", err)
			return 2
		}
		if o.Device != "cuda" {
			if given := cudaOnlyFlags(fs); len(given) > 0 {
				fmt.Fprintf(os.Stderr, "pxn-bench: %s: CUDA only, want --device cuda (--device %s)\n", strings.Join(given, ", "), o.Device)
				return 2
			}
		}
		if err := o.Check(); err != nil {
			fmt.Fprintf(os.Stderr, "pxn-bench: %v\n", err)
			return 2
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		rows, err := bench.Run(ctx, o)
		if err != nil {
			fmt.Fprintf(os.Stderr, "pxn-bench: %v\n", err)
			return 1
		}
		if verdict {
			pass, line := bench.Verdict(rows)
			fmt.Fprintln(os.Stdout, "verdict: "+line)
			if !pass {
				return 1
			}
		}
		for _, r := range rows {
			if !r.Verified || r.Failed > 0 {
				return 1
			}
		}
		return 0
	}
}

// cudaOnlyFlags names the flags given on the command line whose usage
// opens with "cuda:", the flags of --device cuda alone.
func cudaOnlyFlags(fs *pflag.FlagSet) []string {
	var given []string
	fs.Visit(func(f *pflag.Flag) {
		if strings.HasPrefix(f.Usage, "cuda:") {
			given = append(given, "--"+f.Name)
		}
	})
	return given
}

// ignoredFlags names the flags given on the command line that the pattern
// (or the suite) would ignore, and what sizes its traffic instead ("": none).
func ignoredFlags(fs *pflag.FlagSet, pattern, suite string) string {
	var given []string
	check := func(names ...string) {
		for _, n := range names {
			if fs.Changed(n) {
				given = append(given, "--"+n)
			}
		}
	}
	var why string
	switch {
	case suite != "":
		check("bytes", "block", "pattern", "ranks", "kv-shape", "kv-traffic", "kv-requests", "kv-inflight")
		why = "--suite runs the scenarios of docs/benchmarks.md, each with its own sizes and pattern"
	case pattern == "kv":
		check("bytes", "block")
		why = "--pattern kv sizes its requests with --kv-shape, --kv-requests and --kv-inflight"
	default:
		check("kv-shape", "kv-traffic", "kv-requests", "kv-inflight")
		why = "the --kv-* flags size the requests of --pattern kv only; --pattern " + pattern + " moves --bytes per rank"
	}
	if len(given) == 0 {
		return ""
	}
	return strings.Join(given, ", ") + " would be ignored: " + why
}

func rankFlags(fs *pflag.FlagSet) func() int {
	var o bench.RankOptions
	fs.StringVar(&o.Device, "device", "host", "host or cuda")
	fs.IntVar(&o.Index, "index", 0, "rank index (its GPU, HCA and rail)")
	fs.IntVar(&o.GPU, "gpu", 0, "cuda: GPU ordinal")
	fs.StringVar(&o.Layout, "layout", "", "layout file")
	fs.StringVar(&o.Directory, "directory", "", "directory file")
	fs.StringVar(&o.NIC, "nic", "", "cuda: the emulated NIC's targets")
	fs.StringVar(&o.Mode, "mode", "engine", "engine (through the PXN engine) or bare (the hop alone)")
	fs.Float64Var(&o.Rate, "rate", 0, "cuda: emulated NIC rate cap, GB/s (0: none)")
	fs.StringVar(&o.Registry, "registry", "", "the registry root (counted for P6)")
	fs.IntVar(&o.Latency, "latency", 0, "10 KiB writes to time each way")
	fs.IntVar(&o.Reps, "reps", 1, "times the timed transfer (and the raw copy) is repeated back to back")
	fs.IntVar(&o.PerSubmit, "per-submit", 0, "requests per Submit (0: the device's default)")
	fs.StringVar(&o.GatherPTX, "gather-ptx", "", "cuda: gather kernel PTX file (default: embedded)")
	fs.BoolVar(&o.NoInlinePlan, "no-inline-plan", false, "cuda: upload every gather plan")
	fs.DurationVar(&o.PollSpin, "poll-spin", 0, "cuda: the pump's spin window (0: default)")
	fs.DurationVar(&o.PollNap, "poll-nap", 0, "cuda: the pump's longest sleep while busy (0: default)")
	fs.StringVar(&o.ArenaShare, "arena-share", "auto", "cuda: auto, fd or ipc")
	fs.BoolVar(&o.OwnProc, "own-proc", false, "this process is the first of a new PID and mount namespace: mount a /proc of that namespace first")
	fs.BoolVar(&o.PieceTimes, "piece-times", false, "keep the engine's Piece times for a step-by-step breakdown")
	return func() int { return bench.RankMain(o) }
}

func targetFlags(fs *pflag.FlagSet) func() int {
	var o bench.TargetOptions
	fs.StringVar(&o.Device, "device", "host", "host or cuda")
	fs.IntVar(&o.Index, "index", 0, "rail of this target")
	fs.IntVar(&o.GPU, "gpu", 0, "cuda: GPU ordinal")
	fs.StringVar(&o.Layout, "layout", "", "layout file")
	return func() int { return bench.TargetMain(o) }
}

func kvFlags(fs *pflag.FlagSet, o *bench.KVOptions) {
	fs.StringVar(&o.Shape, "kv-shape", "kv-small", "kv: each request's shape: "+bench.KVShapeNames()+", or LAYERSxPAGESxBLOCK")
	fs.StringVar(&o.Traffic, "kv-traffic", "fan-in", "kv: fan-in (every other rank sends to rank 0's rail: 1→1 with --ranks 2, 7→1 with 8) or all-to-all")
	fs.IntVar(&o.Requests, "kv-requests", 8, "kv: requests each sender sends each of its targets")
	fs.IntVar(&o.Inflight, "kv-inflight", 4, "kv: requests a rank has in flight at most")
}

// soakFlags: the soak runs all-to-all rounds on the host path for a fixed
// time while it kills, restarts and stalls ranks at random (bench.SoakMain).
func soakFlags(fs *pflag.FlagSet) func() int {
	var o bench.SoakOptions
	var blockFlag, faultsFlag string
	fs.IntVar(&o.Ranks, "ranks", 4, "ranks, one per rail (2..8)")
	fs.DurationVar(&o.Duration, "duration", time.Minute, "how long to run rounds and inject faults")
	fs.StringVar(&blockFlag, "block", "64KiB", "request size")
	fs.IntVar(&o.PerTarget, "per-target", 4, "requests per target per round")
	fs.IntVar(&o.Slots, "slots", 64, "rounds before a rank's target region is reused")
	fs.DurationVar(&o.FaultEvery, "fault-every", 2*time.Second, "mean time between faults (0: none)")
	fs.StringVar(&faultsFlag, "faults", "kill,restart,stall", "fault kinds to inject")
	fs.Uint64Var(&o.Seed, "seed", 0, "random seed (0: from the clock)")
	fs.StringVar(&o.JSON, "json", "", "also write the summary as JSON to this file")
	return func() int {
		var err error
		if o.Block, err = bench.ParseSize(blockFlag); err != nil || o.Block == 0 {
			fmt.Fprintf(os.Stderr, "pxn-bench soak: --block %q: want a size > 0\n", blockFlag)
			return 2
		}
		if o.Ranks < 2 || o.Ranks > 8 || o.PerTarget < 1 || o.Slots < 1 {
			fmt.Fprintln(os.Stderr, "pxn-bench soak: want 2..8 ranks, --per-target and --slots at least 1")
			return 2
		}
		if o.Faults, err = bench.ParseFaults(faultsFlag); err != nil {
			fmt.Fprintf(os.Stderr, "pxn-bench soak: %v\n", err)
			return 2
		}
		if o.JSON != "" {
			if err := bench.CheckOutput("--json", o.JSON); err != nil {
				fmt.Fprintf(os.Stderr, "pxn-bench soak: %v\n", err)
				return 2
			}
		}
		if o.Seed == 0 {
			o.Seed = uint64(time.Now().UnixNano())
		}
		if o.RegistryRoot, err = engineconfig.RegistryRootFromEnv(nil); err != nil {
			fmt.Fprintf(os.Stderr, "pxn-bench soak: %v\n", err)
			return 2
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return bench.SoakMain(ctx, o)
	}
}

func soakRankFlags(fs *pflag.FlagSet) func() int {
	var o bench.SoakRankOptions
	fs.IntVar(&o.Index, "index", 0, "rank index (its rail)")
	fs.IntVar(&o.Ranks, "ranks", 2, "ranks of the soak")
	fs.StringVar(&o.Directory, "directory", "", "directory file")
	fs.Uint64Var(&o.Block, "block", 64<<10, "request size")
	fs.IntVar(&o.PerTarget, "per-target", 4, "requests per target per round")
	fs.IntVar(&o.Slots, "slots", 64, "rounds before a target region is reused")
	return func() int { return bench.SoakRankMain(o) }
}

func firsthopFlags(fs *pflag.FlagSet) func() int {
	var o bench.FirsthopOptions
	fs.IntVar(&o.RelayGPU, "relay-gpu", 0, "the relay's GPU")
	fs.IntVar(&o.SenderGPU, "sender-gpu", 1, "the sender's GPU")
	fs.StringVar(&o.Sizes, "sizes", "2KiB,16KiB,128KiB,256KiB,512KiB,1MiB,8MiB", "entry sizes")
	fs.IntVar(&o.Pieces, "pieces", 256, "timed Pieces per mode")
	fs.IntVar(&o.Warm, "warm", 2*staging.SlotsPerLane, "verified warm-up Pieces per mode")
	fs.StringVar(&o.Shapes, "shapes", "8x1024x2,8x512x2,16x1024x1,16x512x1", "SM launch shapes (blocks x threads x streams); the first is the copier's default")
	fs.StringVar(&o.GatherPTX, "gather-ptx", "", "gather kernel PTX file (default: embedded)")
	return func() int { return bench.FirsthopMain(o) }
}
