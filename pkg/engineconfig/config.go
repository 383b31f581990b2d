// SPDX-License-Identifier: Apache-2.0

// Package engineconfig is the engine's configuration: the MC_PXN_*
// variables of package contract read from a process's environment and
// checked.
package engineconfig

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/pxn-project/pxn/pkg/contract"
)

// Config is the engine configuration. Only a Config with Enable set may be
// used to start PXN; every other field then holds a validated value.
type Config struct {
	Enable        bool
	GroupID       string
	InflightDepth int
	// RailMap maps raw HCA names to canonical rails; nil when unset.
	RailMap          map[string]string
	CreditTimeout    time.Duration
	HeartbeatTimeout time.Duration
	RegistryRoot     string
	// FirstPiece is the byte cap of a request's first Piece (the
	// planner's ramp); the slot size is no ramp.
	FirstPiece uint64
	// SlotParts is the most parts a Piece on an idle lane is copied and
	// forwarded in (Desc.Parts); 1 is none.
	SlotParts int
	// CopyMode is how a CUDA sender moves a Piece into a relay's slot:
	// contract.CopyModeAuto, CopyModeCE or CopyModeSM.
	CopyMode string
}

// Default is PXN off with every default in place.
func Default() Config {
	return Config{
		InflightDepth:    contract.DefaultInflightDepth,
		CreditTimeout:    contract.DefaultCreditTimeout,
		HeartbeatTimeout: contract.DefaultHeartbeatTimeout,
		RegistryRoot:     contract.DefaultRegistryRoot,
		FirstPiece:       contract.DefaultFirstPieceKiB << 10,
		SlotParts:        contract.DefaultSlotParts,
		CopyMode:         contract.CopyModeAuto,
	}
}

// EnvError is one problem with one environment variable.
type EnvError struct {
	Var string
	// Value is the offending value; meaningless when !Set.
	Value string
	Set   bool
	Err   error
}

func (e *EnvError) Error() string {
	if !e.Set {
		return fmt.Sprintf("%s is not set: %v", e.Var, e.Err)
	}
	return fmt.Sprintf("%s=%s: %v", e.Var, contract.Quote(e.Value), e.Err)
}

func (e *EnvError) Unwrap() error { return e.Err }

var errGroupRequired = fmt.Errorf("required when %s=%s", contract.EnvEnable, contract.EnableOn)

// FromEnv reads the configuration through lookup (os.LookupEnv when
// nil): the variables, defaults and ranges of package contract. A variable
// set to the empty string counts as unset. contract.EnvEnable accepts exactly
// "0" and "1"; unless it is "1" nothing else is read. With
// any problem the returned Config has Enable false, holds the default in
// place of each invalid value, and every problem is one *EnvError.
func FromEnv(lookup func(string) (string, bool)) (Config, []error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	get := func(name string) (string, bool) {
		v, ok := lookup(name)
		return v, ok && v != ""
	}
	cfg := Default()
	switch v, _ := get(contract.EnvEnable); v {
	case "", contract.EnableOff:
		return cfg, nil
	case contract.EnableOn:
	default:
		return cfg, []error{&EnvError{Var: contract.EnvEnable, Value: v, Set: true,
			Err: fmt.Errorf("want %q or %q", contract.EnableOff, contract.EnableOn)}}
	}

	var errs []error
	fail := func(name, value string, err error) {
		errs = append(errs, &EnvError{Var: name, Value: value, Set: true, Err: err})
	}
	if v, ok := get(contract.EnvGroupID); !ok {
		errs = append(errs, &EnvError{Var: contract.EnvGroupID, Err: errGroupRequired})
	} else if err := contract.ValidateGroupID(v); err != nil {
		fail(contract.EnvGroupID, v, err)
	} else {
		cfg.GroupID = v
	}
	if v, ok := get(contract.EnvInflightDepth); ok {
		if n, err := parseRange(v, contract.MinInflightDepth, contract.MaxInflightDepth); err != nil {
			fail(contract.EnvInflightDepth, v, err)
		} else {
			cfg.InflightDepth = n
		}
	}
	if v, ok := get(contract.EnvFirstPiece); ok {
		if n, err := parseRange(v, contract.MinFirstPieceKiB, contract.MaxFirstPieceKiB); err != nil {
			fail(contract.EnvFirstPiece, v, err)
		} else {
			cfg.FirstPiece = uint64(n) << 10
		}
	}
	if v, ok := get(contract.EnvSlotParts); ok {
		if n, err := parseRange(v, contract.MinSlotParts, contract.MaxSlotParts); err != nil {
			fail(contract.EnvSlotParts, v, err)
		} else {
			cfg.SlotParts = n
		}
	}
	if v, ok := get(contract.EnvCopyMode); ok {
		switch v {
		case contract.CopyModeAuto, contract.CopyModeCE, contract.CopyModeSM:
			cfg.CopyMode = v
		default:
			fail(contract.EnvCopyMode, v, fmt.Errorf("want %s, %s or %s", contract.CopyModeCE, contract.CopyModeSM, contract.CopyModeAuto))
		}
	}
	if v, ok := get(contract.EnvRailMap); ok {
		if m, err := contract.ParseRailMap(v); err != nil {
			fail(contract.EnvRailMap, v, err)
		} else {
			cfg.RailMap = m
		}
	}
	for _, d := range []struct {
		name     string
		min, max time.Duration
		dst      *time.Duration
	}{
		{contract.EnvCreditTimeout, contract.MinCreditTimeout, contract.MaxCreditTimeout, &cfg.CreditTimeout},
		{contract.EnvHeartbeatTimeout, contract.MinHeartbeatTimeout, contract.MaxHeartbeatTimeout, &cfg.HeartbeatTimeout},
	} {
		v, ok := get(d.name)
		if !ok {
			continue
		}
		ms, err := parseRange(v, int(d.min/time.Millisecond), int(d.max/time.Millisecond))
		if err != nil {
			fail(d.name, v, err)
			continue
		}
		*d.dst = time.Duration(ms) * time.Millisecond
	}
	if root, err := registryRoot(get); err != nil {
		errs = append(errs, err)
	} else if root != "" {
		cfg.RegistryRoot = root
	}
	cfg.Enable = len(errs) == 0
	return cfg, errs
}

