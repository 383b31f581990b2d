// SPDX-License-Identifier: Apache-2.0

package group

import (
	"fmt"

	"github.com/pxn-project/pxn/pkg/contract"
)

// Member is what every member container gets beside its group folder.
type Member struct {
	// GroupID is contract.EnvGroupID.
	GroupID string
	// RegistryRoot is the container path of the group folder mount and
	// contract.EnvRegistryRoot.
	RegistryRoot string
}

// Validate reports the first invalid field.
func (m Member) Validate() error {
	if err := contract.ValidateGroupID(m.GroupID); err != nil {
		return fmt.Errorf("group id %s: %w", contract.Quote(m.GroupID), err)
	}
	if err := contract.ValidateRegistryRoot(m.RegistryRoot); err != nil {
		return fmt.Errorf("container registry root %s: %w", contract.Quote(m.RegistryRoot), err)
	}
	return nil
}

// Env is a member container's environment on a node whose rail map (the
// value of contract.EnvRailMap) is railMap.
func (m Member) Env(railMap string) map[string]string {
	return map[string]string{
		contract.EnvEnable:       contract.EnableOn,
		contract.EnvRailMap:      railMap,
		contract.EnvGroupID:      m.GroupID,
		contract.EnvRegistryRoot: m.RegistryRoot,
	}
}

// Mount is a bind mount of a host folder into a member container.
type Mount struct {
	HostPath      string
	ContainerPath string
	ReadOnly      bool
}

// Mount is the member container's mount of hostPath, its group folder or a
// link to it, at the registry root.
func (m Member) Mount(hostPath string) Mount {
	return Mount{HostPath: hostPath, ContainerPath: m.RegistryRoot}
}
