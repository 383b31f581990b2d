// SPDX-License-Identifier: Apache-2.0

package group

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pxn-project/pxn/pkg/contract"
)

// Owner says who holds a group folder: the pods of one namespace whose
// containers mount it and, for the DRA driver, the ResourceClaim that put
// them there. A node plugin writes one owner record per thing it hands the
// folder out for (a device plugin slot, a prepared claim) in the owners
// folder beside the group folders (contract.OwnersDir); the node agent
// reads them to name the pods behind each group's ranks.
type Owner struct {
	Namespace string `json:"namespace"`
	// Pods are pod names in Namespace.
	Pods []string `json:"pods"`
	// Claim is the ResourceClaim's name; empty for the device plugin.
	Claim string `json:"claim,omitempty"`
}

// OwnerRecordVersion is the owner record's format; a record of another
// version is refused rather than misread.
const OwnerRecordVersion = 1

// Bounds of an owner record: a claim is reserved for at most 256 pods, and
// a pod name is at most 253 bytes.
const (
	MaxOwnerPods   = 256
	maxOwnerRecord = 128 << 10
)

type ownerRecord struct {
	Version int `json:"version"`
	Owner
}

// Owner ID prefixes: one record per device plugin slot, one per DRA claim.
const (
	OwnerSlotPrefix  = "slot-"
	OwnerClaimPrefix = "claim-"
)

// maxOwnerID bounds an owner ID: a prefix and a device ID or a UID.
const maxOwnerID = 128

// Validate reports the first value of o that a Kubernetes object could not
// carry.
func (o Owner) Validate() error {
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %s: %s", contract.Quote(o.Namespace), strings.Join(errs, "; "))
	}
	if len(o.Pods) > MaxOwnerPods {
		return fmt.Errorf("%d pods, at most %d", len(o.Pods), MaxOwnerPods)
	}
	for _, p := range o.Pods {
		if errs := validation.IsDNS1123Subdomain(p); len(errs) > 0 {
			return fmt.Errorf("pod %s: %s", contract.Quote(p), strings.Join(errs, "; "))
		}
	}
	if o.Claim != "" {
		if errs := validation.IsDNS1123Subdomain(o.Claim); len(errs) > 0 {
			return fmt.Errorf("claim %s: %s", contract.Quote(o.Claim), strings.Join(errs, "; "))
		}
	}
	return nil
}

// EncodeOwner returns o's record.
func EncodeOwner(o Owner) ([]byte, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("owner record: %w", err)
	}
	if o.Pods == nil {
		o.Pods = []string{}
	}
	return json.Marshal(ownerRecord{Version: OwnerRecordVersion, Owner: o})
}

// DecodeOwner parses an owner record. The bytes are untrusted: unknown
// fields, another version, trailing data and names that are not
// Kubernetes names are refused, each error naming the value.
func DecodeOwner(data []byte) (Owner, error) {
	if len(data) > maxOwnerRecord {
		return Owner{}, fmt.Errorf("owner record of %d bytes, at most %d", len(data), maxOwnerRecord)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var r ownerRecord
	if err := dec.Decode(&r); err != nil {
		return Owner{}, fmt.Errorf("decode owner record: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Owner{}, errors.New("decode owner record: data after the record")
	}
	if r.Version != OwnerRecordVersion {
		return Owner{}, fmt.Errorf("owner record version %d, want %d", r.Version, OwnerRecordVersion)
	}
	if err := r.Owner.Validate(); err != nil {
		return Owner{}, fmt.Errorf("owner record: %w", err)
	}
	return r.Owner, nil
}

// OwnerRecordName is the file name of the record of owner id for the group
// folder key: <key>.<id>.json.
func OwnerRecordName(key, id string) string { return key + "." + id + ".json" }

// ParseOwnerRecordName splits a file name of the owners folder into its
// group key and owner ID; ok is false for a name that is not a record's
// (a temporary file, anything else).
func ParseOwnerRecordName(name string) (key, id string, ok bool) {
	rest, found := strings.CutSuffix(name, ".json")
	if !found || len(rest) < contract.GroupKeyLen+2 || rest[contract.GroupKeyLen] != '.' {
		return "", "", false
	}
	key, id = rest[:contract.GroupKeyLen], rest[contract.GroupKeyLen+1:]
	if !contract.IsGroupKey(key) || checkOwnerID(id) != nil {
		return "", "", false
	}
	return key, id, true
}

// checkOwnerID: letters, digits, '-' and '_', at most maxOwnerID bytes.
func checkOwnerID(id string) error {
	if id == "" || len(id) > maxOwnerID {
		return fmt.Errorf("owner ID %s: want 1 to %d bytes", contract.Quote(id), maxOwnerID)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' {
			return fmt.Errorf("owner ID %s: byte %q is not a letter, digit, '-' or '_'", contract.Quote(id), c)
		}
	}
	return nil
}

// WriteOwner replaces the record of owner id for group key in the owners
// folder dir: a reader sees the old record or the new one, never part of
// one.
func WriteOwner(dir, key, id string, o Owner) error {
	if !contract.IsGroupKey(key) {
		return fmt.Errorf("owner record: invalid group key %s", contract.Quote(key))
	}
	if err := checkOwnerID(id); err != nil {
		return err
	}
	data, err := EncodeOwner(o)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, OwnerRecordName(key, id))
	tmp, err := os.CreateTemp(dir, "."+OwnerRecordName(key, id)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write owner record %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write owner record %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write owner record %s: %w", path, err)
	}
	return nil
}

// RemoveOwner removes the record of owner id for group key; none is no
// error.
func RemoveOwner(dir, key, id string) error {
	path := filepath.Join(dir, OwnerRecordName(key, id))
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove owner record %s: %w", path, err)
	}
	return nil
}

// ReadOwner reads and decodes the owner record at path: a regular file,
// never followed through a link, read up to the record's bound.
func ReadOwner(path string) (Owner, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return Owner{}, fmt.Errorf("read owner record %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Owner{}, fmt.Errorf("read owner record %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return Owner{}, fmt.Errorf("owner record %s is not a regular file (mode %v)", path, fi.Mode())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxOwnerRecord+1))
	if err != nil {
		return Owner{}, fmt.Errorf("read owner record %s: %w", path, err)
	}
	o, err := DecodeOwner(data)
	if err != nil {
		return Owner{}, fmt.Errorf("%s: %w", path, err)
	}
	return o, nil
}

// ListOwners returns the file names of the owner records in dir by group
// key, each key's in name order. A missing folder holds none.
func ListOwners(dir string) (map[string][]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read owners folder %s: %w", dir, err)
	}
	out := map[string][]string{}
	for _, e := range entries {
		if key, _, ok := ParseOwnerRecordName(e.Name()); ok {
			out[key] = append(out[key], e.Name())
		}
	}
	return out, nil
}
