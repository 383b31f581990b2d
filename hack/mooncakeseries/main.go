// SPDX-License-Identifier: Apache-2.0

// Command mooncakeseries makes the commit series of the Mooncake patch on a
// copy of the Mooncake tree, as the series definition cuts the patch, and
// checks that the last commit's tree is the tree with the whole patch.
//
//	mooncakeseries -patch P -series S -tree MOONCAKE_TREE -out DIR
//
// DIR/repo is the git repository (tag base: the Mooncake tree), DIR/patches
// git format-patch's files; stdout lists the commits, one a line: the
// commit id, the plan's stage, the check programs PXN adds up to it
// (space-separated, "-" for none) and the subject, tab-separated.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/pxn-project/pxn/integrations/mooncake/series"
)

func main() {
	patch := flag.String("patch", "", "the patch (integrations/mooncake/patches/mooncake.patch)")
	def := flag.String("series", "", "the series definition (integrations/mooncake/patches/series)")
	tree := flag.String("tree", "", "the Mooncake tree the patch is made against")
	out := flag.String("out", "", "output folder (must not exist)")
	flag.Parse()
	if *patch == "" || *def == "" || *tree == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "mooncakeseries: -patch, -series, -tree and -out are required")
		os.Exit(2)
	}
	if err := run(context.Background(), *patch, *def, *tree, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mooncakeseries:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, patchFile, defFile, tree, out string) error {
	s, err := series.Load(patchFile, defFile)
	if err != nil {
		return err
	}
	res, err := series.Generate(ctx, s, tree, out)
	if err != nil {
		return err
	}
	if err := series.CheckLast(ctx, res, tree, patchFile, out); err != nil {
		return err
	}
	var tests []string
	for i, c := range s.Def.Commits {
		tests = append(tests, c.Tests...)
		list := strings.Join(tests, " ")
		if list == "" {
			list = "-"
		}
		fmt.Printf("%s\t%s\t%s\t%s\n", res.Commits[i], c.Stage, list, c.Subject())
	}
	return nil
}
