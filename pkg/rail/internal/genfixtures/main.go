// SPDX-License-Identifier: Apache-2.0

// Command genfixtures writes pkg/rail's sysfs fixture trees and static rail
// tables under a testdata folder, replacing what was there. pkg/rail's tests
// check that the committed files are exactly what it writes.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/pxn-project/pxn/pkg/rail/internal/sysfixture"
)

func main() {
	out := flag.String("out", "testdata", "testdata folder to write sysfs/ and static/ into")
	flag.Parse()
	if err := sysfixture.All().WriteAll(*out); err != nil {
		fmt.Fprintf(os.Stderr, "genfixtures: %v\n", err)
		os.Exit(1)
	}
}
