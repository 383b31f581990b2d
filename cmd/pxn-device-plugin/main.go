// SPDX-License-Identifier: Apache-2.0

// Command pxn-device-plugin is the kubelet device plugin for PXN's relay
// resource (pxn.io/relay): every container that requests it gets the engine's
// environment and its job's registry directory. See docs/device-plugin.md.
//
// Every flag can also be set from the environment, PXN_DEVICE_PLUGIN_<FLAG>
// (see docs/operations.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/daemon"
	"github.com/pxn-project/pxn/internal/railflags"
	"github.com/pxn-project/pxn/internal/version"
	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/deviceplugin"
	"github.com/pxn-project/pxn/pkg/nodestate"
	"github.com/pxn-project/pxn/pkg/podresources"
)

type options struct {
	resourceName       string
	devices            int
	devicePluginDir    string
	podResourcesSocket string
	stateDir           string
	shmDir             string
	registryRoot       string
	groupID            string
	kubeconfig         string
	metricsAddr        string
	healthAddr         string
	gcInterval         time.Duration
	gcGrace            time.Duration
	gcKubeletSettle    time.Duration
	rediscoverInterval time.Duration
	podLookupTimeout   time.Duration
	rail               railflags.Flags
}

func (o *options) bind(fs *pflag.FlagSet) {
	fs.StringVar(&o.resourceName, "resource-name", "pxn.io/relay", "extended resource to advertise")
	fs.IntVar(&o.devices, "devices", 16, "number of virtual devices (shared and counted, no topology)")
	fs.StringVar(&o.devicePluginDir, "device-plugin-dir", "/var/lib/kubelet/device-plugins", "kubelet's device plugin directory, holding kubelet.sock")
	fs.StringVar(&o.podResourcesSocket, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "kubelet's PodResources v1 socket")
	fs.StringVar(&o.stateDir, "state-dir", "/run/pxn", "host folder for the per-device slot links (<state-dir>/slots)")
	fs.StringVar(&o.shmDir, "shm-dir", "/dev/shm/pxn", "host tmpfs folder for group directories (<shm-dir>/groups)")
	fs.StringVar(&o.registryRoot, "container-registry-root", "/run/pxn", "container path of the group directory mount, and "+contract.EnvRegistryRoot)
	fs.StringVar(&o.groupID, "group-id", "k8s", contract.EnvGroupID+" handed to every container")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for the API server; empty: in-cluster config when in a pod, else no API access")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":9641", `address of the Prometheus /metrics endpoint; "0" disables it`)
	fs.StringVar(&o.healthAddr, "health-probe-bind-address", ":9643", `address of /healthz (the process serves) and /readyz (registered with the kubelet); "0" disables them`)
	fs.DurationVar(&o.gcInterval, "gc-interval", 30*time.Second, "how often unused slot links and group directories are collected")
	fs.DurationVar(&o.gcGrace, "gc-grace", 5*time.Minute, "how long an unassigned slot link or unreferenced group directory is kept")
	fs.DurationVar(&o.gcKubeletSettle, "gc-kubelet-settle", deviceplugin.DefaultKubeletSettle, "how long collection waits after a kubelet (re)starts watching the plugin, while the kubelet re-admits running pods")
	fs.DurationVar(&o.rediscoverInterval, "rediscover-interval", 30*time.Second, "how often rails and port states are re-read")
	fs.DurationVar(&o.podLookupTimeout, "pod-lookup-timeout", 5*time.Second, "how long PreStartContainer waits for PodResources to show the devices")
	o.rail.Bind(fs)
}

func (o *options) validate() error {
	for name, d := range map[string]time.Duration{"gc-interval": o.gcInterval, "gc-grace": o.gcGrace, "gc-kubelet-settle": o.gcKubeletSettle,
		"rediscover-interval": o.rediscoverInterval, "pod-lookup-timeout": o.podLookupTimeout} {
		if d <= 0 {
			return fmt.Errorf("--%s=%v: must be positive", name, d)
		}
	}
	return nil
}

