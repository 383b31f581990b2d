// SPDX-License-Identifier: Apache-2.0

package v1alpha1_test

import (
	"encoding/json"
	"reflect"
	"sort"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
)

func TestSchemeKnowsTypes(t *testing.T) {
	s := runtime.NewScheme()
	if err := pxnv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"PxnRailMap", "PxnRailMapList"} {
		if !s.Recognizes(pxnv1alpha1.GroupVersion.WithKind(kind)) {
			t.Errorf("scheme does not know %s", kind)
		}
	}
}

// The status carries `pxn-agent discover`'s JSON: its field names must stay
// those of the discovered layout.
func TestStatusJSONFieldNames(t *testing.T) {
	tests := []struct {
		v    any
		want []string
	}{
		{pxnv1alpha1.PxnRailMapStatus{}, []string{"agentVersion", "conditions", "gpuCount", "gpuSource", "gpus", "hcaCount", "hcas", "pairs", "railMap", "rails", "strategy"}},
		{pxnv1alpha1.GPU{}, []string{"distance", "hca", "index", "name", "numaNode", "pciBusID", "rail", "uuid"}},
		{pxnv1alpha1.HCA{}, []string{"linkLayer", "name", "netdev", "numaNode", "pciBusID", "physState", "port", "rail", "rate", "state"}},
		{pxnv1alpha1.Pair{}, []string{"distance", "gpu", "hca"}},
	}
	for _, tc := range tests {
		t.Run(reflect.TypeOf(tc.v).Name(), func(t *testing.T) {
			full := reflect.New(reflect.TypeOf(tc.v)).Elem()
			fill(full)
			b, err := json.Marshal(full.Interface())
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			var got []string
			for k := range m {
				got = append(got, k)
			}
			sort.Strings(got)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("JSON fields %v, want %v", got, tc.want)
			}
		})
	}
}

// fill sets every field to a non-zero value so that omitempty hides nothing.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	case reflect.String:
		v.SetString("x")
	case reflect.Int32, reflect.Int64, reflect.Int:
		v.SetInt(1)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		m.SetMapIndex(reflect.ValueOf("k"), reflect.ValueOf("v"))
		v.Set(m)
	}
}
