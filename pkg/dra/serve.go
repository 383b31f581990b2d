// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// Kubelet folders, the kubelet's defaults.
const (
	DefaultKubeletPluginsDir  = kubeletplugin.KubeletPluginsDir
	DefaultKubeletRegistryDir = kubeletplugin.KubeletRegistryDir
)

// ServeOptions says where the kubelet looks for the driver.
type ServeOptions struct {
	// PluginsDir is the kubelet's plugins folder; the DRA socket is
	// <PluginsDir>/pxn.io/dra.sock.
	PluginsDir string
	// RegistryDir is the kubelet's plugin registration folder; the
	// registration socket is <RegistryDir>/pxn.io-reg.sock.
	RegistryDir string
}

// Serve registers the driver with the kubelet, serves its DRA and health
// services, and publishes the node's ResourceSlice once the rails are
// discovered and again whenever the device's attributes change, until ctx
// ends or the helper reports a fatal error (returned).
func (d *Driver) Serve(ctx context.Context, client kubernetes.Interface, opts ServeOptions) error {
	dataDir := filepath.Join(opts.PluginsDir, DriverName)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return fmt.Errorf("create plugin folder %s: %w", dataDir, err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	d.fatal = cancel
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(d.cfg.NodeName),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistryDir),
	)
	if err != nil {
		return fmt.Errorf("start kubelet plugin %s: %w", DriverName, err)
	}
	defer helper.Stop()
	d.helper.Store(helper)
	defer d.helper.Store(nil)
	d.cfg.Logger.Info("Serving the DRA driver", "driver", DriverName, "node", d.cfg.NodeName,
		"pluginsDir", opts.PluginsDir, "registryDir", opts.RegistryDir, "prepared", len(d.Prepared()))

	var published []resourceapi.Device
	for {
		st, changed := d.state.State()
		if st.Discovered {
			devs := d.devices(st, !d.taintsDropped.Load())
			if published == nil || !equality.Semantic.DeepEqual(devs, published) {
				if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
					d.cfg.NodeName: {Slices: []resourceslice.Slice{{Devices: devs}}},
				}}); err != nil {
					if ctx.Err() != nil {
						return stopped(ctx)
					}
					return fmt.Errorf("publish resources of node %s: %w", d.cfg.NodeName, err)
				}
				published = devs
				d.cfg.Logger.Info("Published the relay device", "node", d.cfg.NodeName, "railsReady", *devs[0].Attributes[AttrRailsReady].BoolValue,
					"rails", st.Summary.Rails, "railDevices", len(devs)-1, "taints", !d.taintsDropped.Load())
			}
		}
		select {
		case <-ctx.Done():
			return stopped(ctx)
		case <-changed:
		case <-d.republish:
		}
	}
}

// stopped is Serve's answer once ctx ended: nil when it was canceled, the
// fatal error HandleError stopped it with otherwise.
func stopped(ctx context.Context) error {
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// Registered reports whether the kubelet accepted the driver's registration.
func (d *Driver) Registered() bool {
	h := d.helper.Load()
	if h == nil {
		return false
	}
	s := h.RegistrationStatus()
	return s != nil && s.PluginRegistered
}
