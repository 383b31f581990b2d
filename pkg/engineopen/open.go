// SPDX-License-Identifier: Apache-2.0

// Package engineopen builds an engine for a host process: it reads the
// process's MC_PXN_* environment, registers the rank in the shared-memory
// registry and hands the engine an adapter of that registry.
package engineopen

import (
	"context"
	"errors"
	"fmt"
	"os"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// HostDeps are what a host process supplies to OpenFromEnv: its transport,
// its directory, its first-hop copier and the one HCA it uses.
type HostDeps struct {
	Hop       relay.Hop
	Directory relay.Directory
	Copier    relay.Copier
	LocalHCA  string
	// Arenas allocates the staging arena; nil means host memory.
	Arenas staging.ArenaProvider
	// Memory registers the arena with the host's NIC, so that the relay's
	// second hop can read from it; nil when the hop needs no registration.
	Memory staging.MemoryRegistrar
	Logger klog.Logger
}

// OpenFromEnv reads the MC_PXN_* variables through lookup (nil: the
// process environment) and opens an engine. Whatever goes wrong on the PXN
// side (bad values, an unsafe registry, no HCA) is logged once and leaves an
// engine that sends everything direct: a host process never fails to start
// because of PXN. Only a missing hop is an error.
//
// A refused variable is logged at error severity, naming the variable and
// its value, and, when MC_PXN_REGISTRY_ROOT names a usable root, recorded
// there for the node agent (registry.WriteRefusal): a rank that refused its
// configuration registers no control file the agent could read.
func OpenFromEnv(ctx context.Context, lookup func(string) (string, bool), deps HostDeps) (*relay.Engine, error) {
	log := deps.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	if lookup == nil {
		lookup = os.LookupEnv
	}
	var refused []registry.RefusedVariable
	cfg := engineconfig.Load(lookup, func(err error) {
		v := refusedVariable(err)
		refused = append(refused, v)
		log.Error(err, "PXN configuration refused; sending direct", "variable", v.Name, "value", v.Value)
	})
	recordRefusal(lookup, refused, cfg.Enable, log)
	base := relay.Deps{Hop: deps.Hop, Directory: deps.Directory, Copier: deps.Copier, LocalHCA: deps.LocalHCA, Logger: log,
		ConfigRefused: len(refused)}
	if !cfg.Enable {
		return relay.Open(cfg, base)
	}
	reg, err := register(ctx, cfg, deps, log)
	if err != nil {
		log.Error(err, "PXN registry unavailable; sending direct")
		cfg.Enable = false
		return relay.Open(cfg, base)
	}
	base.Registry = reg
	e, err := relay.Open(cfg, base)
	if err != nil {
		_ = reg.Close(ctx)
		log.Error(err, "PXN engine refused its dependencies; sending direct")
		cfg.Enable = false
		base.Registry = nil
		return relay.Open(cfg, base)
	}
	return e, nil
}

func refusedVariable(err error) registry.RefusedVariable {
	var e *engineconfig.EnvError
	if errors.As(err, &e) {
		return registry.RefusedVariable{Name: e.Var, Value: e.Value, Reason: e.Err.Error()}
	}
	return registry.RefusedVariable{Name: contract.EnvEnable, Reason: err.Error()}
}

// recordRefusal writes this process's refusal record into the registry
// root, or, once the configuration is accepted, removes the record an
// earlier process of the same pid left there. Without a root the variable
// names, and one that is itself refused, nothing is written: the default
// root is shared by every process of the host and read by no agent.
func recordRefusal(lookup func(string) (string, bool), refused []registry.RefusedVariable, enabled bool, log klog.Logger) {
	root, err := engineconfig.RegistryRootFromEnv(lookup)
	if err != nil || root == "" {
		return
	}
	pid := os.Getpid()
	switch {
	case len(refused) > 0:
		if err := registry.WriteRefusal(root, registry.Refusal{Pid: pid, Variables: refused}); err != nil {
			log.Error(err, "PXN refusal record not written; the node agent will not count this refusal", "root", root)
		}
	case enabled:
		if err := registry.RemoveRefusal(root, pid); err != nil {
			log.V(2).Info("stale PXN refusal record not removed", "root", root, "err", err.Error())
		}
	}
}

func register(ctx context.Context, cfg engineconfig.Config, deps HostDeps, log klog.Logger) (*StagingRegistry, error) {
	if deps.LocalHCA == "" {
		return nil, fmt.Errorf("no local HCA name")
	}
	if deps.Copier == nil || deps.Directory == nil {
		return nil, fmt.Errorf("PXN needs a copier and a directory")
	}
	rank, err := registry.Register(ctx, registry.Options{
		Root:             cfg.RegistryRoot,
		Group:            cfg.GroupID,
		UID:              os.Geteuid(),
		Rail:             staging.CanonicalRail(cfg.RailMap, deps.LocalHCA),
		HCA:              deps.LocalHCA,
		HeartbeatTimeout: cfg.HeartbeatTimeout,
		Arenas:           deps.Arenas,
		Memory:           deps.Memory,
		Logger:           log,
	})
	if err != nil {
		return nil, err
	}
	return NewStagingRegistry(rank), nil
}
