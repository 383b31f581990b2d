// SPDX-License-Identifier: Apache-2.0

package engineconfig

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/staging"
)

type env map[string]string

func (e env) lookup(name string) (string, bool) {
	v, ok := e[name]
	return v, ok
}

func (e env) with(name, value string) env {
	c := maps.Clone(e)
	c[name] = value
	return c
}

func (e env) without(name string) env {
	c := maps.Clone(e)
	delete(c, name)
	return c
}

var enabled = env{contract.EnvEnable: "1", contract.EnvGroupID: "job-7"}

var allEnvVars = []string{contract.EnvEnable, contract.EnvGroupID, contract.EnvInflightDepth, contract.EnvRailMap, contract.EnvCreditTimeout, contract.EnvHeartbeatTimeout, contract.EnvRegistryRoot}

func TestConfigDefaults(t *testing.T) {
	cfg, errs := FromEnv(env{}.lookup)
	if len(errs) != 0 {
		t.Fatalf("errors with nothing set: %v", errs)
	}
	want := Config{
		InflightDepth:    4,
		CreditTimeout:    1000 * time.Millisecond,
		HeartbeatTimeout: 3000 * time.Millisecond,
		RegistryRoot:     "/dev/shm",
		FirstPiece:       staging.SlotSize,
		SlotParts:        staging.MaxParts,
		CopyMode:         "auto",
	}
	if !equalConfig(cfg, want) {
		t.Fatalf("config = %+v, want %+v", cfg, want)
	}

	cfg, errs = FromEnv(enabled.lookup)
	if len(errs) != 0 {
		t.Fatalf("errors with enable and group: %v", errs)
	}
	want.Enable, want.GroupID = true, "job-7"
	if !equalConfig(cfg, want) {
		t.Fatalf("config = %+v, want %+v", cfg, want)
	}
}

