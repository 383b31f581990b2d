// SPDX-License-Identifier: Apache-2.0

// Command libpxn is the PXN engine as a C shared library:
//
//	CGO_ENABLED=1 go build -buildmode=c-shared -o libpxn.so ./cmd/libpxn
//
// Its ABI is include/pxn.h; docs/c-abi.md is the reference. The exported
// functions are in exports.go; every one of them recovers from a panic and
// reports it as PXN_EINTERNAL, so no Go failure unwinds into the host.
package main

// main is required of a c-shared build and never runs.
func main() {}
