// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"github.com/pxn-project/pxn/pkg/staging"
)

// DeviceNamer is implemented by an ArenaProvider whose arenas live in a
// device the rank can name (a GPU's PCI bus id or UUID).
type DeviceNamer interface {
	Device() string
}

// deviceName is what the rank records as its device: Options.Device, else
// the provider's name for it, else "host" for a host-memory arena.
func (o *Options) deviceName() string {
	if o.Device != "" {
		return o.Device
	}
	if n, ok := o.Arenas.(DeviceNamer); ok {
		return n.Device()
	}
	if o.Arenas.Kind() == staging.ArenaHost {
		return "host"
	}
	return ""
}

// PublishStats publishes st's counters into the rank's control file for
// readers outside the process (the node agent, inspect): UpdatedAt is
// stamped with now (a MonoNanos reading) and InboundLanes counted here, from
// the owners of the rank's lanes. It takes no lock and makes one system
// call, the write of the control block into the file. The pump calls it,
// at most once a heartbeat, never concurrently with or after Close.
func (r *Rank) PublishStats(st *staging.RankStats, now int64) {
	st.UpdatedAt = uint64(now)
	st.InboundLanes = 0
	for i := range r.ctl.Lanes {
		if _, held := r.ctl.Lanes[i].Owner.Load(); held {
			st.InboundLanes++
		}
	}
	r.ctl.Stats.Publish(st)
	r.flushControl()
}
