// SPDX-License-Identifier: Apache-2.0

package mooncake

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/integrations/mooncake/series"
	"github.com/pxn-project/pxn/internal/testtools"
)

// TestMooncakeSeries makes the upstream commit series from the patch as
// patches/series cuts it, on a git copy of the Mooncake tree, and checks that
// the last commit's tree is the tree with the whole patch (applied by
// patch(1)), that the series is made against the tested commit, and that
// the RFC lists every commit. Building each commit is hack/mooncake-series.sh
// check's work, not this test's.
func TestMooncakeSeries(t *testing.T) {
	root := repoRoot(t)
	for _, tool := range []string{"git", "patch"} {
		if _, err := exec.LookPath(tool); err != nil {
			testtools.Missing(t, "%s not found: the series is made with it", tool)
		}
	}
	tree := mooncakeTree(t, root)
	patchFile := filepath.Join(root, "integrations", "mooncake", "patches", "mooncake.patch")
	s, err := series.Load(patchFile, filepath.Join(root, "integrations", "mooncake", "patches", "series"))
	if err != nil {
		t.Fatal(err)
	}
	if want := testedCommit(t, root); s.Def.Base != want {
		t.Errorf("the series is made against %s, the tested commit is %s", s.Def.Base, want)
	}

	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "series")
	res, err := series.Generate(ctx, s, tree, out)
	if err != nil {
		t.Fatal(err)
	}
	if err := series.CheckLast(ctx, res, tree, patchFile, out); err != nil {
		t.Fatal(err)
	}

	rfc, err := os.ReadFile(filepath.Join(root, "docs", "rfc-mooncake-pxn.md"))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range s.Def.Commits {
		b, err := os.ReadFile(res.Patches[i])
		if err != nil {
			t.Fatal(err)
		}
		// format-patch folds a long subject; unfold it.
		mail := strings.ReplaceAll(string(b), "\n ", " ")
		if !strings.Contains(mail, "] "+c.Subject()+"\n") {
			t.Errorf("patch %d (%s) does not carry the subject %q", i+1, res.Patches[i], c.Subject())
		}
		if !strings.Contains(string(rfc), c.Subject()) {
			t.Errorf("docs/rfc-mooncake-pxn.md does not list commit %d, %q", i+1, c.Subject())
		}
	}
}
