// SPDX-License-Identifier: Apache-2.0

package group

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestOwnerRecordRoundTrip(t *testing.T) {
	dir := t.TempDir()
	key := UnkeyedKey("team-a", SourceClaim, "5d1e-uid")
	for _, tc := range []struct {
		id string
		o  Owner
	}{
		{OwnerSlotPrefix + "pxn-relay-03", Owner{Namespace: "team-a", Pods: []string{"a-0"}}},
		{OwnerClaimPrefix + "5d1e-uid", Owner{Namespace: "team-a", Pods: []string{"a-0", "a-1.x"}, Claim: "job4"}},
		{OwnerClaimPrefix + "6e2f-uid", Owner{Namespace: "team-a", Pods: []string{}, Claim: "idle"}},
	} {
		if err := WriteOwner(dir, key, tc.id, tc.o); err != nil {
			t.Fatal(err)
		}
		got, err := ReadOwner(filepath.Join(dir, OwnerRecordName(key, tc.id)))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tc.o) {
			t.Errorf("record %s reads back %+v, want %+v", tc.id, got, tc.o)
		}
	}
	// A second write replaces the first.
	moved := Owner{Namespace: "team-a", Pods: []string{"a-2"}}
	if err := WriteOwner(dir, key, OwnerSlotPrefix+"pxn-relay-03", moved); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadOwner(filepath.Join(dir, OwnerRecordName(key, OwnerSlotPrefix+"pxn-relay-03"))); err != nil || !reflect.DeepEqual(got, moved) {
		t.Errorf("rewritten record reads %+v, %v; want %+v", got, err, moved)
	}
	if err := os.WriteFile(filepath.Join(dir, ".stray.tmp"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	other := UnkeyedKey("team-b", SourceUID, "u")
	if err := WriteOwner(dir, other, OwnerSlotPrefix+"pxn-relay-04", Owner{Namespace: "team-b", Pods: []string{"b-0"}}); err != nil {
		t.Fatal(err)
	}
	names, err := ListOwners(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		key:   {OwnerRecordName(key, OwnerClaimPrefix+"5d1e-uid"), OwnerRecordName(key, OwnerClaimPrefix+"6e2f-uid"), OwnerRecordName(key, OwnerSlotPrefix+"pxn-relay-03")},
		other: {OwnerRecordName(other, OwnerSlotPrefix+"pxn-relay-04")},
	}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("ListOwners = %v, want %v", names, want)
	}
	if err := RemoveOwner(dir, other, OwnerSlotPrefix+"pxn-relay-04"); err != nil {
		t.Fatal(err)
	}
	if err := RemoveOwner(dir, other, OwnerSlotPrefix+"pxn-relay-04"); err != nil {
		t.Errorf("removing a missing record: %v", err)
	}
	if names, _ := ListOwners(dir); len(names[other]) != 0 {
		t.Errorf("removed record still listed: %v", names)
	}
	if names, err := ListOwners(filepath.Join(dir, "absent")); err != nil || len(names) != 0 {
		t.Errorf("ListOwners of a missing folder = %v, %v; want none", names, err)
	}
}

