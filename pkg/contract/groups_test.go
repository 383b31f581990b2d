// SPDX-License-Identifier: Apache-2.0

package contract

import (
	"testing"
)

func TestIsGroupKey(t *testing.T) {
	for name, want := range map[string]bool{
		"0123456789abcdef":  true,
		"ffffffffffffffff":  true,
		"0123456789abcde":   false,
		"0123456789abcdef0": false,
		"0123456789ABCDEF":  false,
		"0123456789abcdeg":  false,
		"../3456789abcdef":  false,
		"":                  false,
	} {
		if got := IsGroupKey(name); got != want {
			t.Errorf("IsGroupKey(%q) = %v, want %v", name, got, want)
		}
	}
}
