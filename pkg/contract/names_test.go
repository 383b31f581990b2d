// SPDX-License-Identifier: Apache-2.0

package contract

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

var (
	railRE  = regexp.MustCompile(RailNamePattern)
	hcaRE   = regexp.MustCompile(HCANamePattern)
	groupRE = regexp.MustCompile(GroupIDPattern)
)

// TestPatternsMatchConstants keeps each pattern, its character list and its
// length limit saying the same thing.
func TestPatternsMatchConstants(t *testing.T) {
	for _, tc := range []struct {
		pattern, chars string
		max            int
	}{
		{RailNamePattern, RailNameChars, MaxRailName},
		{HCANamePattern, HCANameChars, MaxHCAName},
		{GroupIDPattern, GroupIDChars, MaxGroupID},
	} {
		if want := fmt.Sprintf("^[%s]{1,%d}$", tc.chars, tc.max); tc.pattern != want {
			t.Errorf("pattern %s, want %s", tc.pattern, want)
		}
	}
}

// TestStrategyNamesAccepted lists a name of every shape a rail strategy can
// produce, at its longest.
func TestStrategyNamesAccepted(t *testing.T) {
	for _, name := range []string{
		"rail0", "rail1023",
		"10.1.0.0/24", "255.255.255.255/32", "0.0.0.0/1",
		"fd00:1:2:3::/64", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
		"fe80:0000:0000:0000", "fe80:0000:0000:0007",
		"rail-a", "east_0.spine-2",
	} {
		if err := ValidateRailName(name); err != nil {
			t.Errorf("rail name %q: %v", name, err)
		}
	}
}

func TestValidate(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	tests := []struct {
		name     string
		validate func(string) error
		in       string
		wantErr  string
	}{
		{"rail", ValidateRailName, "10.1.0.0/24", ""},
		{"rail", ValidateRailName, long(48), ""},
		{"rail", ValidateRailName, long(49), "length 49 not in 1..48"},
		{"rail", ValidateRailName, "", "length 0 not in 1..48"},
		{"rail", ValidateRailName, "rail 0", `byte 4 (' ') not in [A-Za-z0-9_.:/-]`},
		{"rail", ValidateRailName, `r"`, `byte 1 ('"') not in`},
		{"rail", ValidateRailName, `r\`, `byte 1 ('\\') not in`},
		{"rail", ValidateRailName, "r\x00", `byte 1 ('\x00') not in`},
		{"rail", ValidateRailName, "ré", `byte 1 ('\u00c3') not in`},
		{"hca", ValidateHCAName, "mlx5_0", ""},
		{"hca", ValidateHCAName, long(56), ""},
		{"hca", ValidateHCAName, long(57), "length 57 not in 1..56"},
		{"hca", ValidateHCAName, "mlx5/0", `byte 4 ('/') not in [A-Za-z0-9_.-]`},
		{"hca", ValidateHCAName, "mlx5:0", `byte 4 (':') not in`},
		{"group", ValidateGroupID, "k8s", ""},
		{"group", ValidateGroupID, "...", ""},
		{"group", ValidateGroupID, long(64), ""},
		{"group", ValidateGroupID, long(65), "length 65 not in 1..64"},
		{"group", ValidateGroupID, "", "length 0 not in 1..64"},
		{"group", ValidateGroupID, ".", `"." and ".." are not group ids`},
		{"group", ValidateGroupID, "..", `"." and ".." are not group ids`},
		{"group", ValidateGroupID, "a/b", `byte 1 ('/') not in [A-Za-z0-9_.-]`},
		{"group", ValidateGroupID, "a:b", `byte 1 (':') not in`},
	}
	for _, tc := range tests {
		t.Run(tc.name+"/"+tc.in, func(t *testing.T) {
			err := tc.validate(tc.in)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("%q: %v", tc.in, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("%q: err = %v, want one containing %q", tc.in, err, tc.wantErr)
			}
		})
	}
}

// FuzzValidateMatchesPatterns checks the hand-written validators against the
// published patterns: what the engine accepts is exactly what the CRD and
// the chart accept.
func FuzzValidateMatchesPatterns(f *testing.F) {
	for _, s := range []string{"", "rail0", "10.1.0.0/24", "fe80:0000:0000:0000", ".", "..", "a b", "\xff", strings.Repeat("x", 60)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidateRailName(s) == nil, railRE.MatchString(s); got != want {
			t.Fatalf("rail name %q: accepted %v, pattern %v", s, got, want)
		}
		if got, want := ValidateHCAName(s) == nil, hcaRE.MatchString(s); got != want {
			t.Fatalf("HCA name %q: accepted %v, pattern %v", s, got, want)
		}
		if got, want := ValidateGroupID(s) == nil, groupRE.MatchString(s) && s != "." && s != ".."; got != want {
			t.Fatalf("group id %q: accepted %v, pattern %v", s, got, want)
		}
	})
}

func TestEnvNames(t *testing.T) {
	seen := map[string]bool{}
	for _, name := range []string{EnvEnable, EnvGroupID, EnvInflightDepth, EnvRailMap, EnvCreditTimeout, EnvHeartbeatTimeout, EnvRegistryRoot, EnvCopyMode} {
		if !strings.HasPrefix(name, EnvPrefix) || len(name) == len(EnvPrefix) || seen[name] {
			t.Errorf("variable %q: want a distinct name below %s", name, EnvPrefix)
		}
		seen[name] = true
	}
	for _, r := range []struct {
		name        string
		lo, def, hi int64
	}{
		{EnvInflightDepth, MinInflightDepth, DefaultInflightDepth, MaxInflightDepth},
		{EnvCreditTimeout, int64(MinCreditTimeout), int64(DefaultCreditTimeout), int64(MaxCreditTimeout)},
		{EnvHeartbeatTimeout, int64(MinHeartbeatTimeout), int64(DefaultHeartbeatTimeout), int64(MaxHeartbeatTimeout)},
	} {
		if r.lo <= 0 || r.lo > r.def || r.def > r.hi {
			t.Errorf("%s: default %d outside %d..%d", r.name, r.def, r.lo, r.hi)
		}
	}
}
