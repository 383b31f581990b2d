// Command pxn-agent is PXN's node agent. Subcommands:
//
//	pxn-agent [run] [flags]   discover the node's rails and publish its PxnRailMap
//	pxn-agent discover        print the node's layout without contacting Kubernetes
//	pxn-agent inspect         show the live engine registries under a folder
package main

import (
	"fmt"
	"os"
)

func main() {
	os.Exit(dispatch(os.Args[1:]))
}

func dispatch(args []string) int {
	cmd, rest := "run", args
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, rest = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runMain(rest)
	case "discover":
		return discoverMain(rest)
	case "inspect":
		return inspectMain(rest)
	case "help":
		fmt.Println("usage: pxn-agent [run|discover|inspect] [flags]; pxn-agent SUBCOMMAND -h for its flags")
		return 0
	default:
		fmt.Fprintf(os.Stderr, "pxn-agent: unknown subcommand %q (want run, discover or inspect)\n", cmd)
		return 2
	}
}
