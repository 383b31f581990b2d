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
	endpoints          daemon.Endpoints
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
	o.endpoints.Bind(fs, ":9641", ":9643")
	fs.DurationVar(&o.gcInterval, "gc-interval", 30*time.Second, "how often unused slot links and group directories are collected")
	fs.DurationVar(&o.gcGrace, "gc-grace", 5*time.Minute, "how long an unassigned slot link or unreferenced group directory is kept")
	fs.DurationVar(&o.gcKubeletSettle, "gc-kubelet-settle", deviceplugin.DefaultKubeletSettle, "how long collection waits after a kubelet (re)starts watching the plugin, while the kubelet re-admits running pods")
	fs.DurationVar(&o.rediscoverInterval, "rediscover-interval", 30*time.Second, "how often rails and port states are re-read")
	fs.DurationVar(&o.podLookupTimeout, "pod-lookup-timeout", 5*time.Second, "how long PreStartContainer waits for PodResources to show the devices")
	o.rail.Bind(fs)
}

// validate checks every flag; the error names the flag.
func (o *options) validate() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"gc-interval", o.gcInterval}, {"gc-grace", o.gcGrace}, {"gc-kubelet-settle", o.gcKubeletSettle},
		{"rediscover-interval", o.rediscoverInterval}, {"pod-lookup-timeout", o.podLookupTimeout}} {
		if d.v <= 0 {
			return cli.FlagError(d.flag, d.v, errors.New("must be positive"))
		}
	}
	if err := deviceplugin.ValidateResourceName(o.resourceName); err != nil {
		return cli.FlagError("resource-name", o.resourceName, err)
	}
	if o.devices < 1 || o.devices > deviceplugin.MaxDevices {
		return cli.FlagError("devices", o.devices, fmt.Errorf("want 1..%d", deviceplugin.MaxDevices))
	}
	if err := contract.ValidateGroupID(o.groupID); err != nil {
		return cli.FlagError("group-id", contract.Quote(o.groupID), err)
	}
	if err := contract.ValidateRegistryRoot(o.registryRoot); err != nil {
		return cli.FlagError("container-registry-root", contract.Quote(o.registryRoot), err)
	}
	return o.rail.Validate()
}

// envPrefix is the prefix of the plugin's environment variables.
const envPrefix = "PXN_DEVICE_PLUGIN"

func main() { daemon.Main(execute) }

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
		RunE: daemon.RunE(ctx, "pxn-device-plugin", o.validate, o.run),
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	o.bind(root.Flags())
	cli.Setup(root, envPrefix, nil)
	return root
}

func (o *options) run(ctx context.Context) error {
	reg := daemon.ProcessRegistry()
	metrics := deviceplugin.NewMetrics(reg)

	log := klog.Background()
	monitor := nodestate.NewMonitor(o.rail.Discoverer(), nodestate.Options{
		Interval: o.rediscoverInterval,
		Observe:  func(st nodestate.NodeState) { metrics.SetDeviceHealth(o.devices, st.Healthy) },
		Logger:   log,
	})

	store := deviceplugin.NewStore(o.stateDir, o.shmDir, log)
	if err := store.Prepare(); err != nil {
		return err
	}
	pods, err := podresources.New(o.podResourcesSocket)
	if err != nil {
		return err
	}
	defer pods.Close()
	api, apiConfig, err := apiPods(o.kubeconfig)
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
	if err := o.endpoints.Serve(ctx, &wg, reg, server.Registered, apiConfig); err != nil {
		return err
	}
	wg.Go(func() { monitor.Run(ctx) })
	wg.Go(func() { resource.RunGarbageCollector(ctx, o.gcInterval, o.gcGrace, o.gcKubeletSettle) })
	klog.InfoS("Serving the device plugin", "resource", o.resourceName, "devices", o.devices,
		"socket", server.SocketPath(), "stateDir", o.stateDir, "shmDir", o.shmDir, "apiAccess", api != nil)
	return server.Run(ctx)
}

// apiPods returns a pod reader for the API server, or nil without API access:
// no --kubeconfig and not running in a pod.
func apiPods(kubeconfig string) (deviceplugin.PodGetter, *rest.Config, error) {
	cfg, err := daemon.RESTConfig(kubeconfig, "pxn-device-plugin")
	if errors.Is(err, daemon.ErrNoAPIServer) {
		klog.InfoS("No API server access; groups are keyed by pod name", "reason", err.Error())
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("API client: %w", err)
	}
	return deviceplugin.NewClientPodGetter(client), cfg, nil
}
