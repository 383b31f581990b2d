// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// RefusalPrefix opens the name of a refusal record in a registry root:
// <root>/pxn-refused-<pid>. A rank that refuses its configuration never
// registers a control file, so this record is how readers outside the
// process (the node agent's metrics, inspect) learn of it.
const RefusalPrefix = "pxn-refused-"

// Bounds on what a record holds and on what a reader takes from a root: the
// folder is the workload's, so a reader trusts none of it.
const (
	maxRefusalBytes    = 4096
	maxRefusedValue    = 256
	MaxRefusalsPerRoot = 64
)

// Refusal is one process's refused configuration.
type Refusal struct {
	Pid       int               `json:"pid"`
	Variables []RefusedVariable `json:"variables"`
}

// RefusedVariable is one MC_PXN_* variable a process refused: its value
// (cut to 256 bytes; empty when unset) and why.
type RefusedVariable struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Reason string `json:"reason"`
}

func refusalName(pid int) string { return RefusalPrefix + strconv.Itoa(pid) }

// WriteRefusal records r in root, replacing the record of the same pid. The
// file is written beside its final name and renamed into place, mode 0600,
// never through a symlink.
func WriteRefusal(root string, r Refusal) error {
	if r.Pid <= 0 {
		return fmt.Errorf("refusal record: pid %d", r.Pid)
	}
	for i := range r.Variables {
		v := &r.Variables[i]
		if len(v.Value) > maxRefusedValue {
			v.Value = strings.ToValidUTF8(v.Value[:maxRefusedValue], "")
		}
		if len(v.Reason) > maxRefusedValue {
			v.Reason = strings.ToValidUTF8(v.Reason[:maxRefusedValue], "")
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("refusal record: %w", err)
	}
	if len(b) > maxRefusalBytes {
		return fmt.Errorf("refusal record of pid %d: %d bytes, over %d", r.Pid, len(b), maxRefusalBytes)
	}
	rootfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rootfd)
	name := refusalName(r.Pid)
	tmp := "." + name + ".tmp"
	fd, err := unix.Openat(rootfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: filepath.Join(root, tmp), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(root, tmp))
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return fmt.Errorf("refusal record %s: not a regular file", f.Name())
	}
	_ = unix.Fchmod(fd, 0o600)
	if _, err := f.Write(b); err != nil {
		f.Close()
		_ = unix.Unlinkat(rootfd, tmp, 0)
		return fmt.Errorf("refusal record: %w", err)
	}
	if err := f.Close(); err != nil {
		_ = unix.Unlinkat(rootfd, tmp, 0)
		return fmt.Errorf("refusal record: %w", err)
	}
	if err := unix.Renameat(rootfd, tmp, rootfd, name); err != nil {
		_ = unix.Unlinkat(rootfd, tmp, 0)
		return &os.PathError{Op: "rename", Path: filepath.Join(root, name), Err: err}
	}
	return nil
}

// RemoveRefusal removes the record of pid from root, if there is one: a
// process whose configuration is accepted clears what an earlier process of
// the same pid (a restarted container) left.
func RemoveRefusal(root string, pid int) error {
	err := os.Remove(filepath.Join(root, refusalName(pid)))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ReadRefusals reads the refusal records of root, at most
// MaxRefusalsPerRoot, sorted by pid. A record that is not a regular file,
// is too long, does not parse, or names a variable outside the contract is
// left out, and counted in bad. Only an unreadable root is an error.
func ReadRefusals(root string) (rs []Refusal, bad int, err error) {
	rootfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rootfd)
	names, err := folder.ReadDirNames(rootfd, root)
	if err != nil {
		return nil, 0, err
	}
	sort.Strings(names)
	for _, n := range names {
		if !strings.HasPrefix(n, RefusalPrefix) {
			continue
		}
		if len(rs) == MaxRefusalsPerRoot {
			bad++
			continue
		}
		r, err := readRefusal(rootfd, n)
		if err != nil {
			bad++
			continue
		}
		rs = append(rs, r)
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].Pid < rs[j].Pid })
	return rs, bad, nil
}

func readRefusal(rootfd int, name string) (Refusal, error) {
	var r Refusal
	pid, err := strconv.Atoi(strings.TrimPrefix(name, RefusalPrefix))
	if err != nil || pid <= 0 || name != refusalName(pid) {
		return r, fmt.Errorf("refusal record %q: not a canonical name", name)
	}
	fd, err := unix.Openat(rootfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return r, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return r, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxRefusalBytes {
		return r, fmt.Errorf("refusal record %q: not a regular file of at most %d bytes", name, maxRefusalBytes)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRefusalBytes+1))
	if err != nil {
		return r, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("refusal record %q: %w", name, err)
	}
	if r.Pid != pid || len(r.Variables) == 0 {
		return r, fmt.Errorf("refusal record %q: pid %d, %d variables", name, r.Pid, len(r.Variables))
	}
	for _, v := range r.Variables {
		if !contract.IsVariable(v.Name) || !utf8.ValidString(v.Value) || !utf8.ValidString(v.Reason) {
			return r, fmt.Errorf("refusal record %q: variable %s", name, contract.Quote(v.Name))
		}
	}
	return r, nil
}
