// SPDX-License-Identifier: Apache-2.0

// Command pxn-dra-plugin is PXN's Dynamic Resource Allocation driver,
// pxn.io: it publishes the node's relay device and prepares every
// ResourceClaim allocated to it as one group, whose containers get the
// engine's environment and the group's folder. See docs/dra.md.
//
// Every flag can also be set from the environment, PXN_DRA_PLUGIN_<FLAG>.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/daemon"
	"github.com/pxn-project/pxn/internal/railflags"
	"github.com/pxn-project/pxn/internal/version"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/dra"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/nodestate"
)

type options struct {
	nodeName           string
	kubeconfig         string
	cdiDir             string
	pluginsDir         string
	registryDir        string
	stateDir           string
	shmDir             string
	registryRoot       string
	groupID            string
	endpoints          daemon.Endpoints
	rediscoverInterval time.Duration
	rail               railflags.Flags
}

func (o *options) bind(fs *pflag.FlagSet) {
	cli.BindNodeName(fs, &o.nodeName)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for the API server; empty: in-cluster config")
	fs.StringVar(&o.cdiDir, "cdi-dir", "/var/run/cdi", "folder the container runtime reads CDI specs from; one spec per prepared claim")
	fs.StringVar(&o.pluginsDir, "kubelet-plugins-dir", dra.DefaultKubeletPluginsDir, "kubelet's plugins folder; the DRA socket is <folder>/"+dra.DriverName+"/dra.sock")
	fs.StringVar(&o.registryDir, "kubelet-registry-dir", dra.DefaultKubeletRegistryDir, "kubelet's plugin registration folder")
	fs.StringVar(&o.stateDir, "state-dir", "/run/pxn-dra", "host folder for the checkpoint of prepared claims")
	fs.StringVar(&o.shmDir, "shm-dir", "/dev/shm/pxn-dra", "host tmpfs folder for group folders (<shm-dir>/groups); not the device plugin's, whose collector removes folders it did not make")
	fs.StringVar(&o.registryRoot, "container-registry-root", "/run/pxn", "container path of the group folder mount, and "+contract.EnvRegistryRoot)
	fs.StringVar(&o.groupID, "group-id", "k8s", contract.EnvGroupID+" handed to every container")
	o.endpoints.Bind(fs, ":9644", ":9645")
	fs.DurationVar(&o.rediscoverInterval, "rediscover-interval", 30*time.Second, "how often rails and port states are re-read")
	o.rail.Bind(fs)
}

// validate checks every flag; the error names the flag.
func (o *options) validate() error {
	if o.nodeName == "" {
		return errors.New("--node-name is empty and " + cli.NodeNameEnv + " is not set")
	}
	if o.rediscoverInterval <= 0 {
		return cli.FlagError("rediscover-interval", o.rediscoverInterval, errors.New("must be positive"))
	}
	if err := contract.ValidateGroupID(o.groupID); err != nil {
		return cli.FlagError("group-id", contract.Quote(o.groupID), err)
	}
	if err := contract.ValidateRegistryRoot(o.registryRoot); err != nil {
		return cli.FlagError("container-registry-root", contract.Quote(o.registryRoot), err)
	}
	return o.rail.Validate()
}

const envPrefix = "PXN_DRA_PLUGIN"

func main() { daemon.Main(execute) }

// execute runs the command line args: exit 0, 1 when the driver failed, 2
// on bad usage.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Execute(newRootCommand(ctx, stdout, stderr), args, stderr)
}

func newRootCommand(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	var o options
	root := &cobra.Command{
		Use:   "pxn-dra-plugin",
		Short: "Dynamic Resource Allocation driver for PXN's relay device",
		Long: `pxn-dra-plugin is the DRA driver pxn.io. It publishes the node's relay device
and prepares every ResourceClaim allocated to it as one group: the claim's
containers get the engine's environment (MC_PXN_*) and the group's folder.
It runs until it is stopped (SIGTERM).`,
		Args: cobra.NoArgs,
		RunE: daemon.RunE(ctx, "pxn-dra-plugin", o.validate, o.run),
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	o.bind(root.Flags())
	cli.Setup(root, envPrefix, nil)
	return root
}

func (o *options) run(ctx context.Context) error {
	log := klog.Background()
	client, apiConfig, err := apiClient(o.kubeconfig)
	if err != nil {
		return err
	}
	monitor := nodestate.NewMonitor(o.rail.Discoverer(), nodestate.Options{Interval: o.rediscoverInterval, Logger: log})
	driver, err := dra.New(dra.Config{
		NodeName: o.nodeName,
		Member:   group.Member{GroupID: o.groupID, RegistryRoot: o.registryRoot},
		ShmDir:   o.shmDir,
		CDIDir:   o.cdiDir,
		StateDir: o.stateDir,
		Pods:     client.CoreV1(),
		Version:  version.String(),
		Logger:   log,
	}, monitor)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Serve may fail while ctx lives: stop the servers and the monitor
	// before waiting for them.
	defer func() {
		cancel()
		wg.Wait()
	}()
	if err := o.endpoints.Serve(ctx, &wg, daemon.ProcessRegistry(), driver.Registered, apiConfig); err != nil {
		return err
	}
	wg.Go(func() { monitor.Run(ctx) })
	return driver.Serve(ctx, client, dra.ServeOptions{PluginsDir: o.pluginsDir, RegistryDir: o.registryDir})
}

// apiClient is the API client; the driver cannot work without one.
func apiClient(kubeconfig string) (kubernetes.Interface, *rest.Config, error) {
	cfg, err := daemon.RESTConfig(kubeconfig, "pxn-dra-plugin")
	if err != nil {
		return nil, nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("API client: %w", err)
	}
	return client, cfg, nil
}
