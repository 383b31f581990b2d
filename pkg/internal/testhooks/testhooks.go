// SPDX-License-Identifier: Apache-2.0

// Package testhooks carries the seams that one package's tests need in
// another package (docs/testing.md): the hooks a test may hand over, and a
// constructor that the package owning the seam sets when it is linked.
// Only test files call the constructors.
package testhooks

import "github.com/pxn-project/pxn/pkg/relay"

// HostCopier is what a test may give a cpucopy.HostCopier.
type HostCopier struct {
	// Ready, when set, holds the source-ready events it chooses until it
	// releases them.
	Ready ReadyHolder
	// Faults, when set, is asked before each Copy is enqueued.
	Faults CopyFaults
}

// ReadyHolder decides which source-ready events of a host copier wait to be
// released, so that a test can prove that nothing reads a source before
// its ready event.
type ReadyHolder interface {
	// Attach is called once, when the copier is made, with the function
	// that completes a held event; for any other event it returns an
	// error wrapping cpucopy.ErrUnknownEvent.
	Attach(release func(relay.Event) error)
	// Hold reports whether ev, just recorded, waits for release. It must
	// not call release.
	Hold(ev relay.Event) bool
}

// CopyFaults fails chosen copies of a host copier, to drive the engine's
// error paths.
type CopyFaults interface {
	// CopyFault returns the error that this Copy on lane fails with,
	// without enqueueing anything, or nil.
	CopyFault(lane int) error
}

// NewHostCopier returns a *cpucopy.HostCopier with h in place. pkg/cpucopy
// sets it in its init; nothing else writes it.
var NewHostCopier func(h HostCopier) relay.Copier
