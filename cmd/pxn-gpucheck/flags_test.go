// SPDX-License-Identifier: Apache-2.0

package main

import (
	"io"
	"testing"

	"github.com/pxn-project/pxn/internal/cli/clitest"
)

// TestSharedFlags: the flags pxn-gpucheck shares with the other binaries are
// spelled as theirs.
func TestSharedFlags(t *testing.T) {
	clitest.CheckFlags(t, newRootCommand(io.Discard, io.Discard))
}
