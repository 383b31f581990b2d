// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/group"
)

// Store owns the slot links (<state-dir>/slots/<device-id>), the group
// directories (<shm-dir>/groups/<key>) they point to, one owner record per
// slot link (group.OwnerSlotPrefix) naming the pod that holds the device,
// and the secret group keys are made with (<state-dir>/group.SecretFile).
// GroupKey, Link and Collect are serialized so a folder found or linked
// while a collection runs is never removed by it.
type Store struct {
	stateDir  string
	shmDir    string
	slotsDir  string
	groupsDir string
	ownersDir string

	log       klog.Logger
	keys      *group.Keyer // set by Prepare
	mu        sync.Mutex
	linked    map[string]time.Time // device ID → when Link last pointed it
	groupSeen map[string]time.Time // group key → when last referenced by a slot link
}

// NewStore returns a Store for the given host directories. log receives a
// line per removed slot link and group directory.
func NewStore(stateDir, shmDir string, log klog.Logger) *Store {
	return &Store{
		log:       log,
		stateDir:  filepath.Clean(stateDir),
		shmDir:    filepath.Clean(shmDir),
		slotsDir:  contract.SlotsDir(stateDir),
		groupsDir: contract.GroupsDir(shmDir),
		ownersDir: contract.OwnersDir(shmDir),
		linked:    make(map[string]time.Time),
		groupSeen: make(map[string]time.Time),
	}
}

// SlotPath is the host path of a device's slot link.
func (s *Store) SlotPath(deviceID string) string { return filepath.Join(s.slotsDir, deviceID) }

// GroupPath is the host path of a group directory.
func (s *Store) GroupPath(key string) string { return filepath.Join(s.groupsDir, key) }

// Prepare creates the state and shm folders and checks that nobody but this
// process's user can write to them: group directories are created and
// removed below them by path. The folders of slot links, group directories
// and owner records are closed to everyone else, and the key secret is
// read, or made on a first start.
func (s *Store) Prepare() error {
	if err := group.MakePrivateDirs(s.stateDir, s.shmDir); err != nil {
		return err
	}
	if err := group.MakeClosedDirs(s.slotsDir, s.groupsDir, s.ownersDir); err != nil {
		return err
	}
	keys, err := group.LoadKeyer(s.stateDir)
	if err != nil {
		return err
	}
	s.keys = keys
	return nil
}

