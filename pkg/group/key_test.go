// SPDX-License-Identifier: Apache-2.0

package group

import (
	"testing"

	"github.com/pxn-project/pxn/pkg/contract"
)

func TestKeyIsUnambiguous(t *testing.T) {
	type triple struct{ ns, source, id string }
	pairs := []struct {
		name string
		a, b triple
	}{
		{"namespace/identity boundary", triple{"a", SourcePodName, "bc"}, triple{"ab", SourcePodName, "c"}},
		{"slash inside a field", triple{"a/b", SourcePodName, "c"}, triple{"a", SourcePodName, "b/c"}},
		{"separator-like bytes", triple{"a\x00", SourceLabel, "b"}, triple{"a", SourceLabel, "\x00b"}},
		{"source boundary", triple{"ns", "label", "x"}, triple{"ns", "labe", "lx"}},
		{"label vs uid", triple{"ns", SourceLabel, "x"}, triple{"ns", SourceUID, "x"}},
		{"label vs pod name", triple{"ns", SourceLabel, "x"}, triple{"ns", SourcePodName, "x"}},
		{"same label, other namespace", triple{"team-a", SourceLabel, "job"}, triple{"team-b", SourceLabel, "job"}},
		{"empty fields", triple{"", SourceLabel, "ab"}, triple{"ab", SourceLabel, ""}},
	}
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			ka := Key(p.a.ns, p.a.source, p.a.id)
			kb := Key(p.b.ns, p.b.source, p.b.id)
			if ka == kb {
				t.Fatalf("Key%q == Key%q == %s", p.a, p.b, ka)
			}
			for _, k := range []string{ka, kb} {
				if !contract.IsGroupKey(k) {
					t.Fatalf("key %q is not 16 lower-case hex digits", k)
				}
			}
		})
	}
}

func TestKeyIsStable(t *testing.T) {
	// Keys name directories that outlive the plugin process; a release that
	// changed them would orphan every live group on upgrade.
	if got, want := Key("default", SourceLabel, "job-1"), "c94935b066f42b16"; got != want {
		t.Fatalf("Key(default, label, job-1) = %s, want %s", got, want)
	}
}

func FuzzKey(f *testing.F) {
	f.Add("a", "bc", "ab", "c")
	f.Add("a/b", "c", "a", "b/c")
	f.Add("", "", "", "")
	f.Fuzz(func(t *testing.T, ns1, id1, ns2, id2 string) {
		k1 := Key(ns1, SourceLabel, id1)
		k2 := Key(ns2, SourceLabel, id2)
		if !contract.IsGroupKey(k1) || !contract.IsGroupKey(k2) {
			t.Fatalf("malformed key %q or %q", k1, k2)
		}
		if (ns1 == ns2 && id1 == id2) != (k1 == k2) {
			t.Fatalf("(%q,%q)→%s vs (%q,%q)→%s", ns1, id1, k1, ns2, id2, k2)
		}
	})
}
