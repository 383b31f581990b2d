// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
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
	"github.com/pxn-project/pxn/pkg/deviceplugin"
	"github.com/pxn-project/pxn/pkg/rail"
)

// runConfig is what the run flags say.
type runConfig struct {
	kubeconfig string
	opts       agent.Options
	rail       rail.Options
	ranks      agent.RankMetricsOptions
	// podResourcesSocket names the pods behind the ranks ("": it does not).
	podResourcesSocket string
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
	fs.StringVar(&c.ranks.ShmDir, "shm-dir", "/dev/shm/pxn", `the device plugin's --shm-dir: the ranks of each job register in its group folders, which the agent reads (never writes) for the pxn_* rank metrics; "" turns those metrics off`)
	fs.StringVar(&c.ranks.StateDir, "state-dir", "/run/pxn", "the device plugin's --state-dir: its slot links name each device's group folder")
	fs.StringVar(&c.podResourcesSocket, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", `the kubelet's PodResources socket, which names the pod holding each group folder; "" leaves the namespace and pod labels empty`)
	fs.StringVar(&c.ranks.ResourceName, "resource-name", "pxn.io/relay", "the device plugin's extended resource")
	fs.StringSliceVar(&c.ranks.Labels, "rank-metric-labels", agent.RankLabels, "labels of the pxn_* rank metrics, some of "+strings.Join(agent.RankLabels, ",")+"; ranks whose kept labels agree are summed")
	fs.DurationVar(&c.ranks.StaleAfter, "rank-stale-after", 10*time.Second, "leave out of the rank metrics a rank whose heartbeat is older (exited or hung)")
}

// bindRailFlags binds the rail discovery flags that run and discover share.
func bindRailFlags(fs *pflag.FlagSet, o *rail.Options) {
	fs.StringVar(&o.NodeRoot, "host-root", "/", "folder where the host's / is visible (its sys/ is read)")
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
	if c.ranks.ShmDir != "" {
		if c.ranks.StaleAfter <= 0 {
			return fmt.Errorf("--rank-stale-after %v must be positive", c.ranks.StaleAfter)
		}
		c.ranks.NodeName = c.opts.NodeName
		// Checked here, so that a bad label list is a usage error.
		if _, err := agent.NewRankCollector(c.ranks); err != nil {
			return fmt.Errorf("--rank-metric-labels: %w", err)
		}
		c.opts.Ranks = &c.ranks
	}
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
	if c.opts.Ranks != nil && c.podResourcesSocket != "" {
		pods, err := deviceplugin.NewPodResourcesClient(c.podResourcesSocket)
		if err != nil {
			klog.ErrorS(err, "no PodResources client; rank metrics go without pod labels")
		} else {
			defer pods.Close()
			c.opts.Ranks.Pods = pods
		}
	}
	c.opts.Logger = klog.Background()
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