// RegistryRootFromEnv reads contract.EnvRegistryRoot through lookup
// (os.LookupEnv when nil) whether or not PXN is on, for a tool that makes
// the registry folders of ranks it starts: the cleaned path, "" when unset
// or empty, or an *EnvError.
func RegistryRootFromEnv(lookup func(string) (string, bool)) (string, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	return registryRoot(func(name string) (string, bool) {
		v, ok := lookup(name)
		return v, ok && v != ""
	})
}

// RailMapFromEnv reads contract.EnvRailMap through lookup (os.LookupEnv
// when nil) whether or not PXN is on, for a tool that starts ranks with a
// node's map: the map, nil when unset or empty, or an *EnvError.
func RailMapFromEnv(lookup func(string) (string, bool)) (map[string]string, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	v, ok := lookup(contract.EnvRailMap)
	if !ok || v == "" {
		return nil, nil
	}
	m, err := contract.ParseRailMap(v)
	if err != nil {
		return nil, &EnvError{Var: contract.EnvRailMap, Value: v, Set: true, Err: err}
	}
	return m, nil
}

func registryRoot(get func(string) (string, bool)) (string, error) {
	v, ok := get(contract.EnvRegistryRoot)
	if !ok {
		return "", nil
	}
	root, err := checkRegistryRoot(v)
	if err != nil {
		return "", &EnvError{Var: contract.EnvRegistryRoot, Value: v, Set: true, Err: err}
	}
	return root, nil
}

// Load is FromEnv that hands each problem to warn, once. A host process
// logs them and runs with PXN off; nothing here can panic on a bad value.
func Load(lookup func(string) (string, bool), warn func(error)) Config {
	cfg, errs := FromEnv(lookup)
	if warn != nil {
		for _, err := range errs {
			warn(err)
		}
	}
	return cfg
}

// parseRange accepts only plain decimal digits: no sign, space or underscore.
func parseRange(s string, lo, hi int) (int, error) {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("not a decimal integer; want %d..%d", lo, hi)
		}
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n < uint64(lo) || n > uint64(hi) {
		return 0, fmt.Errorf("out of range %d..%d", lo, hi)
	}
	return int(n), nil
}

func checkRegistryRoot(s string) (string, error) {
	if err := contract.ValidateRegistryRoot(s); err != nil {
		return "", err
	}
	return filepath.Clean(s), nil
}
