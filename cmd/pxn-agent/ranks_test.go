// SPDX-License-Identifier: Apache-2.0

package main

import (
	"slices"
	"testing"
)

// TestRunRankFlags: the rank metrics read every shm folder given (both node
// plugins' by default), none turns them off, and the flags of the slot-link
// reading that owner records replaced are still accepted.
func TestRunRankFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "n1")
	for _, tc := range []struct {
		args []string
		want []string // nil: rank metrics off
	}{
		{nil, []string{"/dev/shm/pxn", "/dev/shm/pxn-dra"}},
		{[]string{"--shm-dirs=/dev/shm/a,/dev/shm/b"}, []string{"/dev/shm/a", "/dev/shm/b"}},
		{[]string{"--shm-dirs=/dev/shm/a", "--state-dir=/run/pxn", "--resource-name=pxn.io/relay"}, []string{"/dev/shm/a"}},
		{[]string{"--shm-dirs="}, nil},
	} {
		c, err := parseRun(tc.args...)
		if err != nil {
			t.Errorf("run %q: %v", tc.args, err)
			continue
		}
		switch {
		case tc.want == nil && c.opts.Ranks != nil:
			t.Errorf("run %q: rank metrics on, reading %q", tc.args, c.opts.Ranks.ShmDirs)
		case tc.want != nil && (c.opts.Ranks == nil || !slices.Equal(c.opts.Ranks.ShmDirs, tc.want)):
			t.Errorf("run %q: rank metrics %+v, want them reading %q", tc.args, c.opts.Ranks, tc.want)
		}
	}
}
