// SPDX-License-Identifier: Apache-2.0

package rail

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/contract"
)

func TestParseStaticTable(t *testing.T) {
	tests := []struct {
		in   string
		want map[string]string
		err  string
	}{
		{`{"mlx5_0": "rail0", "mlx5_3": "10.1.0.0/24"}`, map[string]string{"mlx5_0": "rail0", "mlx5_3": "10.1.0.0/24"}, ""},
		{" {\"a\":\"fe80:0000:0000:0000\"}\n", map[string]string{"a": "fe80:0000:0000:0000"}, ""},
		{`{}`, nil, "empty"},
		{`[]`, nil, "not a JSON object"},
		{``, nil, "empty"},
		{`{"mlx5_0": 1}`, nil, `HCA "mlx5_0" maps to a number, want a string`},
		{`{"mlx5_0": null}`, nil, `HCA "mlx5_0" maps to null`},
		{`{"mlx5_0": "a", "mlx5_0": "b"}`, nil, `duplicate HCA name "mlx5_0"`},
		{`{"mlx5 0": "a"}`, nil, `HCA name "mlx5 0": byte 4`},
		{`{"mlx5_0": "rail 0"}`, nil, `rail name "rail 0": byte 4`},
		{`{"mlx5_0": "a"} {}`, nil, "data after"},
		{`{"mlx5_0": "a"`, nil, "invalid JSON"},
		{`{"mlx5_0": "` + strings.Repeat("r", 48) + `"}`, map[string]string{"mlx5_0": strings.Repeat("r", 48)}, ""},
		{`{"mlx5_0": "` + strings.Repeat("r", 49) + `"}`, nil, "length 49 not in 1..48"},
		{`{"` + strings.Repeat("m", 57) + `": "r"}`, nil, "length 57 not in 1..56"},
	}
	for _, tc := range tests {
		got, err := ParseStaticTable([]byte(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseStaticTable(%q) = %v, %v; want error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseStaticTable(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseStaticTable(f *testing.F) {
	for _, s := range []string{`{"mlx5_0":"rail0"}`, `{"a":"b","c":"d"}`, `{}`, `[1]`, `{"a":"b"}x`, `{"a":{"b":"c"}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		table, err := ParseStaticTable(data)
		if err != nil {
			return
		}
		if len(table) == 0 {
			t.Fatal("accepted an empty table")
		}
		for h, r := range table {
			if contract.ValidateHCAName(h) != nil || contract.ValidateRailName(r) != nil {
				t.Fatalf("accepted %q -> %q", h, r)
			}
		}
		b, err := json.Marshal(table)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseStaticTable(b)
		if err != nil || !reflect.DeepEqual(again, table) {
			t.Fatalf("round trip of %s: %v, %v", b, again, err)
		}
	})
}

func TestNormalizeBusID(t *testing.T) {
	tests := []struct{ in, want string }{
		{"00000000:18:00.0", "0000:18:00.0"},
		{"00000000:9A:00.0", "0000:9a:00.0"},
		{"0000:c9:00.1", "0000:c9:00.1"},
		{"18:00.0", "0000:18:00.0"},
		{"0001:03:1f.7", "0001:03:1f.7"},
		{"00010000:e1:00.0", "10000:e1:00.0"},
		{"0000:18:20.0", ""},
		{"0000:18:00.8", ""},
		{"0000:118:00.0", ""},
		{"0000:18:00", ""},
		{"0000:18:00.0 ", ""},
		{"000000000:18:00.0", ""},
		{"0x00:18:00.0", ""},
		{"", ""},
	}
	for _, tc := range tests {
		got, err := NormalizeBusID(tc.in)
		if (err != nil) != (tc.want == "") || got != tc.want {
			t.Errorf("NormalizeBusID(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func FuzzNormalizeBusID(f *testing.F) {
	for _, s := range []string{"00000000:18:00.0", "18:00.0", "0000:ff:1f.7", "::.", "1:2:3:4.5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := NormalizeBusID(s)
		if err != nil {
			return
		}
		if !isBusID(n) {
			t.Fatalf("NormalizeBusID(%q) = %q, which is not canonical", s, n)
		}
		if busLess(n, n) {
			t.Fatalf("busLess(%q, itself)", n)
		}
	})
}

func TestPortAttributeParsers(t *testing.T) {
	words := map[string]string{"4: ACTIVE": "ACTIVE", "5: LinkUp": "LinkUp", "1: DOWN": "DOWN", "5: ACTIVE_DEFER": "ACTIVE_DEFER",
		"4:": "", "ACTIVE": "", ": ACTIVE": "", "x: ACTIVE": "", "4: ACT IVE": "", "999: ACTIVE": "", "4:ACTIVE": ""}
	for in, want := range words {
		got, ok := portAttrWord(in)
		if got != want || ok != (want != "") {
			t.Errorf("portAttrWord(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	rates := map[string]bool{"400 Gb/sec (4X NDR)": true, "2.5 Gb/sec (1X SDR)": true, "100 Gb/sec": true,
		"fast": false, "0 Gb/sec": false, "NaN Gb/sec": false, "400 Gb/sec 4X": false, " Gb/sec": false, "400Gb/sec": false}
	for in, want := range rates {
		if got := rateOK(in); got != want {
			t.Errorf("rateOK(%q) = %v, want %v", in, got, want)
		}
	}
	gids := map[string]string{
		"fe80:0000:0000:0000:A088:C203:0030:1A19": "fe80:0000:0000:0000:a088:c203:0030:1a19",
		"fe80::1": "", "fe80:0000:0000:0000:a088:c203:0030:1a1": "", "fe80-0000:0000:0000:a088:c203:0030:1a19": "",
		"fe80:0000:0000:0000:a088:c203:0030:1a1g": "",
	}
	for in, want := range gids {
		got, ok := canonicalGID(in)
		if got != want || ok != (want != "") {
			t.Errorf("canonicalGID(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	if ip, ok := v4Mapped("0000:0000:0000:0000:0000:ffff:0a01:0203"); !ok || ip != 0x0a010203 {
		t.Errorf("v4Mapped = %x, %v", ip, ok)
	}
	if _, ok := v4Mapped("fe80:0000:0000:0000:0000:ffff:0a01:0203"); ok {
		t.Error("v4Mapped accepted a link-local GID")
	}
}

func FuzzPortAttributes(f *testing.F) {
	for _, s := range []string{"4: ACTIVE", "400 Gb/sec (4X NDR)", "fe80:0000:0000:0000:a088:c203:0030:1a19", "0000:0000:0000:0000:0000:ffff:0a01:0203"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if w, ok := portAttrWord(s); ok && (w == "" || strings.ContainsAny(w, " :")) {
			t.Fatalf("portAttrWord(%q) = %q", s, w)
		}
		rateOK(s)
		if g, ok := canonicalGID(s); ok {
			if again, ok := canonicalGID(g); !ok || again != g {
				t.Fatalf("canonicalGID not idempotent on %q", s)
			}
			v4Mapped(g)
		}
	})
}
