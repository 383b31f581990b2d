// SPDX-License-Identifier: Apache-2.0

package main

import (
	"testing"

	"github.com/pxn-project/pxn/internal/cli/clitest"
)

// TestSharedFlags: the flags pxn-bench shares with the other binaries are
// spelled as theirs; -v is the log level, not the version.
func TestSharedFlags(t *testing.T) {
	clitest.CheckFlags(t, newRootCommand())
}
