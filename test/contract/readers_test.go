// SPDX-License-Identifier: Apache-2.0

package contract_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/contract"
)

// envOwner is the one file that reads MC_PXN_* variables: engineconfig.Config.
const envOwner = "pkg/engineconfig/config.go"

// readerNames are the callees that read a variable by name: the os
// functions, and the lookup functions passed around in their place.
var readerNames = map[string]bool{"getenv": true, "lookupenv": true, "lookup": true, "get": true}

// varName matches a variable's name spelled out, not the prefix alone
// ("MC_PXN_*" in help text).
var varName = regexp.MustCompile(regexp.QuoteMeta(contract.EnvPrefix) + "[A-Z]")

// envReads lists, as "file:line: what", every place in src that reads an
// MC_PXN_* variable, and every MC_PXN_* name spelled out instead of taken
// from package contract.
func envReads(fset *token.FileSet, file *ast.File) []string {
	var found []string
	at := func(n ast.Node, what string) {
		p := fset.Position(n.Pos())
		found = append(found, p.Filename+":"+strconv.Itoa(p.Line)+": "+what)
	}
	ast.Inspect(file, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BasicLit:
			if n.Kind == token.STRING && varName.MatchString(n.Value) {
				at(n, "spells out "+n.Value)
			}
		case *ast.CallExpr:
			var callee string
			switch f := n.Fun.(type) {
			case *ast.Ident:
				callee = f.Name
			case *ast.SelectorExpr:
				callee = f.Sel.Name
			}
			if !readerNames[strings.ToLower(callee)] {
				return true
			}
			for _, a := range n.Args {
				if sel, ok := a.(*ast.SelectorExpr); ok && strings.HasPrefix(sel.Sel.Name, "Env") && sel.Sel.Name != "EnvPrefix" {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == "contract" {
						at(n, callee+" reads contract."+sel.Sel.Name)
					}
				}
			}
		}
		return true
	})
	return found
}

// TestOneReaderPerVariable: only engineconfig.Config parses the MC_PXN_*
// environment, and every name comes from package contract. Test files are
// left out: they set the variables.
func TestOneReaderPerVariable(t *testing.T) {
	root := testtools.RepoRoot()
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || d.Name() == "vendor" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, r := range envReads(fset, f) {
			if filepath.ToSlash(rel) == envOwner && !strings.Contains(r, "spells out") {
				continue
			}
			if strings.HasPrefix(filepath.ToSlash(rel), "pkg/contract/") && strings.Contains(r, "spells out") {
				continue
			}
			t.Errorf("%s (only %s reads MC_PXN_* variables; names come from pkg/contract)", r, envOwner)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked %d Go files under %s", files, root)
	}
}

// TestEnvReadsFindsReaders keeps the detector honest: each shape of a
// second reader is found, and uses that only name a variable are not.
func TestEnvReadsFindsReaders(t *testing.T) {
	const src = `package p

func f(lookup func(string) (string, bool), o opts) {
	_ = os.Getenv(contract.EnvCopyMode)
	_, _ = os.LookupEnv(contract.EnvEnable)
	_, _ = lookup(contract.EnvRailMap)
	_ = o.Getenv(contract.EnvRegistryRoot)
	_ = os.Getenv("MC_PXN_GROUP_ID")
	_ = fmt.Errorf("%s: bad", contract.EnvCopyMode)
	_ = contract.EnvFirstPiece + "=" + "4"
	_ = os.Getenv("HOME")
	_ = strings.HasPrefix(kv, contract.EnvPrefix)
	_ = "the engine's environment (MC_PXN_*)"
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := envReads(fset, f)
	want := []string{
		"p.go:4: Getenv reads contract.EnvCopyMode",
		"p.go:5: LookupEnv reads contract.EnvEnable",
		"p.go:6: lookup reads contract.EnvRailMap",
		"p.go:7: Getenv reads contract.EnvRegistryRoot",
		`p.go:8: spells out "MC_PXN_GROUP_ID"`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("envReads found\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
