// SPDX-License-Identifier: Apache-2.0

package main

/*
#cgo CFLAGS: -I${SRCDIR} -I${SRCDIR}/../../include
#include "shim.h"
*/
import "C"

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
)

// openTimeout bounds pxn_open's wait for the registry lock.
const openTimeout = 10 * time.Second

// cTransport is the host's transport table: submit and poll, and
// submit_piece where the host takes relayed Pieces whole (nil: it does
// not). user is the host's context pointer, kept as an integer.
type cTransport struct {
	submit C.pxn_transport_submit_fn
	poll   C.pxn_transport_poll_fn
	piece  C.pxn_transport_submit_piece_fn
	user   C.uintptr_t
}

// cArenaCallbacks registers the staging arena with the host's NIC; both
// nil when the host needs no registration.
type cArenaCallbacks struct {
	register   C.pxn_register_arena_fn
	deregister C.pxn_deregister_arena_fn
	user       C.uintptr_t
}

// openArgs is pxn_open's options, checked and in the ABI this library
// speaks.
type openArgs struct {
	abi      hostABI
	localHCA string
	// transport carries ops; the directory is resolve when set, else the
	// targets the host registers.
	transport   cTransport
	resolve     C.pxn_resolve_fn
	resolveUser C.uintptr_t
	arena       cArenaCallbacks
	// copier is a copier kind; device is the GPU a CUDA copier goes on.
	copier     uint32
	device     deviceChoice
	maxBatches int
}

// openEngine builds an engine for a host: the first hop, the hop over the
// host's transport, the directory, and the relay engine configured by the
// MC_PXN_* variables read through lookup.
func openEngine(a openArgs, lookup func(string) (string, bool)) (*engine, error) {
	log := klog.Background()
	env := engineopen.ReadEnv(lookup)
	pxnOn := env.Config.Enable && a.localHCA != ""
	first, err := newFirstHop(a.copier, pxnOn, a.device, env.Config.CopyMode, log)
	if err != nil {
		return nil, err
	}
	bufs := &cBuffers{}
	routes := &routeBook{}
	arena := &cArena{regFn: a.arena.register, deregFn: a.arena.deregister, user: a.arena.user, kind: first.arenaKind}
	hop := &cHop{submitFn: a.transport.submit, pollFn: a.transport.poll, user: a.transport.user, bufs: bufs,
		abi: a.abi, arena: arena, routes: routes}
	var engineHop relay.Hop = hop
	if a.transport.piece != nil {
		engineHop = cPieceHop{cHop: hop, pieceFn: a.transport.piece}
	}
	arena.busy = hop.held.Load
	var dir relay.Directory
	var table *tableDirectory
	if a.resolve != nil {
		dir = &callbackDirectory{fn: a.resolve, user: a.resolveUser, bufs: bufs, routes: routes}
	} else {
		table = newTableDirectory(routes)
		dir = table
	}
	release := func() {
		hop.releaseAll()
		bufs.releaseAll()
	}
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	eng, err := engineopen.Open(ctx, env, engineopen.HostDeps{
		Hop: engineHop, Directory: dir, Copier: first.copier, LocalHCA: a.localHCA,
		Arenas: first.arenas, Memory: arena, Logger: log,
	})
	if err != nil {
		_ = first.copier.Close()
		_ = first.close()
		release()
		return nil, fail(codeIO, "pxn_open: %w", err)
	}
	if !eng.PXNActive() && first.kind != copierDefault {
		// PXN did not come up (its configuration or registry refused): no
		// copier runs, and its streams go now. The GPU stays retained until
		// pxn_close: a quarantined arena lives in it.
		first.kind = copierDefault
		if err := first.copier.Close(); err != nil {
			log.Info("pxn first hop: closing the unused copier failed", "err", err.Error())
		}
	}
	return newEngine(eng, engineSetup{first: first, arena: arena, table: table, release: release,
		abi: a.abi, maxBatches: a.maxBatches}), nil
}