// envPrefix is the prefix of the plugin's environment variables.
const envPrefix = "PXN_DEVICE_PLUGIN"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// execute runs the command line args: exit 0, 1 when the plugin failed, 2 on
// bad usage.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Execute(newRootCommand(ctx, stdout, stderr), args, stderr)
}

func newRootCommand(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	var o options
	root := &cobra.Command{
		Use:   "pxn-device-plugin",
		Short: "Kubelet device plugin for PXN's relay resource",
		Long: `pxn-device-plugin advertises PXN's relay resource (pxn.io/relay) to the kubelet.
Every container that requests it gets the engine's environment (MC_PXN_*) and
its job's registry folder. It runs until it is stopped (SIGTERM).`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			defer klog.Flush()
			if err := o.run(ctx); err != nil {
				klog.ErrorS(err, "pxn-device-plugin failed")
				return cli.ExitError{Code: 1}
			}
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	o.bind(root.Flags())
	cli.DeprecatedAlias(root.Flags(), "metrics-addr", "metrics-bind-address", stderr)
	cli.Setup(root, envPrefix, nil)
	return root
}

func (o *options) run(ctx context.Context) error {
	klog.InfoS("Starting pxn-device-plugin", "version", version.String(), "revision", version.Revision(), "goVersion", runtime.Version())
	reg := daemon.ProcessRegistry()
	metrics := deviceplugin.NewMetrics(reg)

	log := klog.Background()
	discoverer, err := o.rail.Discoverer(log)
	if err != nil {
		return err
	}
	monitor := nodestate.NewMonitor(discoverer, o.rediscoverInterval, func(st nodestate.NodeState) {
		metrics.SetDeviceHealth(o.devices, st.Healthy)
	}, log)

	store := deviceplugin.NewStore(o.stateDir, o.shmDir, log)
	if err := store.Prepare(); err != nil {
		return err
	}
	pods, err := podresources.New(o.podResourcesSocket)
	if err != nil {
		return err
	}
	defer pods.Close()
	api, err := apiPods(o.kubeconfig)
	if err != nil {
		return err
	}
	resource, err := deviceplugin.NewGroupResource(deviceplugin.Config{
		ResourceName:     o.resourceName,
		DeviceCount:      o.devices,
		GroupID:          o.groupID,
		RegistryRoot:     o.registryRoot,
		PodLookupTimeout: o.podLookupTimeout,
		APITimeout:       5 * time.Second,
		Logger:           log,
	}, monitor, store, pods, api, metrics)
	if err != nil {
		return err
	}
	server := deviceplugin.NewServer(deviceplugin.ServerConfig{ResourceName: o.resourceName, PluginDir: o.devicePluginDir, Logger: log}, resource, metrics)

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// The server may fail while ctx lives: stop the endpoints, the monitor
	// and the collector before waiting for them.
	defer func() {
		cancel()
		wg.Wait()
	}()
	if daemon.Serves(o.metricsAddr) {
		if err := daemon.ServeMetrics(ctx, &wg, o.metricsAddr, reg); err != nil {
			return err
		}
	}
	if daemon.Serves(o.healthAddr) {
		if err := daemon.ServeHTTP(ctx, &wg, "health probes", o.healthAddr, daemon.Probes(server.Registered)); err != nil {
			return err
		}
	}
	wg.Go(func() { monitor.Run(ctx) })
	wg.Go(func() { resource.RunGarbageCollector(ctx, o.gcInterval, o.gcGrace, o.gcKubeletSettle) })
	klog.InfoS("Serving the device plugin", "resource", o.resourceName, "devices", o.devices,
		"socket", server.SocketPath(), "stateDir", o.stateDir, "shmDir", o.shmDir, "apiAccess", api != nil)
	return server.Run(ctx)
}

// apiPods returns a pod reader for the API server, or nil without API access:
// no --kubeconfig and not running in a pod.
func apiPods(kubeconfig string) (deviceplugin.PodGetter, error) {
	cfg, err := daemon.RESTConfig(kubeconfig, "pxn-device-plugin")
	if errors.Is(err, daemon.ErrNoAPIServer) {
		klog.InfoS("No API server access; groups are keyed by pod name", "reason", err.Error())
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	return deviceplugin.NewClientPodGetter(client), nil
}
