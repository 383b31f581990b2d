// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/relay"
)

func TestStaticDirectoryResolve(t *testing.T) {
	d, err := NewStaticDirectory([]StaticTarget{
		{Session: "node-a:kv", Addr: "10.0.0.1:7000", HCAs: []string{"mlx5_3"}, Ranges: []StaticRange{{Addr: 0x1000, Len: 0x1000}, {Addr: 1 << 60, Len: 4096}}},
		{Session: "node-b:kv", HCAs: []string{"mlx5_0", "mlx5_1"}, Ranges: []StaticRange{{Addr: 0, Len: 1}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		session string
		dst     uint64
		want    relay.Target
		wantErr error
	}{
		{"node-a:kv", 0x1000, relay.Target{HCAs: []string{"mlx5_3"}, Ranges: []relay.Range{{Addr: 0x1000, Len: 0x1000}, {Addr: 1 << 60, Len: 4096}}}, nil},
		{"node-a:kv", 1<<60 + 4095, relay.Target{HCAs: []string{"mlx5_3"}, Ranges: []relay.Range{{Addr: 0x1000, Len: 0x1000}, {Addr: 1 << 60, Len: 4096}}}, nil},
		{"node-a:kv", 0x2000, relay.Target{}, ErrOutOfRange},
		{"node-a:kv", 0xfff, relay.Target{}, ErrOutOfRange},
		{"node-b:kv", 0, relay.Target{HCAs: []string{"mlx5_0", "mlx5_1"}, Ranges: []relay.Range{{Addr: 0, Len: 1}}}, nil},
		{"node-c:kv", 0, relay.Target{}, ErrUnknownSession},
	}
	for _, tt := range tests {
		got, err := d.Resolve(tt.session, tt.dst)
		if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
			t.Errorf("Resolve(%q, %#x) error %v, want %v", tt.session, tt.dst, err, tt.wantErr)
			continue
		}
		if tt.wantErr == nil && !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Resolve(%q, %#x) = %+v, want %+v", tt.session, tt.dst, got, tt.want)
		}
	}
	if got := d.Addresses(); !reflect.DeepEqual(got, map[string]string{"node-a:kv": "10.0.0.1:7000"}) {
		t.Errorf("Addresses = %v", got)
	}
}

func TestStaticDirectoryRejects(t *testing.T) {
	ok := func() StaticTarget {
		return StaticTarget{Session: "s", HCAs: []string{"mlx5_0"}, Ranges: []StaticRange{{Addr: 0, Len: 10}}}
	}
	tests := []struct {
		name   string
		mutate func(*StaticTarget)
		want   string
	}{
		{"empty session", func(t *StaticTarget) { t.Session = "" }, "session name of 0 bytes"},
		{"long session", func(t *StaticTarget) { t.Session = strings.Repeat("x", 257) }, "session name of 257 bytes"},
		{"no HCA", func(t *StaticTarget) { t.HCAs = nil }, "no HCA"},
		{"empty HCA", func(t *StaticTarget) { t.HCAs = []string{"mlx5_0", ""} }, "empty HCA"},
		{"no range", func(t *StaticTarget) { t.Ranges = nil }, "no range"},
		{"empty range", func(t *StaticTarget) { t.Ranges[0].Len = 0 }, "invalid range"},
		{"range wraps", func(t *StaticTarget) { t.Ranges[0] = StaticRange{Addr: math.MaxUint64, Len: 2} }, "invalid range"},
		{"ranges overlap", func(t *StaticTarget) { t.Ranges = append(t.Ranges, StaticRange{Addr: 9, Len: 1}) }, "overlaps"},
	}
	for _, tt := range tests {
		bad := ok()
		tt.mutate(&bad)
		_, err := NewStaticDirectory([]StaticTarget{bad})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	if _, err := NewStaticDirectory([]StaticTarget{ok(), ok()}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate session: %v", err)
	}
	top := ok()
	top.Ranges = []StaticRange{{Addr: math.MaxUint64, Len: 1}}
	if _, err := NewStaticDirectory([]StaticTarget{top}); err != nil {
		t.Errorf("the last byte of the address space: %v", err)
	}
}

func TestStaticDirectoryJSON(t *testing.T) {
	targets := []StaticTarget{
		{Session: "a", Addr: "127.0.0.1:9", HCAs: []string{"mlx5_2"}, Ranges: []StaticRange{{Addr: math.MaxUint64 - 4095, Len: 4096}}},
		{Session: "b", HCAs: []string{"mlx5_0"}, Ranges: []StaticRange{{Addr: 1, Len: 2}, {Addr: 100, Len: 1}}},
	}
	d, err := NewStaticDirectory(targets)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	back, err := LoadStaticDirectory(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("LoadStaticDirectory(%s): %v", b, err)
	}
	if !reflect.DeepEqual(back.Targets(), targets) {
		t.Fatalf("round trip: %+v, want %+v", back.Targets(), targets)
	}
	if _, err := back.Resolve("a", math.MaxUint64); err != nil {
		t.Fatalf("a uint64 above 2^53 did not survive JSON: %v", err)
	}
	for _, bad := range []string{
		``,
		`[]`,
		`{"targets": [{"session": "a", "hcas": ["x"], "ranges": [{"addr": 1, "len": 1}]}]} {}`,
		`{"targets": [{"session": "a", "hcas": ["x"], "ranges": [{"addr": 1, "len": 1, "lkey": 7}]}]}`,
		`{"targets": [{"session": "a", "hcas": ["x"], "ranges": [{"addr": -1, "len": 1}]}]}`,
		`{"targets": [{"session": "a", "hcas": ["x"], "ranges": [{"addr": 18446744073709551616, "len": 1}]}]}`,
		`{"targets": [{"session": "a", "hcas": ["x"], "ranges": []}]}`,
		`{"tragets": []}`,
	} {
		if _, err := LoadStaticDirectory(strings.NewReader(bad)); err == nil {
			t.Errorf("LoadStaticDirectory(%q) accepted", bad)
		}
	}
	if d, err := LoadStaticDirectory(strings.NewReader(`{"targets": []}` + "\n")); err != nil || len(d.Targets()) != 0 {
		t.Errorf("empty directory: %v", err)
	}
}

func FuzzLoadStaticDirectory(f *testing.F) {
	f.Add([]byte(`{"targets": [{"session": "a", "addr": "h:1", "hcas": ["x"], "ranges": [{"addr": 1, "len": 1}]}]}`))
	f.Add([]byte(`{"targets": []}`))
	f.Add([]byte(`{"targets": [{"session": "a", "hcas": ["x", "y"], "ranges": [{"addr": 18446744073709551615, "len": 1}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := LoadStaticDirectory(bytes.NewReader(b))
		if err != nil {
			return
		}
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatalf("marshal a loaded directory: %v", err)
		}
		again, err := LoadStaticDirectory(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("reload %s: %v", out, err)
		}
		if !reflect.DeepEqual(again.Targets(), d.Targets()) {
			t.Fatalf("round trip changed the directory: %s", out)
		}
		for _, tg := range d.Targets() {
			for _, r := range tg.Ranges {
				if _, err := d.Resolve(tg.Session, r.Addr+(r.Len-1)); err != nil {
					t.Fatalf("Resolve(%q, last byte of %+v): %v", tg.Session, r, err)
				}
			}
		}
	})
}