func TestConfigDisabledReadsNothing(t *testing.T) {
	garbage := env{
		contract.EnvGroupID:          "../../etc",
		contract.EnvInflightDepth:    "-5",
		contract.EnvRailMap:          "[not json",
		contract.EnvCreditTimeout:    "soon",
		contract.EnvHeartbeatTimeout: "0",
		contract.EnvRegistryRoot:     "relative",
		contract.EnvCopyMode:         "kernel",
	}
	for _, enable := range []*string{nil, ptr(""), ptr("0")} {
		e := garbage
		name := "unset"
		if enable != nil {
			e = garbage.with(contract.EnvEnable, *enable)
			name = strconv.Quote(*enable)
		}
		t.Run(name, func(t *testing.T) {
			var looked []string
			cfg, errs := FromEnv(func(v string) (string, bool) {
				looked = append(looked, v)
				return e.lookup(v)
			})
			if len(errs) != 0 || !equalConfig(cfg, Default()) {
				t.Fatalf("config %+v, errors %v; want defaults and no error", cfg, errs)
			}
			if len(looked) != 1 || looked[0] != contract.EnvEnable {
				t.Fatalf("looked up %v, want only %s", looked, contract.EnvEnable)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestConfigEnable(t *testing.T) {
	for _, v := range []string{"true", "false", "TRUE", "yes", "on", "01", "00", " 1", "1 ", "2", "-1", "+1", "1\n", "０"} {
		t.Run(strconv.Quote(v), func(t *testing.T) {
			cfg, errs := FromEnv(enabled.with(contract.EnvEnable, v).lookup)
			if cfg.Enable || len(errs) != 1 {
				t.Fatalf("enable %q: config %+v, errors %v; want PXN off and one error", v, cfg, errs)
			}
			checkEnvError(t, errs[0], contract.EnvEnable, v)
		})
	}
}

func TestConfigVariables(t *testing.T) {
	long := strings.Repeat("a", 64)
	tests := []struct {
		name  string
		env   env
		bad   string
		check func(Config) bool
	}{
		{"group 1 byte", enabled.with(contract.EnvGroupID, "a"), "", func(c Config) bool { return c.GroupID == "a" }},
		{"group 64 bytes", enabled.with(contract.EnvGroupID, long), "", func(c Config) bool { return c.GroupID == long }},
		{"group every class", enabled.with(contract.EnvGroupID, "Job_1.x-Y"), "", func(c Config) bool { return c.GroupID == "Job_1.x-Y" }},
		{"group three dots", enabled.with(contract.EnvGroupID, "..."), "", func(c Config) bool { return c.GroupID == "..." }},
		{"group 65 bytes", enabled.with(contract.EnvGroupID, long+"a"), contract.EnvGroupID, nil},
		{"group dot", enabled.with(contract.EnvGroupID, "."), contract.EnvGroupID, nil},
		{"group dot dot", enabled.with(contract.EnvGroupID, ".."), contract.EnvGroupID, nil},
		{"group slash", enabled.with(contract.EnvGroupID, "a/b"), contract.EnvGroupID, nil},
		{"group space", enabled.with(contract.EnvGroupID, "a b"), contract.EnvGroupID, nil},
		{"group non-ASCII", enabled.with(contract.EnvGroupID, "jöb"), contract.EnvGroupID, nil},
		{"group NUL", enabled.with(contract.EnvGroupID, "a\x00"), contract.EnvGroupID, nil},

		{"depth default", enabled, "", func(c Config) bool { return c.InflightDepth == 4 }},
		{"depth empty", enabled.with(contract.EnvInflightDepth, ""), "", func(c Config) bool { return c.InflightDepth == 4 }},
		{"depth 1", enabled.with(contract.EnvInflightDepth, "1"), "", func(c Config) bool { return c.InflightDepth == 1 }},
		{"depth 64", enabled.with(contract.EnvInflightDepth, "64"), "", func(c Config) bool { return c.InflightDepth == 64 }},
		{"depth leading zeros", enabled.with(contract.EnvInflightDepth, "007"), "", func(c Config) bool { return c.InflightDepth == 7 }},
		{"depth 0", enabled.with(contract.EnvInflightDepth, "0"), contract.EnvInflightDepth, nil},
		{"depth 65", enabled.with(contract.EnvInflightDepth, "65"), contract.EnvInflightDepth, nil},
		{"depth negative", enabled.with(contract.EnvInflightDepth, "-1"), contract.EnvInflightDepth, nil},
		{"depth plus sign", enabled.with(contract.EnvInflightDepth, "+4"), contract.EnvInflightDepth, nil},
		{"depth space", enabled.with(contract.EnvInflightDepth, " 4"), contract.EnvInflightDepth, nil},
		{"depth fraction", enabled.with(contract.EnvInflightDepth, "4.0"), contract.EnvInflightDepth, nil},
		{"depth hex", enabled.with(contract.EnvInflightDepth, "0x10"), contract.EnvInflightDepth, nil},
		{"depth underscore", enabled.with(contract.EnvInflightDepth, "1_0"), contract.EnvInflightDepth, nil},
		{"depth huge", enabled.with(contract.EnvInflightDepth, "99999999999999999999999"), contract.EnvInflightDepth, nil},

		{"credit default", enabled, "", func(c Config) bool { return c.CreditTimeout == time.Second }},
		{"credit 1", enabled.with(contract.EnvCreditTimeout, "1"), "", func(c Config) bool { return c.CreditTimeout == time.Millisecond }},
		{"credit 600000", enabled.with(contract.EnvCreditTimeout, "600000"), "", func(c Config) bool { return c.CreditTimeout == 10*time.Minute }},
		{"credit 0", enabled.with(contract.EnvCreditTimeout, "0"), contract.EnvCreditTimeout, nil},
		{"credit 600001", enabled.with(contract.EnvCreditTimeout, "600001"), contract.EnvCreditTimeout, nil},
		{"credit with unit", enabled.with(contract.EnvCreditTimeout, "1s"), contract.EnvCreditTimeout, nil},
		{"credit 2^32", enabled.with(contract.EnvCreditTimeout, "4294967296"), contract.EnvCreditTimeout, nil},

		{"heartbeat default", enabled, "", func(c Config) bool { return c.HeartbeatTimeout == 3*time.Second }},
		{"heartbeat 200", enabled.with(contract.EnvHeartbeatTimeout, "200"), "", func(c Config) bool { return c.HeartbeatTimeout == 200*time.Millisecond }},
		{"heartbeat 600000", enabled.with(contract.EnvHeartbeatTimeout, "600000"), "", func(c Config) bool { return c.HeartbeatTimeout == 10*time.Minute }},
		{"heartbeat 199", enabled.with(contract.EnvHeartbeatTimeout, "199"), contract.EnvHeartbeatTimeout, nil},
		{"heartbeat equal to the period", enabled.with(contract.EnvHeartbeatTimeout, "100"), contract.EnvHeartbeatTimeout, nil},
		{"heartbeat 600001", enabled.with(contract.EnvHeartbeatTimeout, "600001"), contract.EnvHeartbeatTimeout, nil},
		{"heartbeat negative", enabled.with(contract.EnvHeartbeatTimeout, "-3000"), contract.EnvHeartbeatTimeout, nil},

		{"first piece default: no ramp", enabled, "", func(c Config) bool { return c.FirstPiece == staging.SlotSize }},
		{"first piece 4", enabled.with(contract.EnvFirstPiece, "4"), "", func(c Config) bool { return c.FirstPiece == 4<<10 }},
		{"first piece 1000", enabled.with(contract.EnvFirstPiece, "1000"), "", func(c Config) bool { return c.FirstPiece == 1000<<10 }},
		{"first piece the slot", enabled.with(contract.EnvFirstPiece, "8192"), "", func(c Config) bool { return c.FirstPiece == staging.SlotSize }},
		{"first piece 3", enabled.with(contract.EnvFirstPiece, "3"), contract.EnvFirstPiece, nil},
		{"first piece 0", enabled.with(contract.EnvFirstPiece, "0"), contract.EnvFirstPiece, nil},
		{"first piece past the slot", enabled.with(contract.EnvFirstPiece, "8193"), contract.EnvFirstPiece, nil},
		{"first piece with unit", enabled.with(contract.EnvFirstPiece, "256KiB"), contract.EnvFirstPiece, nil},
		{"slot parts default", enabled, "", func(c Config) bool { return c.SlotParts == staging.MaxParts }},
		{"slot parts 1: off", enabled.with(contract.EnvSlotParts, "1"), "", func(c Config) bool { return c.SlotParts == 1 }},
		{"slot parts 4", enabled.with(contract.EnvSlotParts, "4"), "", func(c Config) bool { return c.SlotParts == 4 }},
		{"slot parts 0", enabled.with(contract.EnvSlotParts, "0"), contract.EnvSlotParts, nil},
		{"slot parts 9", enabled.with(contract.EnvSlotParts, "9"), contract.EnvSlotParts, nil},

		{"copy mode default", enabled, "", func(c Config) bool { return c.CopyMode == contract.CopyModeAuto }},
		{"copy mode empty", enabled.with(contract.EnvCopyMode, ""), "", func(c Config) bool { return c.CopyMode == contract.CopyModeAuto }},
		{"copy mode auto", enabled.with(contract.EnvCopyMode, "auto"), "", func(c Config) bool { return c.CopyMode == contract.CopyModeAuto }},
		{"copy mode ce", enabled.with(contract.EnvCopyMode, "ce"), "", func(c Config) bool { return c.CopyMode == contract.CopyModeCE }},
		{"copy mode sm", enabled.with(contract.EnvCopyMode, "sm"), "", func(c Config) bool { return c.CopyMode == contract.CopyModeSM }},
		{"copy mode upper case", enabled.with(contract.EnvCopyMode, "SM"), contract.EnvCopyMode, nil},
		{"copy mode padded", enabled.with(contract.EnvCopyMode, " sm "), contract.EnvCopyMode, nil},
		{"copy mode unknown", enabled.with(contract.EnvCopyMode, "kernel"), contract.EnvCopyMode, nil},

		{"root default", enabled, "", func(c Config) bool { return c.RegistryRoot == "/dev/shm" }},
		{"root empty", enabled.with(contract.EnvRegistryRoot, ""), "", func(c Config) bool { return c.RegistryRoot == "/dev/shm" }},
		{"root absolute", enabled.with(contract.EnvRegistryRoot, "/run/pxn/slots/3"), "", func(c Config) bool { return c.RegistryRoot == "/run/pxn/slots/3" }},
		{"root cleaned", enabled.with(contract.EnvRegistryRoot, "/run//pxn/./x/../"), "", func(c Config) bool { return c.RegistryRoot == "/run/pxn" }},
		{"root slash", enabled.with(contract.EnvRegistryRoot, "/"), "", func(c Config) bool { return c.RegistryRoot == "/" }},
		{"root 1024 bytes", enabled.with(contract.EnvRegistryRoot, "/"+strings.Repeat("d", 1023)), "", func(c Config) bool { return len(c.RegistryRoot) == 1024 }},
		{"root relative", enabled.with(contract.EnvRegistryRoot, "dev/shm"), contract.EnvRegistryRoot, nil},
		{"root dot", enabled.with(contract.EnvRegistryRoot, "./shm"), contract.EnvRegistryRoot, nil},
		{"root NUL", enabled.with(contract.EnvRegistryRoot, "/dev/\x00shm"), contract.EnvRegistryRoot, nil},
		{"root 1025 bytes", enabled.with(contract.EnvRegistryRoot, "/"+strings.Repeat("d", 1024)), contract.EnvRegistryRoot, nil},

		{"rail map unset", enabled, "", func(c Config) bool { return c.RailMap == nil }},
		{"rail map", enabled.with(contract.EnvRailMap, `{"mlx5_0":"rail0","mlx5_1":"rail1"}`), "", func(c Config) bool {
			return maps.Equal(c.RailMap, map[string]string{"mlx5_0": "rail0", "mlx5_1": "rail1"})
		}},
		{"rail map empty object", enabled.with(contract.EnvRailMap, " {} "), "", func(c Config) bool { return c.RailMap == nil }},
		{"rail map array", enabled.with(contract.EnvRailMap, `["mlx5_0"]`), contract.EnvRailMap, nil},
		{"rail map duplicate", enabled.with(contract.EnvRailMap, `{"mlx5_0":"a","mlx5_0":"b"}`), contract.EnvRailMap, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, errs := FromEnv(tc.env.lookup)
			if tc.bad == "" {
				if len(errs) != 0 || !cfg.Enable {
					t.Fatalf("errors %v, enable %v; want PXN on", errs, cfg.Enable)
				}
				if !tc.check(cfg) {
					t.Fatalf("config %+v", cfg)
				}
				return
			}
			if cfg.Enable || len(errs) != 1 {
				t.Fatalf("config %+v, errors %v; want PXN off and one error", cfg, errs)
			}
			checkEnvError(t, errs[0], tc.bad, tc.env[tc.bad])
			if !equalConfigExcept(cfg, Default(), tc.bad) {
				t.Fatalf("invalid %s left config %+v, want defaults in its place", tc.bad, cfg)
			}
		})
	}
}

// checkEnvError asserts err names variable name and quotes value.
func checkEnvError(t *testing.T, err error, name, value string) {
	t.Helper()
	var ee *EnvError
	if !errors.As(err, &ee) || ee.Var != name || ee.Value != value {
		t.Fatalf("error %#v, want an *EnvError for %s=%q", err, name, value)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, name+"=") {
		t.Errorf("message %q does not start with %s=", msg, name)
	}
	quoted := strconv.Quote(value)
	if len(value) > 64 {
		quoted = strings.TrimSuffix(strconv.Quote(value[:64]), `"`)
	}
	if !strings.Contains(msg, quoted) {
		t.Errorf("message %q lacks the value %s", msg, quoted)
	}
}

func TestConfigGroupIDMissing(t *testing.T) {
	for name, e := range map[string]env{
		"unset": enabled.without(contract.EnvGroupID),
		"empty": enabled.with(contract.EnvGroupID, ""),
	} {
		t.Run(name, func(t *testing.T) {
			cfg, errs := FromEnv(e.lookup)
			if cfg.Enable || len(errs) != 1 {
				t.Fatalf("config %+v, errors %v; want PXN off and one error", cfg, errs)
			}
			want := contract.EnvGroupID + " is not set: required when " + contract.EnvEnable + "=1"
			if errs[0].Error() != want {
				t.Fatalf("message %q, want %q", errs[0], want)
			}
		})
	}
}

func TestConfigErrorMessages(t *testing.T) {
	tests := []struct {
		env  env
		want string
	}{
		{enabled.with(contract.EnvEnable, "true"), `MC_PXN_ENABLE="true": want "0" or "1"`},
		{enabled.with(contract.EnvInflightDepth, "65"), `MC_PXN_INFLIGHT_DEPTH="65": out of range 1..64`},
		{enabled.with(contract.EnvInflightDepth, "four"), `MC_PXN_INFLIGHT_DEPTH="four": not a decimal integer; want 1..64`},
		{enabled.with(contract.EnvCreditTimeout, "0"), `MC_PXN_CREDIT_TIMEOUT_MS="0": out of range 1..600000`},
		{enabled.with(contract.EnvHeartbeatTimeout, "150"), `MC_PXN_HEARTBEAT_TIMEOUT_MS="150": out of range 200..600000`},
		{enabled.with(contract.EnvRegistryRoot, "shm"), `MC_PXN_REGISTRY_ROOT="shm": not an absolute path`},
		{enabled.with(contract.EnvFirstPiece, "9000"), `MC_PXN_FIRST_PIECE_KIB="9000": out of range 4..8192`},
		{enabled.with(contract.EnvCopyMode, "gpu"), `MC_PXN_COPY_MODE="gpu": want ce, sm or auto`},
		{enabled.with(contract.EnvGroupID, "a:b"), `MC_PXN_GROUP_ID="a:b": byte 1 (':') not in [A-Za-z0-9_.-]`},
		{enabled.with(contract.EnvRailMap, `{"mlx5_0":1}`), `MC_PXN_RAIL_MAP="{\"mlx5_0\":1}": rail map: HCA "mlx5_0" maps to a number, want a string`},
	}
	for _, tc := range tests {
		_, errs := FromEnv(tc.env.lookup)
		if len(errs) != 1 || errs[0].Error() != tc.want {
			t.Errorf("errors %q, want [%q]", errs, tc.want)
		}
	}

	huge := `{"mlx5_0":"` + strings.Repeat("x", 70<<10) + `"}`
	_, errs := FromEnv(enabled.with(contract.EnvRailMap, huge).lookup)
	if len(errs) != 1 {
		t.Fatalf("errors %v, want one", errs)
	}
	msg := errs[0].Error()
	wantPrefix := `MC_PXN_RAIL_MAP=` + strconv.Quote(huge[:64]) + fmt.Sprintf("... (%d bytes): ", len(huge))
	if !strings.HasPrefix(msg, wantPrefix) || len(msg) > 256 {
		t.Fatalf("message %q, want a short one starting with %q", msg, wantPrefix)
	}
}

func TestConfigEveryProblemReported(t *testing.T) {
	e := env{
		contract.EnvEnable:           "1",
		contract.EnvInflightDepth:    "0",
		contract.EnvRailMap:          "{",
		contract.EnvCreditTimeout:    "250",
		contract.EnvHeartbeatTimeout: "9999999",
		contract.EnvRegistryRoot:     "tmp",
		contract.EnvCopyMode:         "kernel",
	}
	var warned []error
	cfg := Load(e.lookup, func(err error) { warned = append(warned, err) })
	if cfg.Enable {
		t.Fatal("PXN on despite invalid values")
	}
	want := []string{contract.EnvGroupID, contract.EnvInflightDepth, contract.EnvCopyMode, contract.EnvRailMap, contract.EnvHeartbeatTimeout, contract.EnvRegistryRoot}
	if len(warned) != len(want) {
		t.Fatalf("warnings %v, want one for each of %v", warned, want)
	}
	for i, err := range warned {
		var ee *EnvError
		if !errors.As(err, &ee) || ee.Var != want[i] {
			t.Errorf("warning %d = %v, want one about %s", i, err, want[i])
		}
	}
	if cfg.CreditTimeout != 250*time.Millisecond {
		t.Errorf("valid credit timeout not kept: %v", cfg.CreditTimeout)
	}

	warned = nil
	cfg = Load(enabled.lookup, func(err error) { warned = append(warned, err) })
	if !cfg.Enable || len(warned) != 0 {
		t.Fatalf("valid env: enable %v, warnings %v", cfg.Enable, warned)
	}
	if cfg := Load(e.lookup, nil); cfg.Enable {
		t.Fatal("PXN on with a nil warn func")
	}
}

// TestRegistryRootFromEnv reads the root whether or not PXN is on, and
// refuses what FromEnv refuses.
func TestRegistryRootFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env  env
		want string
		bad  bool
	}{
		{env{}, "", false},
		{env{contract.EnvRegistryRoot: ""}, "", false},
		{env{contract.EnvRegistryRoot: "/run//pxn/./x/../"}, "/run/pxn", false},
		{env{contract.EnvEnable: "0", contract.EnvRegistryRoot: "/run/pxn"}, "/run/pxn", false},
		{env{contract.EnvRegistryRoot: "shm"}, "", true},
	} {
		got, err := RegistryRootFromEnv(tc.env.lookup)
		var ee *EnvError
		if got != tc.want || (err != nil) != tc.bad || (err != nil && (!errors.As(err, &ee) || ee.Var != contract.EnvRegistryRoot)) {
			t.Errorf("RegistryRootFromEnv(%v) = %q, %v; want %q, error %v", tc.env, got, err, tc.want, tc.bad)
		}
	}
}

func TestRailMapFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env  env
		want map[string]string
		bad  bool
	}{
		{env{}, nil, false},
		{env{contract.EnvRailMap: ""}, nil, false},
		{env{contract.EnvEnable: "0", contract.EnvRailMap: `{"mlx5_2":"rail1"}`}, map[string]string{"mlx5_2": "rail1"}, false},
		{env{contract.EnvRailMap: `{"mlx5_2":`}, nil, true},
	} {
		got, err := RailMapFromEnv(tc.env.lookup)
		var ee *EnvError
		if !maps.Equal(got, tc.want) || (err != nil) != tc.bad || (err != nil && (!errors.As(err, &ee) || ee.Var != contract.EnvRailMap)) {
			t.Errorf("RailMapFromEnv(%v) = %v, %v; want %v, error %v", tc.env, got, err, tc.want, tc.bad)
		}
	}
}

