// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeRelayConfig: opaque parameters are a user's bytes. Whatever
// they are, decoding returns, and what it accepts is exactly the header.
func FuzzDecodeRelayConfig(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"pxn.io/v1alpha1","kind":"RelayConfig"}`))
	f.Add([]byte(`{"apiVersion":"pxn.io/v1alpha1","kind":"RelayConfig","rings":4}`))
	f.Add([]byte(`{"apiVersion":"pxn.io/v1alpha1","kind":"RelayConfig"} {}`))
	f.Add([]byte(`{"APIVERSION":"pxn.io/v1alpha1","kind":"RelayConfig"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := decodeRelayConfig(raw)
		if err != nil {
			return
		}
		if c.APIVersion != ConfigAPIVersion || c.Kind != ConfigKind {
			t.Fatalf("accepted %q as %+v", raw, c)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw, &fields); err != nil {
			t.Fatalf("accepted %q, which is not one JSON object: %v", raw, err)
		}
		for k := range fields {
			if k != "apiVersion" && k != "kind" {
				t.Fatalf("accepted %q with field %q", raw, k)
			}
		}
	})
}
