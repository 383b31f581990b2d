// SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// A Base is the image a new layer goes over: its layers as its archive holds
// them and its configuration, which the new image extends.
type Base struct {
	Layers []descriptor
	Config imageConfig
	blobs  map[string][]byte // a layer's content by its digest
}

// ReadBase reads a one-image OCI archive (what -format oci writes, or
// skopeo's oci-archive), checking every layer against its digest.
func ReadBase(p string) (*Base, error) {
	files, err := readArchive(p)
	if err != nil {
		return nil, err
	}
	d, _, err := singleManifest(files)
	if err != nil {
		return nil, fmt.Errorf("base %s: %w", p, err)
	}
	mb, err := blobOf(files, d.Digest)
	if err != nil {
		return nil, fmt.Errorf("base %s: %w", p, err)
	}
	var m manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		return nil, fmt.Errorf("base %s: manifest: %w", p, err)
	}
	cb, err := blobOf(files, m.Config.Digest)
	if err != nil {
		return nil, fmt.Errorf("base %s: %w", p, err)
	}
	b := &Base{Layers: m.Layers, blobs: map[string][]byte{}}
	if err := json.Unmarshal(cb, &b.Config); err != nil {
		return nil, fmt.Errorf("base %s: config: %w", p, err)
	}
	if len(m.Layers) != len(b.Config.RootFS.DiffIDs) {
		return nil, fmt.Errorf("base %s: %d layers but %d diff_ids in its config", p, len(m.Layers), len(b.Config.RootFS.DiffIDs))
	}
	for _, l := range m.Layers {
		data, err := blobOf(files, l.Digest)
		if err != nil {
			return nil, fmt.Errorf("base %s: layer: %w", p, err)
		}
		sum := sha256.Sum256(data)
		if got := "sha256:" + hex.EncodeToString(sum[:]); got != l.Digest || int64(len(data)) != l.Size {
			return nil, fmt.Errorf("base %s: layer %s holds %d bytes of digest %s", p, l.Digest, len(data), got)
		}
		b.blobs[l.Digest] = data
	}
	return b, nil
}

// runConfig is the base's run configuration with what spec sets on top:
// spec's environment replaces a variable of the same name, and each other
// field replaces the base's when spec gives it.
func (b *Base) runConfig(spec Spec) runConfig {
	rc := b.Config.Config
	for _, kv := range spec.Env {
		rc.Env = setEnv(rc.Env, kv)
	}
	if len(spec.Entrypoint) > 0 {
		rc.Entrypoint = spec.Entrypoint
	}
	if len(spec.Cmd) > 0 {
		rc.Cmd = spec.Cmd
	}
	if spec.User != "" {
		rc.User = spec.User
	}
	if spec.WorkingDir != "" {
		rc.WorkingDir = spec.WorkingDir
	}
	for k, v := range spec.Labels {
		if rc.Labels == nil {
			rc.Labels = map[string]string{}
		}
		rc.Labels[k] = v
	}
	return rc
}

func setEnv(env []string, kv string) []string {
	key, _, _ := strings.Cut(kv, "=")
	out := make([]string, 0, len(env)+1)
	for _, e := range env {
		if k, _, _ := strings.Cut(e, "="); k != key {
			out = append(out, e)
		}
	}
	return append(out, kv)
}
