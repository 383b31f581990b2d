// SPDX-License-Identifier: Apache-2.0

package rail

import (
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/rail/internal/sysfixture"
)

// TestFixturesMatchGenerator checks that testdata/sysfs and testdata/static
// are byte for byte, symlink targets included, what the generator writes:
// the committed files against the generator's model, and (unless -short)
// the generator's own output in a temporary folder against the committed
// files. After changing a layout, run go generate ./pkg/rail.
func TestFixturesMatchGenerator(t *testing.T) {
	committed, err := sysfixture.ReadGenerated("testdata")
	if err != nil {
		t.Fatal(err)
	}
	if len(committed) < 1000 {
		t.Fatalf("only %d fixture files", len(committed))
	}
	if diff := sysfixture.Diff(sysfixture.All().Combined(), committed, 20); len(diff) > 0 {
		t.Fatalf("testdata is not what the generator writes (run go generate ./pkg/rail):\n%s", strings.Join(diff, "\n"))
	}
	if testing.Short() {
		return
	}
	dir := t.TempDir()
	if err := sysfixture.All().WriteAll(dir); err != nil {
		t.Fatal(err)
	}
	generated, err := sysfixture.ReadGenerated(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := sysfixture.Diff(generated, committed, 20); len(diff) > 0 {
		t.Fatalf("the generator's output differs from testdata (run go generate ./pkg/rail):\n%s", strings.Join(diff, "\n"))
	}
}
