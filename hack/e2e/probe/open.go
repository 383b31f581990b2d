// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
)

// runOpen sets each VAR=VALUE of args over the container's environment,
// opens an engine from it as a host process does, prints whether PXN is on,
// and holds the engine until SIGTERM or SIGINT.
func runOpen(args []string) error {
	for _, kv := range args {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, contract.EnvPrefix) {
			return fmt.Errorf("open: %q: want %sNAME=VALUE", kv, contract.EnvPrefix)
		}
		if err := os.Setenv(k, v); err != nil {
			return err
		}
	}
	ctx := context.Background()
	eng, err := engineopen.OpenFromEnv(ctx, nil, engineopen.HostDeps{Hop: idleHop{}, Directory: noTargets{},
		Copier: cpucopy.NewHostCopier(cpucopy.HostCopierOptions{}), LocalHCA: "mlx5_0"})
	if err != nil {
		return err
	}
	defer eng.Close(ctx)
	fmt.Printf("pxn active %v\n", eng.PXNActive())
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
	return nil
}

// idleHop and noTargets are a host transport that carries nothing.
type idleHop struct{}

func (idleHop) Submit([]relay.WriteOp) error   { return relay.ErrHopBusy }
func (idleHop) Poll([]relay.HopCompletion) int { return 0 }

type noTargets struct{}

func (noTargets) Resolve(string, uint64) (relay.Target, error) {
	return relay.Target{}, errors.New("no targets")
}
