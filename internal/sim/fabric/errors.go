// SPDX-License-Identifier: Apache-2.0

// Package fabric is a simulated RDMA fabric for tests and benchmarks on
// machines without HCAs: relay.Hop implementations that stand in for the
// second hop (Loopback in one process; TCPHop writing to a TargetServer in
// another) and a static relay.Directory of target sessions. It is a
// simulation, not a transport; nothing PXN ships imports it.
package fabric

import (
	"errors"

	"github.com/pxn-project/pxn/pkg/relay"
)

var (
	// ErrClosed is returned by a hop or target server that has been closed.
	ErrClosed = errors.New("fabric: closed")
	// ErrUnknownSession means that a target session is not registered.
	ErrUnknownSession = errors.New("fabric: unknown target session")
	// ErrOutOfRange means that a destination lies outside every registered
	// range of its target.
	ErrOutOfRange = errors.New("fabric: destination outside registered memory")
	// ErrStaleRoute is wrapped by the completion of an op whose route
	// handle the hop does not honour: one issued by another hop or for
	// another session, or one retired since its target was removed or
	// moved. The op is not performed.
	ErrStaleRoute = errors.New("fabric: route handle not honoured")
)

// pollInto moves up to len(out) completions from the front of *done into out.
func pollInto(out []relay.HopCompletion, done *[]relay.HopCompletion) int {
	n := copy(out, *done)
	rest := copy(*done, (*done)[n:])
	clear((*done)[rest:])
	*done = (*done)[:rest]
	return n
}
