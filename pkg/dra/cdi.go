// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/pxn-project/pxn/pkg/group"
)

// CDIKind is the kind of the CDI devices the driver writes: one per
// prepared claim, named by the claim's UID, so no name is ever reused.
const CDIKind = DriverName + "/relay"

// cdiDeviceID is the qualified CDI name of a claim's device.
func cdiDeviceID(uid types.UID) string { return CDIKind + "=" + string(uid) }

// maxClaimUID bounds a claim UID: the API server's are 36-byte UUIDs.
const maxClaimUID = 128

// checkClaimUID refuses a UID that cannot name a CDI device and a file in
// the CDI and owners folders: anything but 1 to maxClaimUID letters,
// digits, '-', '_' and '.', starting with a letter or digit.
func checkClaimUID(uid types.UID) error {
	ok := len(uid) > 0 && len(uid) <= maxClaimUID
	for i := 0; ok && i < len(uid); i++ {
		c := uid[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		ok = alnum || i > 0 && (c == '-' || c == '_' || c == '.')
	}
	if !ok {
		return fmt.Errorf("claim UID %q: want 1 to %d letters, digits, '-', '_' or '.', starting with a letter or digit", uid, maxClaimUID)
	}
	return nil
}

// cdiSpecPath is the file of a claim's CDI spec in cdiDir.
func cdiSpecPath(cdiDir string, uid types.UID) string {
	return filepath.Join(cdiDir, DriverName+"-relay_"+string(uid)+".json")
}

// edits is what a prepared claim's containers get.
type edits struct {
	Env   map[string]string `json:"env,omitempty"`
	Mount group.Mount       `json:"mount"`
}

// cdiSpec is the CDI spec of one claim: one device, named by the claim's
// UID, whose edits are the claim's environment and mount. Its version is
// the least the CDI library says its content needs, so older runtimes read
// it too.
func cdiSpec(uid types.UID, e edits) (*cdispec.Spec, error) {
	env := make([]string, 0, len(e.Env))
	for k, v := range e.Env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	access := "rw"
	if e.Mount.ReadOnly {
		access = "ro"
	}
	spec := &cdispec.Spec{
		Kind: CDIKind,
		Devices: []cdispec.Device{{
			Name: string(uid),
			ContainerEdits: cdispec.ContainerEdits{
				Env: env,
				Mounts: []*cdispec.Mount{{
					HostPath:      e.Mount.HostPath,
					ContainerPath: e.Mount.ContainerPath,
					Type:          "bind",
					Options:       []string{"rbind", "rprivate", access},
				}},
			},
		}},
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI version of claim %s's spec: %w", uid, err)
	}
	spec.Version = v
	return spec, nil
}

// writeCDISpec writes a claim's CDI spec atomically: a runtime reading the
// folder never sees half a spec.
func writeCDISpec(cdiDir string, uid types.UID, e edits) error {
	spec, err := cdiSpec(uid, e)
	if err != nil {
		return err
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encode CDI spec of claim %s: %w", uid, err)
	}
	return writeFileAtomic(cdiSpecPath(cdiDir, uid), data, 0o644)
}

// removeCDISpec removes a claim's CDI spec; a missing one is no error.
func removeCDISpec(cdiDir string, uid types.UID) error {
	if err := os.Remove(cdiSpecPath(cdiDir, uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove CDI spec of claim %s: %w", uid, err)
	}
	return nil
}
