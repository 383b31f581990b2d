// SPDX-License-Identifier: Apache-2.0

package main

import "testing"

// The C ABI tests again with everything in the host process sanitized: the
// C programs built with ASan and UBSan, libpxn.so with go build -asan (its
// cgo shims under ASan and UBSan, its Go code's accesses checked against
// ASan's shadow). A report fails the test (docs/c-abi.md, "Sanitizers").

func TestABIRulesSanitized(t *testing.T) {
	testABIRules(t, sanitizedLibrary(t))
}

func TestV2HostRunsUnchangedSanitized(t *testing.T) {
	testV2HostRunsUnchanged(t, sanitizedLibrary)
}

func TestExampleRanksSanitized(t *testing.T) {
	testExampleRanks(t, sanitizedLibrary(t))
}
