// Command pxn-bench measures the PXN engine with real ranks as separate
// processes and checks every byte it moves.
//
//	pxn-bench run --device host --ranks 8 --bytes 256MiB --pattern cross-rail --json out.json
//	pxn-bench run --device cuda --suite all --json out.json
//
// docs/benchmarks.md explains the scenarios and records the results.
package main

import (
	"fmt"
	"os"

	"github.com/pxn-project/pxn/pkg/sim/ringcheck"
)

func main() {
	if ringcheck.IsRelay() {
		if err := ringcheck.RelayMain(); err != nil {
			fmt.Fprintln(os.Stderr, "ring relay:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pxn-bench run [flags]  (pxn-bench run -h for the flags)")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "run":
		os.Exit(runMain(os.Args[2:]))
	case "rank":
		os.Exit(rankMain(os.Args[2:]))
	case "target":
		os.Exit(targetMain(os.Args[2:]))
	case "soak":
		os.Exit(soakMain(os.Args[2:]))
	case "soak-rank":
		os.Exit(soakRankMain(os.Args[2:]))
	case "cuda-rank":
		os.Exit(cudaRankMain(os.Args[2:]))
	case "cuda-target":
		os.Exit(cudaTargetMain(os.Args[2:]))
	case "cuda-firsthop":
		os.Exit(cudaFirsthopMain(os.Args[2:]))
	default:
		fmt.Fprintf(os.Stderr, "pxn-bench: unknown command %q (want run)\n", os.Args[1])
		os.Exit(2)
	}
}
