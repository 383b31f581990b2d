// SPDX-License-Identifier: Apache-2.0

// Package railflags binds the rail discovery flags of every binary that
// discovers the node's rails: pxn-agent (run and discover),
// pxn-device-plugin and pxn-dra-plugin.
package railflags

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/pxn-project/pxn/pkg/nodestate"
	"github.com/pxn-project/pxn/pkg/rail"
)

// Flags are the rail strategy's parameters.
type Flags struct {
	o rail.Options
}

// Bind adds the flags to fs.
func (r *Flags) Bind(fs *pflag.FlagSet) {
	fs.StringVar(&r.o.NodeRoot, "host-root", "/", "folder where the host's / is visible (its sys/ is read)")
	fs.StringVar(&r.o.Strategy, "rail-strategy", rail.StrategyPCIOrder, "how rails are named: pci-order, subnet or static")
	fs.IntVar(&r.o.SubnetPrefixLen, "subnet-prefix-len", rail.DefaultSubnetPrefixLen, "IPv4 prefix length of the subnet strategy")
	fs.StringVar(&r.o.StaticFile, "static-file", "", "static strategy: JSON object of HCA name to rail name")
}

// Validate checks the flags' values; the error names the flag.
func (r *Flags) Validate() error {
	switch r.o.Strategy {
	case rail.StrategyPCIOrder:
	case rail.StrategySubnet:
		if n := r.o.SubnetPrefixLen; n < 1 || n > 32 {
			return fmt.Errorf("--subnet-prefix-len=%d: want 1..32", n)
		}
	case rail.StrategyStatic:
		if r.o.StaticFile == "" {
			return errors.New("--rail-strategy=static needs --static-file")
		}
	default:
		return fmt.Errorf("--rail-strategy=%q: want %s, %s or %s", r.o.Strategy, rail.StrategyPCIOrder, rail.StrategySubnet, rail.StrategyStatic)
	}
	return nil
}

// Options are the discovery options the flags describe.
func (r *Flags) Options() rail.Options { return r.o }

// Discoverer returns the discoverer the flags describe.
func (r *Flags) Discoverer() nodestate.RailDiscoverer {
	return nodestate.RailDiscoverer{Options: r.o}
}
