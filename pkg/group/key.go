// SPDX-License-Identifier: Apache-2.0

package group

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"syscall"
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

// SecretFile is the name of a node plugin's key secret in its state folder.
const SecretFile = "group-key-secret"

// SecretLen is the length of a key secret in bytes.
const SecretLen = 32

// Keyer names group folders with a node-local secret, so that nobody who
// lacks it can compute a group's folder name from the namespace and label
// a pod shows to everyone.
type Keyer struct {
	secret [SecretLen]byte
}

// LoadKeyer reads the key secret in stateDir, creating it when missing. The
// secret is a regular file of SecretLen bytes, mode 0600, owned by this
// process's user, never followed through a link; keys are stable as long
// as it lives, so it is kept across restarts and two processes that start
// together agree on one secret.
func LoadKeyer(stateDir string) (*Keyer, error) {
	path := filepath.Join(stateDir, SecretFile)
	k, err := readSecret(path)
	if !errors.Is(err, os.ErrNotExist) {
		return k, err
	}
	if err := createSecret(stateDir, path); err != nil {
		return nil, err
	}
	return readSecret(path)
}

func readSecret(path string) (*Keyer, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open group key secret %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat group key secret %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("group key secret %s is not a regular file (mode %v)", path, fi.Mode())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("group key secret %s is owned by uid %d, not %d", path, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o600 {
		return nil, fmt.Errorf("group key secret %s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	k := &Keyer{}
	n, err := io.ReadFull(f, k.secret[:])
	if err != nil {
		return nil, fmt.Errorf("group key secret %s holds %d bytes, want %d: %w", path, n, SecretLen, err)
	}
	if extra, _ := f.Read(make([]byte, 1)); extra > 0 {
		return nil, fmt.Errorf("group key secret %s holds more than %d bytes", path, SecretLen)
	}
	return k, nil
}

// createSecret writes a fresh secret beside path and links it there; a
// secret another process linked first is kept.
func createSecret(dir, path string) error {
	var secret [SecretLen]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return fmt.Errorf("group key secret: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+SecretFile+".*.tmp")
	if err != nil {
		return fmt.Errorf("create group key secret in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	err = tmp.Chmod(0o600)
	if err == nil {
		_, err = tmp.Write(secret[:])
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write group key secret %s: %w", tmp.Name(), err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create group key secret %s: %w", path, err)
	}
	return nil
}

// Key names the host folder shared by the members of one group: the first
// 16 hex digits of the HMAC-SHA-256, under the node's secret, of the
// length-prefixed namespace, source and identity, so no two distinct
// triples share an encoding.
func (k *Keyer) Key(namespace, source, identity string) string {
	return digest(hmac.New(sha256.New, k.secret[:]), namespace, source, identity)
}

// UnkeyedKey is the name group folders had before keys took a secret: the
// same digest with plain SHA-256. It only finds folders made then.
func UnkeyedKey(namespace, source, identity string) string {
	return digest(sha256.New(), namespace, source, identity)
}

func digest(h hash.Hash, namespace, source, identity string) string {
	var n [8]byte
	for _, f := range [...]string{namespace, source, identity} {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}

// FolderKey is the key of the group folder of (namespace, source, identity)
// in groupsDir: Key, unless only a folder under UnkeyedKey exists there,
// made before an upgrade for a group whose members still use it.
func (k *Keyer) FolderKey(groupsDir, namespace, source, identity string) (string, error) {
	key := k.Key(namespace, source, identity)
	if found, err := isDir(filepath.Join(groupsDir, key)); found || err != nil {
		return key, err
	}
	old := UnkeyedKey(namespace, source, identity)
	found, err := isDir(filepath.Join(groupsDir, old))
	if found {
		return old, nil
	}
	return key, err
}

// isDir reports whether path is a directory, not following a link.
func isDir(path string) (bool, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("look up group folder %s: %w", path, err)
	}
	return fi.IsDir(), nil
}
