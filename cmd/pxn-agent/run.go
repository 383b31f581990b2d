// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	"github.com/pxn-project/pxn/internal/daemon"
	"github.com/pxn-project/pxn/internal/railflags"
	"github.com/pxn-project/pxn/internal/version"
	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/podresources"
)

// runConfig is what the run flags say.
type runConfig struct {
	kubeconfig string
	opts       agent.Options
	rail       railflags.Flags
	endpoints  daemon.Endpoints
	ranks      agent.RankMetricsOptions
	// podResourcesSocket names the pods running on the node ("": the owner
	// records are taken as they are).
	podResourcesSocket string
	// stateDir and resourceName are flags of an earlier version, accepted
	// and ignored.
	stateDir, resourceName string
}

func (c *runConfig) bind(fs *pflag.FlagSet) {
	cli.BindNodeName(fs, &c.opts.NodeName)
	c.rail.Bind(fs)
	fs.DurationVar(&c.opts.Resync, "resync", 60*time.Second, "period of unconditional rediscovery and reconciliation")
	fs.DurationVar(&c.opts.PollInterval, "poll-interval", 2*time.Second, "period of the cheap sysfs check that triggers a rediscovery when HCAs, GPUs or port states change")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster or $KUBECONFIG")
	c.endpoints.Bind(fs, ":9640", ":9642")
	fs.StringVar(&c.opts.AgentVersion, "agent-version", version.String(), "version written to status.agentVersion")
	fs.StringSliceVar(&c.ranks.ShmDirs, "shm-dirs", []string{"/dev/shm/pxn", "/dev/shm/pxn-dra"}, `the node plugins' --shm-dir folders, comma-separated (the device plugin's, the DRA driver's): the ranks of each job register in their group folders, which the agent reads (never writes) for the pxn_* rank metrics, with the owner records that name each folder's pods; "" turns those metrics off`)
	fs.StringVar(&c.podResourcesSocket, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", `the kubelet's PodResources socket, which says which pods still run, so that a pod an owner record names after it ended is left out; "" takes the records as they are`)
	fs.StringVar(&c.stateDir, "state-dir", "", "")
	fs.StringVar(&c.resourceName, "resource-name", "", "")
	_ = fs.MarkDeprecated("state-dir", "the node plugins' owner records name each group folder's pods; it has no effect")
	_ = fs.MarkDeprecated("resource-name", "the node plugins' owner records name each group folder's pods; it has no effect")
	fs.StringSliceVar(&c.ranks.Labels, "rank-metric-labels", agent.RankLabels, "labels of the pxn_* rank metrics, some of "+strings.Join(agent.RankLabels, ",")+"; ranks whose kept labels agree are summed")
	fs.DurationVar(&c.ranks.StaleAfter, "rank-stale-after", 10*time.Second, "leave out of the rank metrics a rank whose heartbeat is older (exited or hung)")
}

// complete checks the flags and fills what they imply; the error names the
// flag.
func (c *runConfig) complete() error {
	if c.opts.NodeName == "" {
		return errors.New("--node-name is empty and " + cli.NodeNameEnv + " is not set")
	}
	if c.opts.Resync <= 0 {
		return cli.FlagError("resync", c.opts.Resync, errors.New("must be positive"))
	}
	if c.opts.PollInterval <= 0 {
		return cli.FlagError("poll-interval", c.opts.PollInterval, errors.New("must be positive"))
	}
	if err := c.rail.Validate(); err != nil {
		return err
	}
	c.opts.Discoverer = c.rail.Discoverer()
	c.opts.MetricsBindAddress, c.opts.HealthProbeBindAddress = c.endpoints.Metrics, c.endpoints.Health
	c.opts.MetricsSecure = c.endpoints.MetricsSecure
	if slices.ContainsFunc(c.ranks.ShmDirs, func(d string) bool { return d != "" }) {
		if c.ranks.StaleAfter <= 0 {
			return cli.FlagError("rank-stale-after", c.ranks.StaleAfter, errors.New("must be positive"))
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
		RunE: daemon.RunE(ctx, "pxn-agent", c.complete, c.run),
	}
	if onRun != nil {
		cmd.RunE = func(*cobra.Command, []string) error {
			if err := c.complete(); err != nil {
				return err
			}
			return onRun(c)
		}
	}
	c.bind(cmd.Flags())
	return cmd
}

// run runs the agent until ctx is done.
func (c *runConfig) run(ctx context.Context) error {
	ctrllog.SetLogger(klog.NewKlogr())
	if err := buildinfo.Register(ctrlmetrics.Registry); err != nil {
		return fmt.Errorf("register pxn_build_info: %w", err)
	}
	cfg, err := restConfig(c.kubeconfig)
	if err != nil {
		return fmt.Errorf("no Kubernetes client configuration: %w", err)
	}
	cfg.UserAgent = "pxn-agent/" + c.opts.AgentVersion
	if c.opts.Ranks != nil && c.podResourcesSocket != "" {
		pods, err := podresources.New(c.podResourcesSocket)
		if err != nil {
			klog.ErrorS(err, "no PodResources client; rank metrics go without pod labels")
		} else {
			defer pods.Close()
			c.opts.Ranks.Pods = pods
		}
	}
	c.opts.Logger = klog.Background()
	return agent.Run(ctx, cfg, c.opts)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrlconfig.GetConfig()
}
