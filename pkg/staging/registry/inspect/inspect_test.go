// SPDX-License-Identifier: Apache-2.0

package inspect_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

// groupWithLitter makes a registry directory of this uid under root holding
// n files that are no registry entry.
func groupWithLitter(t *testing.T, root, group string, n int) {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprintf("mooncake-pxn-%d-%s", os.Geteuid(), group))
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("litter-%04d", i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRootReadsABoundedGroup: a directory with more entries than the bound
// is read up to the bound and said to hold more; one within it is read
// whole.
func TestRootReadsABoundedGroup(t *testing.T) {
	root := t.TempDir()
	groupWithLitter(t, root, "big", inspect.MaxGroupEntries+50)
	groupWithLitter(t, root, "small", 10)
	groups, err := inspect.Root(root, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 2 {
		t.Fatalf("%d groups, want 2", len(groups))
	}
	for _, g := range groups {
		want, truncated := 10, false
		if filepath.Base(g.Path) == fmt.Sprintf("mooncake-pxn-%d-big", os.Geteuid()) {
			want, truncated = inspect.MaxGroupEntries, true
		}
		if len(g.Entries) != want || g.Truncated != truncated {
			t.Errorf("%s: %d entries, truncated %v; want %d, %v", g.Group, len(g.Entries), g.Truncated, want, truncated)
		}
		for _, e := range g.Entries {
			if e.Kind != "garbage" {
				t.Errorf("%s: entry %s is %q, want garbage", g.Group, e.Name, e.Kind)
			}
		}
	}
}
