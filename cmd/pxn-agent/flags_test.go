// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"io"
	"testing"

	"github.com/pxn-project/pxn/internal/cli/clitest"
)

// TestSharedFlags: the flags pxn-agent shares with the other binaries are
// spelled as theirs.
func TestSharedFlags(t *testing.T) {
	clitest.CheckFlags(t, newRootCommand(context.Background(), io.Discard, io.Discard, nil))
}
