// SPDX-License-Identifier: Apache-2.0

package contract

import (
	"path/filepath"
)

// The node plugins' group-folder layout, which the node agent's rank
// metrics read: a job's group folder, <shm-dir>/groups/<key>, which a
// container sees as its EnvRegistryRoot, and beside it the owner records
// of the folder, <shm-dir>/owners/<key>.<owner-id>.json, that name the
// pods holding it (pkg/group encodes them). The device plugin also keeps
// one slot link per device, <state-dir>/slots/<device-id>, pointing at its
// job's group folder.

// GroupKeyLen is the length of a group key: lower-case hex digits.
const GroupKeyLen = 16

// SlotsDir is the folder of the slot links under the state folder.
func SlotsDir(stateDir string) string { return filepath.Join(stateDir, "slots") }

// GroupsDir is the folder of the group folders under the shm folder.
func GroupsDir(shmDir string) string { return filepath.Join(shmDir, "groups") }

// OwnersDir is the folder of the group folders' owner records under the
// shm folder.
func OwnersDir(shmDir string) string { return filepath.Join(shmDir, "owners") }

// IsGroupKey reports whether name can be a group folder's name:
// GroupKeyLen lower-case hex digits.
func IsGroupKey(name string) bool {
	if len(name) != GroupKeyLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
