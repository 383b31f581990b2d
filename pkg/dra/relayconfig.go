// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	kjson "sigs.k8s.io/json"
)

// RelayConfig is the only opaque configuration the driver accepts, from a
// DeviceClass or a claim. It has no settings yet: the environment and folder
// of a group are the node's, and a claim's members share them. Anything but
// its header is refused, so a setting a later version adds is never silently
// ignored by this one.
type RelayConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// RelayConfig's header.
const (
	ConfigAPIVersion = "pxn.io/v1alpha1"
	ConfigKind       = "RelayConfig"
)

// decodeRelayConfig decodes raw strictly, as the API server decodes
// objects: one JSON object, field names matched case-sensitively, no field
// twice, no field but the header, the header RelayConfig's.
func decodeRelayConfig(raw []byte) (RelayConfig, error) {
	var c RelayConfig
	strict, err := kjson.UnmarshalStrict(raw, &c)
	if err != nil {
		return RelayConfig{}, err
	}
	if err := errors.Join(strict...); err != nil {
		return RelayConfig{}, err
	}
	if c.APIVersion != ConfigAPIVersion || c.Kind != ConfigKind {
		return RelayConfig{}, fmt.Errorf("apiVersion %q kind %q, want %s %s", c.APIVersion, c.Kind, ConfigAPIVersion, ConfigKind)
	}
	return c, nil
}

// checkConfigs decodes every opaque configuration for the driver in an
// allocation.
func checkConfigs(configs []resourceapi.DeviceAllocationConfiguration) error {
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != DriverName {
			continue
		}
		if _, err := decodeRelayConfig(c.Opaque.Parameters.Raw); err != nil {
			return fmt.Errorf("opaque config %d for driver %s (from %s, requests %v): %w", i, DriverName, c.Source, c.Requests, err)
		}
	}
	return nil
}
