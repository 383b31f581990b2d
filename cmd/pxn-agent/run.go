package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/pxn-project/pxn/pkg/agent"
	"github.com/pxn-project/pxn/pkg/rail"
)

func runMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runAgent(ctx, args, os.Stderr)
}

// runConfig is what the run flags say.
type runConfig struct {
	kubeconfig string
	opts       agent.Options
	rail       rail.Options
}

func parseRunFlags(args []string, stderr io.Writer) (*runConfig, error) {
	fs := flag.NewFlagSet("pxn-agent run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	klog.InitFlags(fs)
	c := &runConfig{}
	fs.StringVar(&c.opts.NodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node (default $NODE_NAME)")
	fs.StringVar(&c.rail.HostRoot, "host-root", "/", "folder where the host's / is visible (its sys/ is read)")
	fs.StringVar(&c.rail.Strategy, "rail-strategy", rail.StrategyPCIOrder, "how rails are named: pci-order, subnet or static")
	fs.IntVar(&c.rail.SubnetPrefixLen, "subnet-prefix-len", rail.DefaultSubnetPrefixLen, "IPv4 prefix length of the subnet strategy")
	fs.StringVar(&c.rail.StaticFile, "static-file", "", "static strategy: JSON object of HCA name to rail name")
	fs.DurationVar(&c.opts.Resync, "resync", 60*time.Second, "period of unconditional rediscovery and reconciliation")
	fs.DurationVar(&c.opts.PollInterval, "poll-interval", 2*time.Second, "period of the cheap sysfs check that triggers a rediscovery when HCAs, GPUs or port states change")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster or $KUBECONFIG")
	fs.StringVar(&c.opts.MetricsBindAddress, "metrics-bind-address", ":9640", `address of the Prometheus /metrics endpoint; "0" disables it`)
	fs.StringVar(&c.opts.HealthProbeBindAddress, "health-probe-bind-address", ":9642", `address of /healthz and /readyz; "0" disables them`)
	fs.StringVar(&c.opts.AgentVersion, "agent-version", buildVersion(), "version written to status.agentVersion")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: pxn-agent [run] [flags]")
		fmt.Fprintln(stderr, "Discovers the node's rails, publishes its PxnRailMap and labels the node.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.opts.NodeName == "" {
		return nil, errors.New("--node-name is empty and NODE_NAME is not set")
	}
	if c.opts.Resync <= 0 || c.opts.PollInterval <= 0 {
		return nil, fmt.Errorf("--resync %v and --poll-interval %v must be positive", c.opts.Resync, c.opts.PollInterval)
	}
	c.opts.Discoverer = agent.RailDiscoverer{Options: c.rail}
	return c, nil
}

// runAgent runs the agent until ctx is done: exit 0 then, 1 when it fails,
// 2 on bad usage.
func runAgent(ctx context.Context, args []string, stderr io.Writer) int {
	c, err := parseRunFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "pxn-agent run: %v\n", err)
		return 2
	}
	ctrllog.SetLogger(klog.NewKlogr())
	defer klog.Flush()
	cfg, err := restConfig(c.kubeconfig)
	if err != nil {
		klog.ErrorS(err, "no Kubernetes client configuration")
		return 1
	}
	cfg.UserAgent = "pxn-agent/" + c.opts.AgentVersion
	if err := agent.Run(ctx, cfg, c.opts); err != nil {
		klog.ErrorS(err, "agent failed", "node", klog.KRef("", c.opts.NodeName))
		return 1
	}
	return 0
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrlconfig.GetConfig()
}

// buildVersion is the module version the binary was built from, with the VCS
// revision when the build recorded one; "devel" when neither is known.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	v := bi.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}
