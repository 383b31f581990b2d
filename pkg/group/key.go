// SPDX-License-Identifier: Apache-2.0

package group

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// Label is the pod label that puts pods of one job into one group where
// nothing else says which pods are one job: the device plugin's pods, and
// the pods the DRA driver gets through an extended resource request.
const Label = "pxn.io/group"

// Sources of a group key's identity.
const (
	SourceLabel   = "label"    // a pod's group label value
	SourceUID     = "uid"      // a pod's UID (device plugin)
	SourcePodName = "pod-name" // a pod's name, when the API server is not reachable (device plugin)
	SourceClaim   = "claim"    // a ResourceClaim's UID (DRA driver)
)

// Key names the host folder shared by the members of one group: the first
// 16 hex digits of the SHA-256 of the length-prefixed namespace, source and
// identity, so no two distinct triples share an encoding.
func Key(namespace, source, identity string) string {
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
