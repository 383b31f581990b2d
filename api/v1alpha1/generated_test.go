// SPDX-License-Identifier: Apache-2.0

package v1alpha1_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pxn-project/pxn/internal/testtools"
)

// TestGeneratedFilesUpToDate fails when zz_generated.deepcopy.go or the CRD
// under config/crd is not what controller-gen makes of the types.
func TestGeneratedFilesUpToDate(t *testing.T) {
	testtools.Require(t, "controller-gen")
	if _, err := exec.LookPath("git"); err != nil {
		testtools.Missing(t, "git (hack/verify-generated.sh diffs with it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root := testtools.RepoRoot()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack", "verify-generated.sh"))
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/verify-generated.sh: %v\n%s", err, out)
	}
}
