// Command pxn-bench measures the PXN engine with real ranks as separate
// processes and checks every byte it moves.
//
//	pxn-bench run --device host --ranks 8 --bytes 256MiB --pattern cross-rail --json out.json
package main

import (
	"fmt"
	"os"
)

func main() {
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
	default:
		fmt.Fprintf(os.Stderr, "pxn-bench: unknown command %q (want run)\n", os.Args[1])
		os.Exit(2)
	}
}
