// SPDX-License-Identifier: Apache-2.0

package chart_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/pxn-project/pxn/internal/testtools"
	"github.com/pxn-project/pxn/pkg/contract"
)

// TestSchemaNamesFollowTheContract: the values schema refuses exactly the
// rail names, HCA names and group ids the contract refuses.
func TestSchemaNamesFollowTheContract(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testtools.RepoRoot(), "charts", "pxn", "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	at := func(path ...string) any {
		var v any = schema
		for _, k := range path {
			m, _ := v.(map[string]any)
			v = m[k]
		}
		return v
	}
	for _, tc := range []struct {
		path []string
		want string
	}{
		{[]string{"$defs", "staticTable", "propertyNames", "pattern"}, contract.HCANamePattern},
		{[]string{"$defs", "staticTable", "additionalProperties", "pattern"}, contract.RailNamePattern},
		{[]string{"$defs", "relayPlugin", "properties", "groupID", "pattern"}, contract.GroupIDPattern},
	} {
		if got := at(tc.path...); got != tc.want {
			t.Errorf("values.schema.json %v = %v, want %s", tc.path, got, tc.want)
		}
	}
	if got, _ := json.Marshal(at("$defs", "relayPlugin", "properties", "groupID", "not", "enum")); string(got) != `[".",".."]` {
		t.Errorf("groupID does not refuse . and ..: not.enum = %s", got)
	}
}
