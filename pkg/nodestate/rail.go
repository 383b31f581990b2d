// SPDX-License-Identifier: Apache-2.0

package nodestate

import (
	"context"

	"github.com/pxn-project/pxn/pkg/rail"
)

// RailDiscoverer discovers with rail.Discover under its options' host root;
// it is a Fingerprinter.
type RailDiscoverer struct {
	Options rail.Options
}

// Discover runs rail.Discover once.
func (d RailDiscoverer) Discover(ctx context.Context) (*rail.Layout, error) {
	return rail.Discover(ctx, d.Options)
}

// Fingerprint is Fingerprint of the discoverer's options.
func (d RailDiscoverer) Fingerprint() (string, error) { return Fingerprint(d.Options) }
