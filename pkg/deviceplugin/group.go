// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// GroupLabel is the pod label that puts pods of one job into one group.
const GroupLabel = "pxn.io/group"

// Sources of a group key's identity.
const (
	SourceLabel   = "label"    // the pod's GroupLabel value
	SourceUID     = "uid"      // the pod's UID
	SourcePodName = "pod-name" // the pod's name, when the API server is not reachable
)

// GroupKey names the host directory shared by the ranks of one group: the
// first 16 hex digits of the SHA-256 of the length-prefixed namespace, source
// and identity, so no two distinct triples share an encoding.
func GroupKey(namespace, source, identity string) string {
	h := sha256.New()
	var n [8]byte
	for _, f := range [...]string{namespace, source, identity} {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}