// GroupKey is the key of the group directory of (namespace, source,
// identity): group.Keyer.FolderKey. A directory it finds is kept from
// collection for the grace period, so the Link that follows finds it still.
func (s *Store) GroupKey(namespace, source, identity string, now time.Time) (string, error) {
	if s.keys == nil {
		return "", errors.New("group store used before Prepare")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key, err := s.keys.FolderKey(s.groupsDir, namespace, source, identity)
	if err != nil {
		return "", err
	}
	if _, ok := s.groupSeen[key]; ok {
		s.groupSeen[key] = now
	}
	return key, nil
}

// Link creates the group directory of key, atomically points the slot link
// of every device at it and records owner for each device. It returns the
// group directory. A record that cannot be written fails nothing: the
// record names pods for the agent's metrics only, and Collect writes it
// again.
func (s *Store) Link(deviceIDs []string, key string, owner group.Owner, now time.Time) (string, error) {
	if !contract.IsGroupKey(key) {
		return "", fmt.Errorf("invalid group key %q", key)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := s.GroupPath(key)
	if err := group.EnsureDir(dir); err != nil {
		return "", err
	}
	s.groupSeen[key] = now
	for _, id := range deviceIDs {
		old := s.linkedGroup(id)
		if err := replaceSymlink(s.slotsDir, id, dir); err != nil {
			return "", err
		}
		s.linked[id] = now
		if err := group.WriteOwner(s.ownersDir, key, slotOwnerID(id), owner); err != nil {
			s.log.Error(err, "Owner record not written", "device", id, "group", key)
		}
		if old != "" && old != key {
			if err := group.RemoveOwner(s.ownersDir, old, slotOwnerID(id)); err != nil {
				s.log.Error(err, "Owner record of the slot's former group not removed", "device", id, "group", old)
			}
		}
	}
	return dir, nil
}

// slotOwnerID is the owner ID of a device's record.
func slotOwnerID(deviceID string) string { return group.OwnerSlotPrefix + deviceID }

// linkedGroup returns the key of the group folder the slot link of
// deviceID points at, or "".
func (s *Store) linkedGroup(deviceID string) string {
	target, err := os.Readlink(s.SlotPath(deviceID))
	if err != nil || filepath.Dir(target) != s.groupsDir || !contract.IsGroupKey(filepath.Base(target)) {
		return ""
	}
	return filepath.Base(target)
}

// replaceSymlink points dir/name at target by renaming a fresh link over it,
// so a reader sees the old or the new target, never none.
func replaceSymlink(dir, name, target string) error {
	final := filepath.Join(dir, name)
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%016x.tmp", name, rand.Uint64()))
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("create slot link %s: %w", tmp, err)
	}
	err := os.Rename(tmp, final)
	if err != nil {
		// A runtime that found no slot link may have created an empty
		// directory in its place.
		if fi, lerr := os.Lstat(final); lerr == nil && fi.IsDir() && os.Remove(final) == nil {
			err = os.Rename(tmp, final)
		}
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("replace slot link %s → %s: %w", final, target, err)
	}
	return nil
}

// Collect removes the slot links of devices not in assigned, and group
// directories that no slot link has referenced for longer than grace. A link
// made by Link less than grace ago is kept even when assigned lacks it, since
// the kubelet's view may lag behind. It then makes the owner records agree
// with the slot links: a record whose slot link is gone or points elsewhere
// is removed, and a linked, assigned device without one (a link made by a
// version before the records, a record Link failed to write) gets one naming
// the pod assigned says holds it.
func (s *Store) Collect(assigned map[string]group.Owner, now time.Time, grace time.Duration) (slots, groups int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	entries, err := os.ReadDir(s.slotsDir)
	if err != nil {
		return 0, 0, fmt.Errorf("read slots %s: %w", s.slotsDir, err)
	}
	var errs []error
	referenced := make(map[string]bool)
	linkedTo := make(map[string]string) // device ID → group key
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(s.slotsDir, name)
		if strings.HasPrefix(name, ".") {
			if fi, err := os.Lstat(path); err == nil && now.Sub(fi.ModTime()) > grace {
				os.Remove(path)
			}
			continue
		}
		if _, ok := assigned[name]; !ok && now.Sub(s.linked[name]) > grace {
			if err := os.Remove(path); err != nil {
				errs = append(errs, fmt.Errorf("remove slot %s: %w", path, err))
			} else {
				delete(s.linked, name)
				slots++
				s.log.V(2).Info("Removed slot link of unassigned device", "device", name)
				continue
			}
		}
		if target, err := os.Readlink(path); err == nil && filepath.Dir(target) == s.groupsDir {
			referenced[filepath.Base(target)] = true
			linkedTo[name] = filepath.Base(target)
		}
	}
	defer func() {
		if oerr := s.reconcileOwners(linkedTo, assigned); oerr != nil {
			err = errors.Join(err, oerr)
		}
	}()

	entries, err = os.ReadDir(s.groupsDir)
	if err != nil {
		return slots, 0, errors.Join(append(errs, fmt.Errorf("read groups %s: %w", s.groupsDir, err))...)
	}
	root, err := os.OpenRoot(s.groupsDir)
	if err != nil {
		return slots, 0, errors.Join(append(errs, fmt.Errorf("open groups %s: %w", s.groupsDir, err))...)
	}
	defer root.Close()
	present := make(map[string]bool, len(entries))
	for _, e := range entries {
		key := e.Name()
		if !contract.IsGroupKey(key) {
			continue
		}
		present[key] = true
		seen, ok := s.groupSeen[key]
		switch {
		case referenced[key] || !ok:
			s.groupSeen[key] = now
		case now.Sub(seen) > grace:
			// Root confines the removal to groupsDir: links inside a group
			// directory are removed, never followed.
			if err := root.RemoveAll(key); err != nil {
				errs = append(errs, fmt.Errorf("remove group %s: %w", s.GroupPath(key), err))
				continue
			}
			delete(s.groupSeen, key)
			groups++
			s.log.Info("Removed unused group directory", "group", key, "unusedFor", now.Sub(seen).Round(time.Millisecond))
		}
	}
	for key := range s.groupSeen {
		if !present[key] {
			delete(s.groupSeen, key)
		}
	}
	return slots, groups, errors.Join(errs...)
}

// reconcileOwners removes the slot owner records that no slot link backs
// and writes those that linked, assigned devices lack. Records of other
// owners (a DRA driver's claims in a shared folder) are left alone.
func (s *Store) reconcileOwners(linkedTo map[string]string, assigned map[string]group.Owner) error {
	names, err := group.ListOwners(s.ownersDir)
	if err != nil {
		return err
	}
	var errs []error
	recorded := make(map[string]bool)
	for key, files := range names {
		for _, f := range files {
			_, id, _ := group.ParseOwnerRecordName(f)
			dev, ok := strings.CutPrefix(id, group.OwnerSlotPrefix)
			if !ok {
				continue
			}
			if linkedTo[dev] == key {
				recorded[dev] = true
				continue
			}
			if err := group.RemoveOwner(s.ownersDir, key, id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for dev, key := range linkedTo {
		if o, ok := assigned[dev]; ok && !recorded[dev] {
			if err := group.WriteOwner(s.ownersDir, key, slotOwnerID(dev), o); err != nil {
				errs = append(errs, err)
			} else {
				s.log.V(2).Info("Wrote the owner record of a linked device", "device", dev, "group", key, "pod", klog.KRef(o.Namespace, strings.Join(o.Pods, ",")))
			}
		}
	}
	return errors.Join(errs...)
}
