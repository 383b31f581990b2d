// SPDX-License-Identifier: Apache-2.0

// Package railflags binds the rail discovery flags the node plugins share,
// named as in pxn-agent.
package railflags

import (
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/nodestate"
	"github.com/pxn-project/pxn/pkg/rail"
)

// Flags are the rail strategy's parameters.
type Flags struct {
	NodeRoot        string
	Strategy        string
	subnetPrefixLen int
	staticFile      string
}

// Bind adds the flags to fs.
func (r *Flags) Bind(fs *pflag.FlagSet) {
	fs.StringVar(&r.NodeRoot, "host-root", "/", "root of the host filesystem for rail discovery (sysfs under it)")
	fs.StringVar(&r.Strategy, "rail-strategy", "pci-order", "canonical rail strategy: pci-order, subnet or static")
	fs.IntVar(&r.subnetPrefixLen, "subnet-prefix-len", rail.DefaultSubnetPrefixLen, "IPv4 prefix length of the subnet rail strategy")
	fs.StringVar(&r.staticFile, "static-file", "", "static rail strategy: JSON object of HCA name to rail name")
}

// Discoverer returns the discoverer the flags describe.
func (r *Flags) Discoverer(log klog.Logger) (nodestate.Discoverer, error) {
	switch r.Strategy {
	case rail.StrategyPCIOrder, rail.StrategySubnet, rail.StrategyStatic:
	default:
		return nil, fmt.Errorf("--rail-strategy=%q: want %s, %s or %s", r.Strategy, rail.StrategyPCIOrder, rail.StrategySubnet, rail.StrategyStatic)
	}
	return &nodestate.RailDiscoverer{Logger: log, Options: rail.Options{
		NodeRoot:        r.NodeRoot,
		Strategy:        r.Strategy,
		SubnetPrefixLen: r.subnetPrefixLen,
		StaticFile:      r.staticFile,
	}}, nil
}
