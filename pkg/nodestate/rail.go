// SPDX-License-Identifier: Apache-2.0

package nodestate

import (
	"context"
	"slices"
	"sync"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/rail"
)

// RailDiscoverer discovers with rail.Discover. Its warnings are logged once
// each time the set of them changes.
type RailDiscoverer struct {
	Options rail.Options
	Logger  klog.Logger

	mu           sync.Mutex
	lastWarnings []string
}

// Discover runs rail.Discover once.
func (d *RailDiscoverer) Discover(ctx context.Context) (Discovery, error) {
	l, err := rail.Discover(ctx, d.Options)
	if err != nil {
		return Discovery{}, err
	}
	d.mu.Lock()
	if !slices.Equal(l.Warnings, d.lastWarnings) {
		for _, w := range l.Warnings {
			d.Logger.Info("Rail discovery warning", "warning", w)
		}
		d.lastWarnings = l.Warnings
	}
	d.mu.Unlock()
	_, detail := l.Ready()
	return Discovery{
		RailMap: l.RailMapJSON(),
		Healthy: l.Healthy(),
		Summary: Summary{Rails: l.Rails, HCAs: len(l.HCAs), GPUs: len(l.GPUs), Strategy: l.Strategy, Detail: detail},
	}, nil
}
