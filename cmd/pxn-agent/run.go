// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/pxn-project/pxn/internal/buildinfo"
	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/version"
	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/rail"
)

// runConfig is what the run flags say.
type runConfig struct {
	kubeconfig string
	opts       agent.Options
	rail       rail.Options
}

func (c *runConfig) bind(fs *pflag.FlagSet) {
	fs.StringVar(&c.opts.NodeName, "node-name", "", "name of this node")
	bindRailFlags(fs, &c.rail)
	fs.DurationVar(&c.opts.Resync, "resync", 60*time.Second, "period of unconditional rediscovery and reconciliation")
	fs.DurationVar(&c.opts.PollInterval, "poll-interval", 2*time.Second, "period of the cheap sysfs check that triggers a rediscovery when HCAs, GPUs or port states change")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster or $KUBECONFIG")
	fs.StringVar(&c.opts.MetricsBindAddress, "metrics-bind-address", ":9640", `address of the Prometheus /metrics endpoint; "0" disables it`)
	fs.StringVar(&c.opts.HealthProbeBindAddress, "health-probe-bind-address", ":9642", `address of /healthz and /readyz; "0" disables them`)
	fs.StringVar(&c.opts.AgentVersion, "agent-version", version.String(), "version written to status.agentVersion")
}

// bindRailFlags binds the rail discovery flags that run and discover share.
func bindRailFlags(fs *pflag.FlagSet, o *rail.Options) {
	fs.StringVar(&o.HostRoot, "host-root", "/", "folder where the host's / is visible (its sys/ is read)")
	fs.StringVar(&o.Strategy, "rail-strategy", rail.StrategyPCIOrder, "how rails are named: pci-order, subnet or static")
	fs.IntVar(&o.SubnetPrefixLen, "subnet-prefix-len", rail.DefaultSubnetPrefixLen, "IPv4 prefix length of the subnet strategy")
	fs.StringVar(&o.StaticFile, "static-file", "", "static strategy: JSON object of HCA name to rail name")
}

// complete checks the flags and fills what they imply.
func (c *runConfig) complete() error {
	if c.opts.NodeName == "" {
		return errors.New("--node-name is empty and NODE_NAME is not set")
	}
	if c.opts.Resync <= 0 || c.opts.PollInterval <= 0 {
		return fmt.Errorf("--resync %v and --poll-interval %v must be positive", c.opts.Resync, c.opts.PollInterval)
	}
	c.opts.Discoverer = agent.RailDiscoverer{Options: c.rail}
	return nil
}

func newRunCommand(ctx context.Context, onRun func(*runConfig) error) *cobra.Command {
	c := &runConfig{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Discover the node's rails, publish its PxnRailMap and label the node",
		Long: `Discovers the node's rails, publishes its PxnRailMap and labels the node; keeps
both current until it is stopped (SIGTERM).`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := c.complete(); err != nil {
				return err
			}
			if onRun != nil {
				return onRun(c)
			}
			return c.run(ctx)
		},
	}
	c.bind(cmd.Flags())
	return cmd
}

// run runs the agent until ctx is done.
func (c *runConfig) run(ctx context.Context) error {
	ctrllog.SetLogger(klog.NewKlogr())
	defer klog.Flush()
	klog.InfoS("Starting pxn-agent", "version", version.String(), "revision", version.Revision(), "goVersion", runtime.Version(),
		"node", klog.KRef("", c.opts.NodeName))
	if err := buildinfo.Register(ctrlmetrics.Registry); err != nil {
		return cli.Failed(fmt.Errorf("register pxn_build_info: %w", err))
	}
	cfg, err := restConfig(c.kubeconfig)
	if err != nil {
		klog.ErrorS(err, "no Kubernetes client configuration")
		return cli.ExitError{Code: 1}
	}
	cfg.UserAgent = "pxn-agent/" + c.opts.AgentVersion
	if err := agent.Run(ctx, cfg, c.opts); err != nil {
		klog.ErrorS(err, "agent failed", "node", klog.KRef("", c.opts.NodeName))
		return cli.ExitError{Code: 1}
	}
	return nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrlconfig.GetConfig()
}
