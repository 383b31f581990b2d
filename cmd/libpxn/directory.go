// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"sort"
	"strings"
	"sync"

	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// maxHCAName is the longest raw HCA name, as pxn_target_info.hca holds it.
const maxHCAName = 63

// tableDirectory is the directory of an engine opened without a resolve
// callback: the host adds each target range with pxn_register_target. The
// engine resolves from the caller's threads and the pump while the host adds
// and removes targets.
type tableDirectory struct {
	mu       sync.RWMutex
	sessions map[string][]tableRange
	// routes holds the route handle of each session registered with one.
	routes *routeBook
}

// tableRange is one registered range, sorted by base within its session. Its
// Target is built once, so Resolve does not allocate.
type tableRange struct {
	base, len uint64
	target    relay.Target
}

var _ relay.Directory = (*tableDirectory)(nil)

func newTableDirectory(routes *routeBook) *tableDirectory {
	return &tableDirectory{sessions: make(map[string][]tableRange), routes: routes}
}

func checkSession(session string) error {
	if session == "" || len(session) > staging.MaxSession || strings.IndexByte(session, 0) >= 0 {
		return fail(codeInvalid, "target session of %d bytes; want 1..%d bytes without NUL", len(session), staging.MaxSession)
	}
	return nil
}

// register adds [base, base+n) of session, served by hca. route, when not
// 0, is the host's route handle for the session and key the range's key;
// a later registration with another route replaces the session's route.
func (d *tableDirectory) register(session, hca string, base, n, route, key uint64) error {
	if err := checkSession(session); err != nil {
		return err
	}
	if hca == "" || len(hca) > maxHCAName {
		return fail(codeInvalid, "target %q: HCA name of %d bytes; want 1..%d", session, len(hca), maxHCAName)
	}
	if n == 0 || n-1 > math.MaxUint64-base {
		return fail(codeInvalid, "target %q: range %#x+%d is empty or wraps", session, base, n)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.sessions[session]
	for _, r := range old {
		if base <= r.base+(r.len-1) && r.base <= base+(n-1) {
			return fail(codeInvalid, "target %q: range %#x+%d overlaps registered range %#x+%d", session, base, n, r.base, r.len)
		}
	}
	rs := make([]tableRange, 0, len(old)+1)
	rs = append(rs, old...)
	rg := relay.Range{Addr: base, Len: n}
	if route != 0 {
		rg.Key = key
		d.routes.set(session, route)
	}
	rs = append(rs, tableRange{base: base, len: n, target: relay.Target{
		HCAs:   []string{hca},
		Ranges: []relay.Range{rg},
	}})
	sort.Slice(rs, func(i, j int) bool { return rs[i].base < rs[j].base })
	d.sessions[session] = rs
	return nil
}

func (d *tableDirectory) unregister(session string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.sessions[session]; !ok {
		return fail(codeInvalid, "target %q is not registered", session)
	}
	delete(d.sessions, session)
	d.routes.forget(session)
	return nil
}

// Resolve returns the HCA and range of the registered range holding dst.
func (d *tableDirectory) Resolve(session string, dst uint64) (relay.Target, error) {
	d.mu.RLock()
	rs := d.sessions[session]
	d.mu.RUnlock()
	i := sort.Search(len(rs), func(i int) bool { return rs[i].base > dst }) - 1
	if i < 0 || dst-rs[i].base >= rs[i].len {
		if len(rs) == 0 {
			return relay.Target{}, fail(codeInvalid, "target %q is not registered", session)
		}
		return relay.Target{}, fail(codeInvalid, "target %q: %#x is outside its registered ranges", session, dst)
	}
	return rs[i].target, nil
}
