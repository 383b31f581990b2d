// SPDX-License-Identifier: Apache-2.0

package contract

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
)

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
		{`{"mlx5_0":"10.1.0.0/24","mlx5_2":"fe80:0000:0000:0000"}`, map[string]string{"mlx5_0": "10.1.0.0/24", "mlx5_2": "fe80:0000:0000:0000"}, ""},
		{`{"m":"r\u0022"}`, nil, `byte 1 ('"') not in`},
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

func railMapOK(t *testing.T, m map[string]string) {
	t.Helper()
	if len(m) > MaxRailMapEntries {
		t.Fatalf("rail map of %d entries accepted", len(m))
	}
	for k, v := range m {
		if !hcaRE.MatchString(k) || !railRE.MatchString(v) {
			t.Fatalf("rail map entry %q → %q accepted", k, v)
		}
	}
}

func TestEncodeRailMap(t *testing.T) {
	tests := []struct {
		in      map[string]string
		want    string
		wantErr string
	}{
		{nil, "{}", ""},
		{map[string]string{}, "{}", ""},
		{map[string]string{"mlx5_2": "rail1", "mlx5_0": "rail0"}, `{"mlx5_0":"rail0","mlx5_2":"rail1"}`, ""},
		{map[string]string{"mlx5_0": "10.1.0.0/24", "mlx5_1": "fd00:1:2:3::/64"}, `{"mlx5_0":"10.1.0.0/24","mlx5_1":"fd00:1:2:3::/64"}`, ""},
		{map[string]string{"mlx5_0": ""}, "", `rail map: HCA "mlx5_0": rail name "": length 0`},
		{map[string]string{"mlx5_0": strings.Repeat("r", 49)}, "", "length 49 not in 1..48"},
		{map[string]string{"mlx5_0": `a"b`}, "", `byte 1 ('"') not in`},
		{map[string]string{"mlx5/0": "rail0"}, "", `HCA name "mlx5/0": byte 4 ('/')`},
		{map[string]string{"": "rail0"}, "", `HCA name "": length 0`},
	}
	for _, tc := range tests {
		got, err := EncodeRailMap(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("EncodeRailMap(%v) = %q, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("EncodeRailMap(%v) = %q, %v; want %q", tc.in, got, err, tc.want)
			continue
		}
		if ref, _ := json.Marshal(orEmpty(tc.in)); string(ref) != got {
			t.Errorf("EncodeRailMap(%v) = %s, encoding/json says %s", tc.in, got, ref)
		}
	}
	big := map[string]string{}
	for i := range MaxRailMapEntries + 1 {
		big[fmt.Sprintf("mlx5_%d", i)] = "rail0"
	}
	if _, err := EncodeRailMap(big); err == nil || !strings.Contains(err.Error(), "more than 1024") {
		t.Errorf("EncodeRailMap of %d entries: %v", len(big), err)
	}
	delete(big, "mlx5_0")
	text, err := EncodeRailMap(big)
	if err != nil {
		t.Fatalf("EncodeRailMap of %d entries: %v", len(big), err)
	}
	if back, err := ParseRailMap(text); err != nil || !maps.Equal(back, big) {
		t.Fatalf("%d entries did not read back: %v", len(big), err)
	}
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
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
			if text, err := EncodeRailMap(m); err != nil {
				t.Fatalf("EncodeRailMap(%v) of an accepted map: %v", m, err)
			} else if back, err := ParseRailMap(text); err != nil || !maps.Equal(back, m) {
				t.Fatalf("EncodeRailMap(%v) = %s, read back as %v, %v", m, text, back, err)
			}
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
			if len(valid) < MaxRailMapEntries && hcaRE.MatchString(k) && railRE.MatchString(v) {
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
