// SPDX-License-Identifier: Apache-2.0

package version

import (
	"strings"
	"testing"
)

func TestUnstampedIsDevel(t *testing.T) {
	if version != "" {
		t.Skipf("this test binary was stamped with %q", version)
	}
	if got, want := String(), Release+"-devel"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if l := Line("pxn-x"); !strings.HasPrefix(l, "pxn-x "+Release+"-devel (revision ") {
		t.Fatalf("Line = %q", l)
	}
}
