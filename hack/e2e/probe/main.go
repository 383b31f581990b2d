// SPDX-License-Identifier: Apache-2.0

// Command probe is the only program of the end-to-end tests' workload image
// (the pxn image has no shell). It runs as the container's main process and is
// run again through kubectl exec to look around inside the container:
//
//	probe sleep               wait for SIGTERM or SIGINT (the container's command)
//	probe env                 print the MC_PXN_* and PXN_* environment, sorted, KEY=VALUE
//	probe write FILE TEXT     create FILE (and its parents) holding TEXT
//	probe ls DIR              print every path below DIR, relative, sorted
//	probe cat FILE            print FILE
//	probe writable DIR        create and remove a file in DIR; print "writable"
//	probe rank I HCA PEER     one of the two ranks of a group spanning two pods
//	                          (rank.go): relay through the other, check its bytes
//	probe open VAR=VALUE...   open an engine with these MC_PXN_* values over the
//	                          container's (open.go), print "pxn active BOOL", hold it
//
// It is built with CGO_ENABLED=0 and packed with hack/image; see test/e2e.
package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/pxn-project/pxn/pkg/contract"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "probe: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: probe sleep|env|write|ls|cat|writable ARGS")
	}
	want := func(n int) error {
		if len(args)-1 != n {
			return fmt.Errorf("%s: want %d arguments, got %d", args[0], n, len(args)-1)
		}
		return nil
	}
	switch args[0] {
	case "rank":
		return runRank(args[1:])
	case "open":
		return runOpen(args[1:])
	case "sleep":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		<-c
		return nil
	case "env":
		var env []string
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, contract.EnvPrefix) || strings.HasPrefix(kv, "PXN_") {
				env = append(env, kv)
			}
		}
		sort.Strings(env)
		for _, kv := range env {
			fmt.Println(kv)
		}
		return nil
	case "write":
		if err := want(2); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(args[1]), 0o755); err != nil {
			return err
		}
		return os.WriteFile(args[1], []byte(args[2]), 0o644)
	case "ls":
		if err := want(1); err != nil {
			return err
		}
		var paths []string
		err := filepath.WalkDir(args[1], func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p != args[1] {
				rel, _ := filepath.Rel(args[1], p)
				paths = append(paths, rel)
			}
			return nil
		})
		if err != nil {
			return err
		}
		sort.Strings(paths)
		for _, p := range paths {
			fmt.Println(p)
		}
		return nil
	case "cat":
		if err := want(1); err != nil {
			return err
		}
		b, err := os.ReadFile(args[1])
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(b)
		return err
	case "writable":
		if err := want(1); err != nil {
			return err
		}
		f, err := os.CreateTemp(args[1], ".probe-")
		if err != nil {
			return err
		}
		name := f.Name()
		if _, err := f.WriteString("x"); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if err := os.Remove(name); err != nil {
			return err
		}
		fmt.Println("writable")
		return nil
	}
	return fmt.Errorf("unknown command %q", args[0])
}
