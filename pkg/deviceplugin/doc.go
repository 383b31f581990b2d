// SPDX-License-Identifier: Apache-2.0

// Package deviceplugin is the kubelet device plugin for PXN's relay resource:
// a GroupResource (environment, registry mount, group directories and their
// garbage collection) served by a Server that keeps a v1beta1 DevicePlugin
// socket registered with the kubelet.
package deviceplugin
