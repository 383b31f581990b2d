// SPDX-License-Identifier: Apache-2.0

package hosthop

import (
	"github.com/pxn-project/pxn/pkg/internal/testhooks"
	"github.com/pxn-project/pxn/pkg/relay"
)

// hooks let tests hold a copier's source-ready events and fail the copies
// they choose. A production copier has none, so each use costs one nil
// check.
type hooks struct {
	ready  testhooks.ReadyHolder
	faults testhooks.CopyFaults
}

func init() {
	testhooks.NewHostCopier = func(h testhooks.HostCopier) relay.Copier {
		return newHostCopier(&hooks{ready: h.Ready, faults: h.Faults})
	}
}
