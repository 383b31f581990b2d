package staging

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The engine's environment variables.
const (
	EnvEnable           = "MC_PXN_ENABLE"
	EnvGroupID          = "MC_PXN_GROUP_ID"
	EnvInflightDepth    = "MC_PXN_INFLIGHT_DEPTH"
	EnvRailMap          = "MC_PXN_RAIL_MAP"
	EnvCreditTimeout    = "MC_PXN_CREDIT_TIMEOUT_MS"
	EnvHeartbeatTimeout = "MC_PXN_HEARTBEAT_TIMEOUT_MS"
	EnvRegistryRoot     = "MC_PXN_REGISTRY_ROOT"
)

// Defaults and accepted ranges of the configuration.
const (
	DefaultInflightDepth = 4
	MinInflightDepth     = 1
	MaxInflightDepth     = 64

	DefaultCreditTimeout = 1000 * time.Millisecond
	MinCreditTimeout     = 1 * time.Millisecond
	MaxCreditTimeout     = 600000 * time.Millisecond

	DefaultHeartbeatTimeout = 3000 * time.Millisecond
	// MinHeartbeatTimeout is two periods of the 100 ms heartbeat: a relay
	// is declared stale only after it missed at least one beat.
	MinHeartbeatTimeout = 200 * time.Millisecond
	MaxHeartbeatTimeout = 600000 * time.Millisecond

	DefaultRegistryRoot = "/dev/shm"
	MaxRegistryRoot     = 1024

	MaxGroupID = 64

	MaxRailMapBytes   = 64 << 10
	MaxRailMapEntries = 1024
	// MaxHCAName and MaxRailName are the name fields of a registry Header.
	MaxHCAName  = len(Header{}.HCA)
	MaxRailName = len(Header{}.Rail)
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
}

// DefaultConfig is PXN off with every default in place.
func DefaultConfig() Config {
	return Config{
		InflightDepth:    DefaultInflightDepth,
		CreditTimeout:    DefaultCreditTimeout,
		HeartbeatTimeout: DefaultHeartbeatTimeout,
		RegistryRoot:     DefaultRegistryRoot,
	}
}

// RegistryDir is the directory where ranks of c's group meet:
// <root>/mooncake-pxn-<euid>-<group>.
func (c Config) RegistryDir(euid int) string {
	return filepath.Join(c.RegistryRoot, "mooncake-pxn-"+strconv.Itoa(euid)+"-"+c.GroupID)
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
	return fmt.Sprintf("%s=%s: %v", e.Var, quoteValue(e.Value), e.Err)
}

func (e *EnvError) Unwrap() error { return e.Err }

// maxQuoted is how much of an offending value an error message repeats.
const maxQuoted = 64

func quoteValue(v string) string {
	if len(v) <= maxQuoted {
		return strconv.Quote(v)
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(v[:maxQuoted]), len(v))
}

var errGroupRequired = fmt.Errorf("required when %s=1", EnvEnable)

// ConfigFromEnv reads the configuration through lookup (os.LookupEnv when
// nil). A variable set to the empty string counts as unset. MC_PXN_ENABLE
// accepts exactly "0" and "1"; unless it is "1" nothing else is read. With
// any problem the returned Config has Enable false, holds the default in
// place of each invalid value, and every problem is one *EnvError.
func ConfigFromEnv(lookup func(string) (string, bool)) (Config, []error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	get := func(name string) (string, bool) {
		v, ok := lookup(name)
		return v, ok && v != ""
	}
	cfg := DefaultConfig()
	switch v, _ := get(EnvEnable); v {
	case "", "0":
		return cfg, nil
	case "1":
	default:
		return cfg, []error{&EnvError{Var: EnvEnable, Value: v, Set: true, Err: errors.New(`want "0" or "1"`)}}
	}

	var errs []error
	fail := func(name, value string, err error) {
		errs = append(errs, &EnvError{Var: name, Value: value, Set: true, Err: err})
	}
	if v, ok := get(EnvGroupID); !ok {
		errs = append(errs, &EnvError{Var: EnvGroupID, Err: errGroupRequired})
	} else if err := ValidateGroupID(v); err != nil {
		fail(EnvGroupID, v, err)
	} else {
		cfg.GroupID = v
	}
	if v, ok := get(EnvInflightDepth); ok {
		if n, err := parseRange(v, MinInflightDepth, MaxInflightDepth); err != nil {
			fail(EnvInflightDepth, v, err)
		} else {
			cfg.InflightDepth = n
		}
	}
	if v, ok := get(EnvRailMap); ok {
		if m, err := ParseRailMap(v); err != nil {
			fail(EnvRailMap, v, err)
		} else {
			cfg.RailMap = m
		}
	}
	for _, d := range []struct {
		name     string
		min, max time.Duration
		dst      *time.Duration
	}{
		{EnvCreditTimeout, MinCreditTimeout, MaxCreditTimeout, &cfg.CreditTimeout},
		{EnvHeartbeatTimeout, MinHeartbeatTimeout, MaxHeartbeatTimeout, &cfg.HeartbeatTimeout},
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
	if v, ok := get(EnvRegistryRoot); ok {
		if root, err := checkRegistryRoot(v); err != nil {
			fail(EnvRegistryRoot, v, err)
		} else {
			cfg.RegistryRoot = root
		}
	}
	cfg.Enable = len(errs) == 0
	return cfg, errs
}

// Load is ConfigFromEnv that hands each problem to warn, once. A host process
// logs them and runs with PXN off; nothing here can panic on a bad value.
func Load(lookup func(string) (string, bool), warn func(error)) Config {
	cfg, errs := ConfigFromEnv(lookup)
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
	switch {
	case len(s) > MaxRegistryRoot:
		return "", fmt.Errorf("longer than %d bytes", MaxRegistryRoot)
	case strings.IndexByte(s, 0) >= 0:
		return "", errors.New("contains a NUL byte")
	case !filepath.IsAbs(s):
		return "", errors.New("not an absolute path")
	}
	return filepath.Clean(s), nil
}

// ValidateGroupID checks a group id: 1..64 bytes of [A-Za-z0-9_.-], and
// neither "." nor "..", so that it is one safe path element.
func ValidateGroupID(id string) error {
	switch {
	case id == "" || len(id) > MaxGroupID:
		return fmt.Errorf("length %d not in 1..%d", len(id), MaxGroupID)
	case id == "." || id == "..":
		return errors.New(`"." and ".." are not group ids`)
	}
	if i := invalidNameByte(id); i >= 0 {
		return fmt.Errorf("byte %d (%+q) not in [A-Za-z0-9_.-]", i, id[i])
	}
	return nil
}

// invalidNameByte is the index of the first byte of s outside
// [A-Za-z0-9_.-], or -1.
func invalidNameByte(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return i
		}
	}
	return -1
}
