// SPDX-License-Identifier: Apache-2.0

// Package cpucopy is PXN's first hop on the host CPU: HostCopier, the
// relay.Copier that libpxn ships for hosts whose sources are in host memory,
// copying Pieces into a peer's staging arena with the CPU and ringing the
// slot's doorbell after the data. The stand-in hops and directories that
// tests and benchmarks use are in pkg/sim/fabric.
package cpucopy

import "errors"

// ErrClosed is returned by a copier that has been closed.
var ErrClosed = errors.New("cpucopy: closed")