func TestWriteOwnerRefuses(t *testing.T) {
	dir := t.TempDir()
	key := UnkeyedKey("ns", SourceUID, "u")
	good := Owner{Namespace: "ns", Pods: []string{"p"}}
	for _, tc := range []struct {
		name, key, id string
		o             Owner
		want          string
	}{
		{"bad key", "../etc", "slot-1", good, `"../etc"`},
		{"id with a slash", key, "slot-../x", good, `"slot-../x"`},
		{"empty id", key, "", good, `""`},
		{"namespace", key, "slot-1", Owner{Namespace: "Team A"}, `namespace "Team A"`},
		{"pod", key, "slot-1", Owner{Namespace: "ns", Pods: []string{"p/q"}}, `pod "p/q"`},
		{"claim", key, "claim-1", Owner{Namespace: "ns", Claim: "-x"}, `claim "-x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := WriteOwner(dir, tc.key, tc.id, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("WriteOwner(%q, %q, %+v) = %v, want an error naming %s", tc.key, tc.id, tc.o, err, tc.want)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused writes left %d files", len(entries))
	}
}

func TestDecodeOwnerRefuses(t *testing.T) {
	many := `{"version":1,"namespace":"ns","pods":[` + strings.Repeat(`"p",`, MaxOwnerPods) + `"p"]}`
	for _, tc := range []struct {
		name, data, want string
	}{
		{"not JSON", `pods: a-0`, "decode owner record"},
		{"other version", `{"version":2,"namespace":"ns","pods":["p"]}`, "version 2"},
		{"no version", `{"namespace":"ns","pods":["p"]}`, "version 0"},
		{"unknown field", `{"version":1,"namespace":"ns","pods":["p"],"uid":"x"}`, `"uid"`},
		{"trailing data", `{"version":1,"namespace":"ns","pods":["p"]}{}`, "data after the record"},
		{"bad namespace", `{"version":1,"namespace":"NS\u0000","pods":["p"]}`, `namespace "NS\x00"`},
		{"bad pod", `{"version":1,"namespace":"ns","pods":["a b"]}`, `pod "a b"`},
		{"long pod", `{"version":1,"namespace":"ns","pods":["` + strings.Repeat("p", 254) + `"]}`, "pod \"ppp"},
		{"bad claim", `{"version":1,"namespace":"ns","pods":[],"claim":"Job"}`, `claim "Job"`},
		{"too many pods", many, "257 pods"},
		{"too long", strings.Repeat(" ", maxOwnerRecord+1), "bytes, at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := DecodeOwner([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("DecodeOwner = %+v, %v; want an error naming %s", o, err, tc.want)
			}
		})
	}
}

func TestReadOwnerRefusesLinkAndFolder(t *testing.T) {
	dir := t.TempDir()
	key := UnkeyedKey("ns", SourceUID, "u")
	if err := WriteOwner(dir, key, "slot-1", Owner{Namespace: "ns", Pods: []string{"p"}}); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, OwnerRecordName(key, "slot-2"))
	if err := os.Symlink(filepath.Join(dir, OwnerRecordName(key, "slot-1")), link); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadOwner(link); err == nil {
		t.Error("ReadOwner followed a link")
	}
	sub := filepath.Join(dir, OwnerRecordName(key, "slot-3"))
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadOwner(sub); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("ReadOwner of a folder: %v", err)
	}
}

func TestParseOwnerRecordName(t *testing.T) {
	key := UnkeyedKey("ns", SourceUID, "u")
	for name, ok := range map[string]bool{
		OwnerRecordName(key, "slot-pxn-relay-01"):   true,
		OwnerRecordName(key, "claim-0f3c-11"):       true,
		key + ".json":                               false,
		key + "..json":                              false,
		"." + OwnerRecordName(key, "slot-1") + ".x": false,
		key[:15] + "G.slot-1.json":                  false,
		key + ".slot 1.json":                        false,
		key + ".slot-1.json.tmp":                    false,
	} {
		if _, _, got := ParseOwnerRecordName(name); got != ok {
			t.Errorf("ParseOwnerRecordName(%q) ok = %v, want %v", name, got, ok)
		}
	}
}

func FuzzDecodeOwner(f *testing.F) {
	f.Add([]byte(`{"version":1,"namespace":"ns","pods":["a-0"],"claim":"job"}`))
	f.Add([]byte(`{"version":1,"namespace":"ns","pods":[]}`))
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := DecodeOwner(data)
		if err != nil {
			return
		}
		if err := o.Validate(); err != nil {
			t.Fatalf("decoded an owner that does not validate: %+v: %v", o, err)
		}
		again, err := EncodeOwner(o)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", o, err)
		}
		back, err := DecodeOwner(again)
		if err != nil || back.Namespace != o.Namespace || back.Claim != o.Claim || len(back.Pods) != len(o.Pods) {
			t.Fatalf("round trip of %+v: %+v, %v", o, back, err)
		}
	})
}
