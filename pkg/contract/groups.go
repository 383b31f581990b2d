// SPDX-License-Identifier: Apache-2.0

package contract

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// ReadSlots returns the group key each slot link under stateDir points at,
// by device ID. It only reads. Links that do not point at a group folder
// (a runtime's empty folder, a temporary link) are left out.
func ReadSlots(stateDir string) (map[string]string, error) {
	dir := SlotsDir(stateDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read slots %s: %w", dir, err)
	}
	slots := make(map[string]string, len(entries))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if key := filepath.Base(target); IsGroupKey(key) {
			slots[e.Name()] = key
		}
	}
	return slots, nil
}
