// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/pxn-project/pxn/internal/cli"
)

// TestRunE: a refused flag exits 2 with its error and runs nothing; a failed
// run exits 1 (its error goes to the log); a run gets the command's context.
func TestRunE(t *testing.T) {
	type key struct{}
	tests := []struct {
		name        string
		validate    error
		run         error
		code        int
		stderr      string
		wantStarted bool
	}{
		{name: "refused flag", validate: errors.New("--count=0: want at least 1"), code: 2, stderr: "daemon: --count=0: want at least 1\n"},
		{name: "failed run", run: errors.New("listen: address in use"), code: 1, wantStarted: true},
		{name: "clean stop", wantStarted: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.WithValue(context.Background(), key{}, "daemon's")
			started := false
			root := &cobra.Command{Use: "daemon", Args: cobra.NoArgs, RunE: RunE(ctx, "daemon",
				func() error { return tc.validate },
				func(ctx context.Context) error {
					started = true
					if ctx.Value(key{}) != "daemon's" {
						t.Error("run did not get the command's context")
					}
					return tc.run
				})}
			cli.Setup(root, "DAEMON", nil)
			var stderr bytes.Buffer
			code := cli.Execute(root, nil, &stderr)
			if code != tc.code || started != tc.wantStarted || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("exit %d, started %v, stderr %q; want %d, %v, %q", code, started, stderr.String(), tc.code, tc.wantStarted, tc.stderr)
			}
			if tc.code == 1 && stderr.Len() != 0 {
				t.Errorf("a failed run printed %q; its error belongs to the log", stderr.String())
			}
		})
	}
}