func equalConfig(a, b Config) bool {
	return a.Enable == b.Enable && a.GroupID == b.GroupID && a.InflightDepth == b.InflightDepth &&
		maps.Equal(a.RailMap, b.RailMap) && (a.RailMap == nil) == (b.RailMap == nil) &&
		a.CreditTimeout == b.CreditTimeout && a.HeartbeatTimeout == b.HeartbeatTimeout &&
		a.RegistryRoot == b.RegistryRoot && a.FirstPiece == b.FirstPiece && a.CopyMode == b.CopyMode
}

// equalConfigExcept compares the fields other than Enable and GroupID, and
// than the one that variable name sets.
func equalConfigExcept(a, b Config, name string) bool {
	a.Enable, a.GroupID, b.Enable, b.GroupID = false, "", false, ""
	switch name {
	case contract.EnvInflightDepth:
		b.InflightDepth = a.InflightDepth
	case contract.EnvRailMap:
		b.RailMap = a.RailMap
	case contract.EnvCreditTimeout:
		b.CreditTimeout = a.CreditTimeout
	case contract.EnvHeartbeatTimeout:
		b.HeartbeatTimeout = a.HeartbeatTimeout
	case contract.EnvRegistryRoot:
		b.RegistryRoot = a.RegistryRoot
	case contract.EnvFirstPiece:
		b.FirstPiece = a.FirstPiece
	case contract.EnvCopyMode:
		b.CopyMode = a.CopyMode
	}
	return equalConfig(a, b)
}

