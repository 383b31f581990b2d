// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/pxn-project/pxn/pkg/contract"
)

// CheckpointFile is the name of the checkpoint in the state folder.
const CheckpointFile = "dra-checkpoint.json"

// checkpointVersion is the checkpoint's format; a file of another version
// is refused rather than misread.
const checkpointVersion = 1

// checkpoint is the prepared claims, by UID: everything Unprepare needs
// after a restart, and what a repeated Prepare answers.
type checkpoint struct {
	Version int                         `json:"version"`
	Claims  map[types.UID]preparedClaim `json:"claims"`
}

type preparedClaim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Group is the claim's group key; empty for an admin-access claim.
	Group   string           `json:"group,omitempty"`
	Edits   edits            `json:"edits"`
	Devices []preparedDevice `json:"devices"`
}

type preparedDevice struct {
	Requests []string   `json:"requests"`
	Pool     string     `json:"pool"`
	Device   string     `json:"device"`
	ShareID  *types.UID `json:"shareID,omitempty"`
}

func (c preparedClaim) result(uid types.UID) []kubeletplugin.Device {
	devs := make([]kubeletplugin.Device, len(c.Devices))
	for i, d := range c.Devices {
		devs[i] = kubeletplugin.Device{
			Requests:     d.Requests,
			PoolName:     d.Pool,
			DeviceName:   d.Device,
			CDIDeviceIDs: []string{cdiDeviceID(uid)},
			ShareID:      d.ShareID,
		}
	}
	return devs
}

func checkpointPath(stateDir string) string { return filepath.Join(stateDir, CheckpointFile) }

// loadCheckpoint reads the checkpoint; none yet is an empty one.
func loadCheckpoint(stateDir string) (map[types.UID]preparedClaim, error) {
	path := checkpointPath(stateDir)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[types.UID]preparedClaim{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint %s: %w", path, err)
	}
	var cp checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("decode checkpoint %s: %w", path, err)
	}
	if cp.Version != checkpointVersion {
		return nil, fmt.Errorf("checkpoint %s has version %d, want %d", path, cp.Version, checkpointVersion)
	}
	if cp.Claims == nil {
		cp.Claims = map[types.UID]preparedClaim{}
	}
	// What Unprepare removes is named by these: a checkpoint that names
	// anything outside the driver's folders is refused, not acted on.
	for uid, pc := range cp.Claims {
		if err := checkClaimUID(uid); err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", path, err)
		}
		if pc.Group != "" && !contract.IsGroupKey(pc.Group) {
			return nil, fmt.Errorf("checkpoint %s: claim %s names group %q, not a group key", path, uid, pc.Group)
		}
	}
	return cp.Claims, nil
}

func saveCheckpoint(stateDir string, claims map[types.UID]preparedClaim) error {
	data, err := json.Marshal(checkpoint{Version: checkpointVersion, Claims: claims})
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	return writeFileAtomic(checkpointPath(stateDir), data, 0o600)
}
