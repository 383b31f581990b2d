// SPDX-License-Identifier: Apache-2.0

package cpucopy

import (
	"github.com/pxn-project/pxn/pkg/internal/testhooks"
	"github.com/pxn-project/pxn/pkg/relay"
)

// hooks let tests hold a copier's source-ready events, fail the copies
// they choose and count the goroutines it starts. A production copier has
// none, so each use costs one nil check.
type hooks struct {
	ready  testhooks.ReadyHolder
	faults testhooks.CopyFaults
	// goStarted, when set, is called for each lane goroutine the copier
	// starts, before it starts.
	goStarted func()
}

func init() {
	testhooks.NewHostCopier = func(h testhooks.HostCopier) relay.Copier {
		return newHostCopier(&hooks{ready: h.Ready, faults: h.Faults})
	}
}