var (
	groupRE = regexp.MustCompile(contract.GroupIDPattern)
	hcaRE   = regexp.MustCompile(contract.HCANamePattern)
	railRE  = regexp.MustCompile(contract.RailNamePattern)
	digitRE = regexp.MustCompile(`^[0-9]+$`)
)

func groupOK(v string) bool {
	return groupRE.MatchString(v) && v != "." && v != ".."
}

func intOK(v string, lo, hi int) (int, bool) {
	if !digitRE.MatchString(v) {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= lo && n <= hi
}

func rootOK(v string) bool {
	return strings.HasPrefix(v, "/") && !strings.ContainsRune(v, 0) && len(v) <= 1024
}

func railMapOK(t *testing.T, m map[string]string) {
	t.Helper()
	if len(m) > 1024 {
		t.Fatalf("rail map of %d entries accepted", len(m))
	}
	for k, v := range m {
		if !hcaRE.MatchString(k) || !railRE.MatchString(v) {
			t.Fatalf("rail map entry %q → %q accepted", k, v)
		}
	}
}

func FuzzConfigFromEnv(f *testing.F) {
	f.Add(uint8(0xff), "1", "job", "4", `{"mlx5_0":"rail0"}`, "1000", "3000", "/dev/shm")
	f.Add(uint8(0xff), "1", "..", "65", `{"a":1}`, "0", "199", "rel")
	f.Add(uint8(0x03), "1", "g", "", "", "", "", "")
	f.Add(uint8(0xff), "0", "", "x", "[", "-1", "", "")
	f.Add(uint8(0xff), "true", "a/b", "+4", `{"a":"b","a":"c"}`, "600001", "600000", "/a/../b/")
	f.Add(uint8(0x7f), "1", "A.b-c_9", "064", "{}", "1", "200", "/")
	f.Fuzz(func(t *testing.T, set uint8, enable, group, depth, railMap, credit, heartbeat, root string) {
		values := []string{enable, group, depth, railMap, credit, heartbeat, root}
		e := env{}
		for i, name := range allEnvVars {
			if set&(1<<i) != 0 {
				e[name] = values[i]
			}
		}
		cfg, errs := FromEnv(e.lookup)
		seen := map[string]bool{}
		for _, err := range errs {
			var ee *EnvError
			if !errors.As(err, &ee) || seen[ee.Var] || !strings.HasPrefix(err.Error(), ee.Var) {
				t.Fatalf("error %v: want one *EnvError per variable, named first", err)
			}
			seen[ee.Var] = true
			if ee.Set && e[ee.Var] != ee.Value {
				t.Fatalf("error %v reports value %q, env has %q", err, ee.Value, e[ee.Var])
			}
		}
		if len(errs) > 0 && cfg.Enable {
			t.Fatalf("PXN on despite %v", errs)
		}
		if e[contract.EnvEnable] != "1" {
			if cfg.Enable || !equalConfig(cfg, Default()) {
				t.Fatalf("enable %q gave %+v", e[contract.EnvEnable], cfg)
			}
			if wantErr := e[contract.EnvEnable] != "" && e[contract.EnvEnable] != "0"; wantErr != (len(errs) == 1) || len(errs) > 1 {
				t.Fatalf("enable %q: errors %v", e[contract.EnvEnable], errs)
			}
			return
		}

		groupValid := groupOK(e[contract.EnvGroupID])
		if groupValid == seen[contract.EnvGroupID] {
			t.Fatalf("group %q: valid %v, reported %v", e[contract.EnvGroupID], groupValid, seen[contract.EnvGroupID])
		}
		ints := []struct {
			name   string
			lo, hi int
			got    int
		}{
			{contract.EnvInflightDepth, 1, 64, cfg.InflightDepth},
			{contract.EnvCreditTimeout, 1, 600000, int(cfg.CreditTimeout / time.Millisecond)},
			{contract.EnvHeartbeatTimeout, 200, 600000, int(cfg.HeartbeatTimeout / time.Millisecond)},
		}
		for _, c := range ints {
			v := e[c.name]
			if v == "" {
				continue
			}
			n, ok := intOK(v, c.lo, c.hi)
			if ok == seen[c.name] {
				t.Fatalf("%s=%q: valid %v, reported %v", c.name, v, ok, seen[c.name])
			}
			if ok && n != c.got {
				t.Fatalf("%s=%q read as %d", c.name, v, c.got)
			}
		}
		if v := e[contract.EnvRegistryRoot]; v != "" {
			if rootOK(v) == seen[contract.EnvRegistryRoot] {
				t.Fatalf("root %q: valid %v, reported %v", v, rootOK(v), seen[contract.EnvRegistryRoot])
			}
			if rootOK(v) && cfg.RegistryRoot != filepath.Clean(v) {
				t.Fatalf("root %q read as %q", v, cfg.RegistryRoot)
			}
		}
		if !cfg.Enable {
			return
		}
		if !groupOK(cfg.GroupID) || cfg.InflightDepth < 1 || cfg.InflightDepth > 64 ||
			cfg.CreditTimeout < time.Millisecond || cfg.CreditTimeout > 600*time.Second ||
			cfg.HeartbeatTimeout < 200*time.Millisecond || cfg.HeartbeatTimeout > 600*time.Second ||
			!rootOK(cfg.RegistryRoot) || cfg.RegistryRoot != filepath.Clean(cfg.RegistryRoot) {
			t.Fatalf("accepted config out of range: %+v", cfg)
		}
		railMapOK(t, cfg.RailMap)
		// The registry names its folder <root>/mooncake-pxn-<euid>-<group>.
		if dir := filepath.Join(cfg.RegistryRoot, "mooncake-pxn-1000-"+cfg.GroupID); filepath.Dir(dir) != cfg.RegistryRoot {
			t.Fatalf("registry dir %q is not one element below %q", dir, cfg.RegistryRoot)
		}
	})
}
