// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/deviceplugin"
	"github.com/pxn-project/pxn/pkg/rail"
)

// railFlags are the rail strategy's parameters, named as in pxn-agent.
type railFlags struct {
	subnetPrefixLen int
	staticFile      string
}

func (r *railFlags) bind(fs *pflag.FlagSet) {
	fs.IntVar(&r.subnetPrefixLen, "subnet-prefix-len", rail.DefaultSubnetPrefixLen, "IPv4 prefix length of the subnet rail strategy")
	fs.StringVar(&r.staticFile, "static-file", "", "static rail strategy: JSON object of HCA name to rail name")
}

func (r *railFlags) discoverer(hostRoot, strategy string) (deviceplugin.Discoverer, error) {
	switch strategy {
	case rail.StrategyPCIOrder, rail.StrategySubnet, rail.StrategyStatic:
	default:
		return nil, fmt.Errorf("--rail-strategy=%q: want %s, %s or %s", strategy, rail.StrategyPCIOrder, rail.StrategySubnet, rail.StrategyStatic)
	}
	return &railDiscoverer{opts: rail.Options{
		HostRoot:        hostRoot,
		Strategy:        strategy,
		SubnetPrefixLen: r.subnetPrefixLen,
		StaticFile:      r.staticFile,
	}}, nil
}

// railDiscoverer adapts rail.Discover to deviceplugin.Discoverer.
type railDiscoverer struct {
	opts rail.Options

	mu           sync.Mutex
	lastWarnings []string
}

func (d *railDiscoverer) Discover(ctx context.Context) (string, bool, error) {
	l, err := rail.Discover(ctx, d.opts)
	if err != nil {
		return "", false, err
	}
	d.mu.Lock()
	if !slices.Equal(l.Warnings, d.lastWarnings) {
		for _, w := range l.Warnings {
			klog.InfoS("Rail discovery warning", "warning", w)
		}
		d.lastWarnings = l.Warnings
	}
	d.mu.Unlock()
	return l.RailMapJSON(), l.Healthy(), nil
}
