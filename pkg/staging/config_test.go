package staging

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
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

var enabled = env{EnvEnable: "1", EnvGroupID: "job-7"}

var allEnvVars = []string{EnvEnable, EnvGroupID, EnvInflightDepth, EnvRailMap, EnvCreditTimeout, EnvHeartbeatTimeout, EnvRegistryRoot}

func TestConfigDefaults(t *testing.T) {
	cfg, errs := ConfigFromEnv(env{}.lookup)
	if len(errs) != 0 {
		t.Fatalf("errors with nothing set: %v", errs)
	}
	want := Config{
		InflightDepth:    4,
		CreditTimeout:    1000 * time.Millisecond,
		HeartbeatTimeout: 3000 * time.Millisecond,
		RegistryRoot:     "/dev/shm",
	}
	if !equalConfig(cfg, want) {
		t.Fatalf("config = %+v, want %+v", cfg, want)
	}

	cfg, errs = ConfigFromEnv(enabled.lookup)
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
		EnvGroupID:          "../../etc",
		EnvInflightDepth:    "-5",
		EnvRailMap:          "[not json",
		EnvCreditTimeout:    "soon",
		EnvHeartbeatTimeout: "0",
		EnvRegistryRoot:     "relative",
	}
	for _, enable := range []*string{nil, ptr(""), ptr("0")} {
		e := garbage
		name := "unset"
		if enable != nil {
			e = garbage.with(EnvEnable, *enable)
			name = strconv.Quote(*enable)
		}
		t.Run(name, func(t *testing.T) {
			var looked []string
			cfg, errs := ConfigFromEnv(func(v string) (string, bool) {
				looked = append(looked, v)
				return e.lookup(v)
			})
			if len(errs) != 0 || !equalConfig(cfg, DefaultConfig()) {
				t.Fatalf("config %+v, errors %v; want defaults and no error", cfg, errs)
			}
			if len(looked) != 1 || looked[0] != EnvEnable {
				t.Fatalf("looked up %v, want only %s", looked, EnvEnable)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestConfigEnable(t *testing.T) {
	for _, v := range []string{"true", "false", "TRUE", "yes", "on", "01", "00", " 1", "1 ", "2", "-1", "+1", "1\n", "０"} {
		t.Run(strconv.Quote(v), func(t *testing.T) {
			cfg, errs := ConfigFromEnv(enabled.with(EnvEnable, v).lookup)
			if cfg.Enable || len(errs) != 1 {
				t.Fatalf("enable %q: config %+v, errors %v; want PXN off and one error", v, cfg, errs)
			}
			checkEnvError(t, errs[0], EnvEnable, v)
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
		{"group 1 byte", enabled.with(EnvGroupID, "a"), "", func(c Config) bool { return c.GroupID == "a" }},
		{"group 64 bytes", enabled.with(EnvGroupID, long), "", func(c Config) bool { return c.GroupID == long }},
		{"group every class", enabled.with(EnvGroupID, "Job_1.x-Y"), "", func(c Config) bool { return c.GroupID == "Job_1.x-Y" }},
		{"group three dots", enabled.with(EnvGroupID, "..."), "", func(c Config) bool { return c.GroupID == "..." }},
		{"group 65 bytes", enabled.with(EnvGroupID, long+"a"), EnvGroupID, nil},
		{"group dot", enabled.with(EnvGroupID, "."), EnvGroupID, nil},
		{"group dot dot", enabled.with(EnvGroupID, ".."), EnvGroupID, nil},
		{"group slash", enabled.with(EnvGroupID, "a/b"), EnvGroupID, nil},
		{"group space", enabled.with(EnvGroupID, "a b"), EnvGroupID, nil},
		{"group non-ASCII", enabled.with(EnvGroupID, "jöb"), EnvGroupID, nil},
		{"group NUL", enabled.with(EnvGroupID, "a\x00"), EnvGroupID, nil},

		{"depth default", enabled, "", func(c Config) bool { return c.InflightDepth == 4 }},
		{"depth empty", enabled.with(EnvInflightDepth, ""), "", func(c Config) bool { return c.InflightDepth == 4 }},
		{"depth 1", enabled.with(EnvInflightDepth, "1"), "", func(c Config) bool { return c.InflightDepth == 1 }},
		{"depth 64", enabled.with(EnvInflightDepth, "64"), "", func(c Config) bool { return c.InflightDepth == 64 }},
		{"depth leading zeros", enabled.with(EnvInflightDepth, "007"), "", func(c Config) bool { return c.InflightDepth == 7 }},
		{"depth 0", enabled.with(EnvInflightDepth, "0"), EnvInflightDepth, nil},
		{"depth 65", enabled.with(EnvInflightDepth, "65"), EnvInflightDepth, nil},
		{"depth negative", enabled.with(EnvInflightDepth, "-1"), EnvInflightDepth, nil},
		{"depth plus sign", enabled.with(EnvInflightDepth, "+4"), EnvInflightDepth, nil},
		{"depth space", enabled.with(EnvInflightDepth, " 4"), EnvInflightDepth, nil},
		{"depth fraction", enabled.with(EnvInflightDepth, "4.0"), EnvInflightDepth, nil},
		{"depth hex", enabled.with(EnvInflightDepth, "0x10"), EnvInflightDepth, nil},
		{"depth underscore", enabled.with(EnvInflightDepth, "1_0"), EnvInflightDepth, nil},
		{"depth huge", enabled.with(EnvInflightDepth, "99999999999999999999999"), EnvInflightDepth, nil},

		{"credit default", enabled, "", func(c Config) bool { return c.CreditTimeout == time.Second }},
		{"credit 1", enabled.with(EnvCreditTimeout, "1"), "", func(c Config) bool { return c.CreditTimeout == time.Millisecond }},
		{"credit 600000", enabled.with(EnvCreditTimeout, "600000"), "", func(c Config) bool { return c.CreditTimeout == 10*time.Minute }},
		{"credit 0", enabled.with(EnvCreditTimeout, "0"), EnvCreditTimeout, nil},
		{"credit 600001", enabled.with(EnvCreditTimeout, "600001"), EnvCreditTimeout, nil},
		{"credit with unit", enabled.with(EnvCreditTimeout, "1s"), EnvCreditTimeout, nil},
		{"credit 2^32", enabled.with(EnvCreditTimeout, "4294967296"), EnvCreditTimeout, nil},

		{"heartbeat default", enabled, "", func(c Config) bool { return c.HeartbeatTimeout == 3*time.Second }},
		{"heartbeat 200", enabled.with(EnvHeartbeatTimeout, "200"), "", func(c Config) bool { return c.HeartbeatTimeout == 200*time.Millisecond }},
		{"heartbeat 600000", enabled.with(EnvHeartbeatTimeout, "600000"), "", func(c Config) bool { return c.HeartbeatTimeout == 10*time.Minute }},
		{"heartbeat 199", enabled.with(EnvHeartbeatTimeout, "199"), EnvHeartbeatTimeout, nil},
		{"heartbeat equal to the period", enabled.with(EnvHeartbeatTimeout, "100"), EnvHeartbeatTimeout, nil},
		{"heartbeat 600001", enabled.with(EnvHeartbeatTimeout, "600001"), EnvHeartbeatTimeout, nil},
		{"heartbeat negative", enabled.with(EnvHeartbeatTimeout, "-3000"), EnvHeartbeatTimeout, nil},

		{"root default", enabled, "", func(c Config) bool { return c.RegistryRoot == "/dev/shm" }},
		{"root empty", enabled.with(EnvRegistryRoot, ""), "", func(c Config) bool { return c.RegistryRoot == "/dev/shm" }},
		{"root absolute", enabled.with(EnvRegistryRoot, "/run/pxn/slots/3"), "", func(c Config) bool { return c.RegistryRoot == "/run/pxn/slots/3" }},
		{"root cleaned", enabled.with(EnvRegistryRoot, "/run//pxn/./x/../"), "", func(c Config) bool { return c.RegistryRoot == "/run/pxn" }},
		{"root slash", enabled.with(EnvRegistryRoot, "/"), "", func(c Config) bool { return c.RegistryRoot == "/" }},
		{"root 1024 bytes", enabled.with(EnvRegistryRoot, "/"+strings.Repeat("d", 1023)), "", func(c Config) bool { return len(c.RegistryRoot) == 1024 }},
		{"root relative", enabled.with(EnvRegistryRoot, "dev/shm"), EnvRegistryRoot, nil},
		{"root dot", enabled.with(EnvRegistryRoot, "./shm"), EnvRegistryRoot, nil},
		{"root NUL", enabled.with(EnvRegistryRoot, "/dev/\x00shm"), EnvRegistryRoot, nil},
		{"root 1025 bytes", enabled.with(EnvRegistryRoot, "/"+strings.Repeat("d", 1024)), EnvRegistryRoot, nil},

		{"rail map unset", enabled, "", func(c Config) bool { return c.RailMap == nil }},
		{"rail map", enabled.with(EnvRailMap, `{"mlx5_0":"rail0","mlx5_1":"rail1"}`), "", func(c Config) bool {
			return maps.Equal(c.RailMap, map[string]string{"mlx5_0": "rail0", "mlx5_1": "rail1"})
		}},
		{"rail map empty object", enabled.with(EnvRailMap, " {} "), "", func(c Config) bool { return c.RailMap == nil }},
		{"rail map array", enabled.with(EnvRailMap, `["mlx5_0"]`), EnvRailMap, nil},
		{"rail map duplicate", enabled.with(EnvRailMap, `{"mlx5_0":"a","mlx5_0":"b"}`), EnvRailMap, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, errs := ConfigFromEnv(tc.env.lookup)
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
			if !equalConfigExcept(cfg, DefaultConfig(), tc.bad) {
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
		"unset": enabled.without(EnvGroupID),
		"empty": enabled.with(EnvGroupID, ""),
	} {
		t.Run(name, func(t *testing.T) {
			cfg, errs := ConfigFromEnv(e.lookup)
			if cfg.Enable || len(errs) != 1 {
				t.Fatalf("config %+v, errors %v; want PXN off and one error", cfg, errs)
			}
			want := "MC_PXN_GROUP_ID is not set: required when MC_PXN_ENABLE=1"
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
		{enabled.with(EnvEnable, "true"), `MC_PXN_ENABLE="true": want "0" or "1"`},
		{enabled.with(EnvInflightDepth, "65"), `MC_PXN_INFLIGHT_DEPTH="65": out of range 1..64`},
		{enabled.with(EnvInflightDepth, "four"), `MC_PXN_INFLIGHT_DEPTH="four": not a decimal integer; want 1..64`},
		{enabled.with(EnvCreditTimeout, "0"), `MC_PXN_CREDIT_TIMEOUT_MS="0": out of range 1..600000`},
		{enabled.with(EnvHeartbeatTimeout, "150"), `MC_PXN_HEARTBEAT_TIMEOUT_MS="150": out of range 200..600000`},
		{enabled.with(EnvRegistryRoot, "shm"), `MC_PXN_REGISTRY_ROOT="shm": not an absolute path`},
		{enabled.with(EnvGroupID, "a:b"), `MC_PXN_GROUP_ID="a:b": byte 1 (':') not in [A-Za-z0-9_.-]`},
		{enabled.with(EnvRailMap, `{"mlx5_0":1}`), `MC_PXN_RAIL_MAP="{\"mlx5_0\":1}": rail map: HCA "mlx5_0" maps to a number, want a string`},
	}
	for _, tc := range tests {
		_, errs := ConfigFromEnv(tc.env.lookup)
		if len(errs) != 1 || errs[0].Error() != tc.want {
			t.Errorf("errors %q, want [%q]", errs, tc.want)
		}
	}

	huge := `{"mlx5_0":"` + strings.Repeat("x", 70<<10) + `"}`
	_, errs := ConfigFromEnv(enabled.with(EnvRailMap, huge).lookup)
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
		EnvEnable:           "1",
		EnvInflightDepth:    "0",
		EnvRailMap:          "{",
		EnvCreditTimeout:    "250",
		EnvHeartbeatTimeout: "9999999",
		EnvRegistryRoot:     "tmp",
	}
	var warned []error
	cfg := Load(e.lookup, func(err error) { warned = append(warned, err) })
	if cfg.Enable {
		t.Fatal("PXN on despite invalid values")
	}
	want := []string{EnvGroupID, EnvInflightDepth, EnvRailMap, EnvHeartbeatTimeout, EnvRegistryRoot}
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

func TestConfigRegistryDir(t *testing.T) {
	cfg, errs := ConfigFromEnv(enabled.with(EnvRegistryRoot, "/run/pxn/slots/2/").lookup)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if got, want := cfg.RegistryDir(1000), "/run/pxn/slots/2/mooncake-pxn-1000-job-7"; got != want {
		t.Fatalf("RegistryDir = %q, want %q", got, want)
	}
	cfg, _ = ConfigFromEnv(enabled.with(EnvGroupID, "...").lookup)
	if got, want := cfg.RegistryDir(0), "/dev/shm/mooncake-pxn-0-..."; got != want {
		t.Fatalf("RegistryDir = %q, want %q", got, want)
	}
}

func TestParseRailMap(t *testing.T) {
	entries := func(n int) (string, map[string]string) {
		var b strings.Builder
		m := map[string]string{}
		b.WriteByte('{')
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			hca, rail := fmt.Sprintf("mlx5_%d", i), fmt.Sprintf("rail%d", i%8)
			fmt.Fprintf(&b, "%q:%q", hca, rail)
			m[hca] = rail
		}
		b.WriteByte('}')
		return b.String(), m
	}
	text1024, map1024 := entries(1024)
	text1025, _ := entries(1025)
	hca56, rail48 := strings.Repeat("h", 56), strings.Repeat("r", 48)
	tests := []struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		{"", nil, ""},
		{" \t\n", nil, ""},
		{"{}", nil, ""},
		{`{"mlx5_0":"rail0"}`, map[string]string{"mlx5_0": "rail0"}, ""},
		{" {\n \"mlx5_0\" : \"rail0\" ,\n \"mlx5_1\":\"rail0\" }\n", map[string]string{"mlx5_0": "rail0", "mlx5_1": "rail0"}, ""},
		{`{"ml\u00785_0":"r.a-i_L9"}`, map[string]string{"mlx5_0": "r.a-i_L9"}, ""},
		{`{"` + hca56 + `":"` + rail48 + `"}`, map[string]string{hca56: rail48}, ""},
		{text1024, map1024, ""},

		{`{"mlx5_0":"a","mlx5_0":"b"}`, nil, `duplicate HCA name "mlx5_0"`},
		{`{"mlx5_0":"a","mlx\u0035_0":"a"}`, nil, `duplicate HCA name "mlx5_0"`},
		{text1025, nil, "more than 1024 entries"},
		{`[]`, nil, "not a JSON object (starts with an array)"},
		{`"mlx5_0"`, nil, "not a JSON object (starts with a string)"},
		{`null`, nil, "not a JSON object (starts with null)"},
		{`7`, nil, "not a JSON object (starts with a number)"},
		{`true`, nil, "not a JSON object (starts with a boolean)"},
		{`{"a":1}`, nil, `HCA "a" maps to a number`},
		{`{"a":null}`, nil, `HCA "a" maps to null`},
		{`{"a":true}`, nil, `HCA "a" maps to a boolean`},
		{`{"a":{"b":"c"}}`, nil, `HCA "a" maps to an object`},
		{`{"a":["b"]}`, nil, `HCA "a" maps to an array`},
		{`{"":"rail0"}`, nil, `HCA name "": length 0 not in 1..56`},
		{`{"mlx5_0":""}`, nil, `rail name "": length 0 not in 1..48`},
		{`{"` + hca56 + `h":"r"}`, nil, "length 57 not in 1..56"},
		{`{"h":"` + rail48 + `r"}`, nil, "length 49 not in 1..48"},
		{`{"mlx5/0":"r"}`, nil, `HCA name "mlx5/0": byte 4 ('/') not in`},
		{`{"m":"rail 0"}`, nil, `rail name "rail 0": byte 4 (' ') not in`},
		{`{"m\u00e9":"r"}`, nil, "byte 1 ('\\u00c3') not in"},
		{`{"m":"r\u0000"}`, nil, `byte 1 ('\x00') not in`},
		{`{"a":"b"} x`, nil, "data after the JSON object"},
		{`{"a":"b"}{}`, nil, "data after the JSON object"},
		{`{"a":"b",}`, nil, "invalid JSON"},
		{`{"a":"b"`, nil, "unexpected EOF"},
		{`{`, nil, "unexpected EOF"},
		{`{"a" "b"}`, nil, "invalid JSON"},
		{`{a:"b"}`, nil, "invalid JSON"},
		{`{"a":"b"]`, nil, "invalid JSON"},
		{"\xef\xbb\xbf{}", nil, "invalid JSON"},
		{"\v{}", nil, "invalid JSON"},
		{`{"a":"b"}` + strings.Repeat(" ", MaxRailMapBytes), nil, "exceeds 65536"},
	}
	for _, tc := range tests {
		name := tc.in
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run(name, func(t *testing.T) {
			got, err := ParseRailMap(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if got != nil {
					t.Fatalf("map %v returned with an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tc.want == nil) || !maps.Equal(got, tc.want) {
				t.Fatalf("map = %#v, want %#v", got, tc.want)
			}
		})
	}
	exact := `{"a":"b"}` + strings.Repeat(" ", MaxRailMapBytes-9)
	if m, err := ParseRailMap(exact); err != nil || m["a"] != "b" {
		t.Fatalf("rail map of exactly %d bytes: %v, %v", len(exact), m, err)
	}
}

func TestCanonicalRail(t *testing.T) {
	m := map[string]string{"mlx5_0": "rail0", "mlx5_3": "rail1"}
	tests := []struct {
		m         map[string]string
		hca, want string
	}{
		{m, "mlx5_0", "rail0"},
		{m, "mlx5_3", "rail1"},
		{m, "mlx5_1", "mlx5_1"},
		{m, "", ""},
		{nil, "mlx5_0", "mlx5_0"},
	}
	for _, tc := range tests {
		if got := CanonicalRail(tc.m, tc.hca); got != tc.want {
			t.Errorf("CanonicalRail(%v, %q) = %q, want %q", tc.m, tc.hca, got, tc.want)
		}
	}
}

func equalConfig(a, b Config) bool {
	return a.Enable == b.Enable && a.GroupID == b.GroupID && a.InflightDepth == b.InflightDepth &&
		maps.Equal(a.RailMap, b.RailMap) && (a.RailMap == nil) == (b.RailMap == nil) &&
		a.CreditTimeout == b.CreditTimeout && a.HeartbeatTimeout == b.HeartbeatTimeout &&
		a.RegistryRoot == b.RegistryRoot
}

// equalConfigExcept compares the fields other than Enable and GroupID, and
// than the one that variable name sets.
func equalConfigExcept(a, b Config, name string) bool {
	a.Enable, a.GroupID, b.Enable, b.GroupID = false, "", false, ""
	switch name {
	case EnvInflightDepth:
		b.InflightDepth = a.InflightDepth
	case EnvRailMap:
		b.RailMap = a.RailMap
	case EnvCreditTimeout:
		b.CreditTimeout = a.CreditTimeout
	case EnvHeartbeatTimeout:
		b.HeartbeatTimeout = a.HeartbeatTimeout
	case EnvRegistryRoot:
		b.RegistryRoot = a.RegistryRoot
	}
	return equalConfig(a, b)
}

var (
	nameRE  = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
	digitRE = regexp.MustCompile(`^[0-9]+$`)
)

func groupOK(v string) bool {
	return len(v) >= 1 && len(v) <= 64 && nameRE.MatchString(v) && v != "." && v != ".."
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
		if len(k) > 56 || len(v) > 48 || !nameRE.MatchString(k) || !nameRE.MatchString(v) {
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
		cfg, errs := ConfigFromEnv(e.lookup)
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
		if e[EnvEnable] != "1" {
			if cfg.Enable || !equalConfig(cfg, DefaultConfig()) {
				t.Fatalf("enable %q gave %+v", e[EnvEnable], cfg)
			}
			if wantErr := e[EnvEnable] != "" && e[EnvEnable] != "0"; wantErr != (len(errs) == 1) || len(errs) > 1 {
				t.Fatalf("enable %q: errors %v", e[EnvEnable], errs)
			}
			return
		}

		groupValid := groupOK(e[EnvGroupID])
		if groupValid == seen[EnvGroupID] {
			t.Fatalf("group %q: valid %v, reported %v", e[EnvGroupID], groupValid, seen[EnvGroupID])
		}
		ints := []struct {
			name   string
			lo, hi int
			got    int
		}{
			{EnvInflightDepth, 1, 64, cfg.InflightDepth},
			{EnvCreditTimeout, 1, 600000, int(cfg.CreditTimeout / time.Millisecond)},
			{EnvHeartbeatTimeout, 200, 600000, int(cfg.HeartbeatTimeout / time.Millisecond)},
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
		if v := e[EnvRegistryRoot]; v != "" {
			if rootOK(v) == seen[EnvRegistryRoot] {
				t.Fatalf("root %q: valid %v, reported %v", v, rootOK(v), seen[EnvRegistryRoot])
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
		if dir := cfg.RegistryDir(1000); filepath.Dir(dir) != cfg.RegistryRoot {
			t.Fatalf("registry dir %q is not one element below %q", dir, cfg.RegistryRoot)
		}
	})
}

func FuzzParseRailMap(f *testing.F) {
	for _, s := range []string{
		"", "{}", `{"mlx5_0":"rail0","mlx5_1":"rail1"}`, `{"a":"b","a":"c"}`, `{"a":1}`,
		`[]`, `{"a":"b"} {}`, `{"\u006d":"r"}`, `{"a":"b",}`, `{"a":{"b":"c"}}`, "\xff",
		`{"a":"\ud800"}`, `{"a":"b"}` + "\x00",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseRailMap(s)
		if err != nil {
			if m != nil {
				t.Fatalf("map %v with error %v", m, err)
			}
			if !strings.HasPrefix(err.Error(), "rail map") {
				t.Fatalf("error %q does not say it is about the rail map", err)
			}
		} else {
			if len(s) > MaxRailMapBytes {
				t.Fatalf("%d bytes accepted", len(s))
			}
			railMapOK(t, m)
			if strings.Trim(s, " \t\r\n") != "" {
				var ref map[string]string
				if jerr := json.Unmarshal([]byte(s), &ref); jerr != nil || !maps.Equal(ref, m) {
					t.Fatalf("accepted %q as %v; encoding/json: %v, %v", s, m, ref, jerr)
				}
			}
		}

		var ref map[string]string
		if json.Unmarshal([]byte(s), &ref) != nil {
			return
		}
		valid := map[string]string{}
		for k, v := range ref {
			if len(valid) < MaxRailMapEntries && len(k) <= 56 && len(v) <= 48 && nameRE.MatchString(k) && nameRE.MatchString(v) {
				valid[k] = v
			}
		}
		text, merr := json.Marshal(valid)
		if merr != nil {
			t.Fatal(merr)
		}
		back, err := ParseRailMap(string(text))
		if err != nil || !maps.Equal(back, valid) {
			t.Fatalf("round trip of %s: %v, %v", text, back, err)
		}
	})
}
