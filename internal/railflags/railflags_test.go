// SPDX-License-Identifier: Apache-2.0

package railflags

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/pxn-project/pxn/pkg/rail"
)

// TestValidate: every value rail.Discover would refuse at run time is
// refused at parse time, naming the flag; the defaults pass.
func TestValidate(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"--rail-strategy=subnet", "--subnet-prefix-len=16"}, ""},
		{[]string{"--rail-strategy=static", "--static-file=/etc/rails.json"}, ""},
		{[]string{"--subnet-prefix-len=40"}, ""},
		{[]string{"--rail-strategy=nearest"}, `--rail-strategy="nearest": want pci-order, subnet or static`},
		{[]string{"--rail-strategy=static"}, "--rail-strategy=static needs --static-file"},
		{[]string{"--rail-strategy=subnet", "--subnet-prefix-len=0"}, "--subnet-prefix-len=0: want 1..32"},
		{[]string{"--rail-strategy=subnet", "--subnet-prefix-len=33"}, "--subnet-prefix-len=33: want 1..32"},
	}
	for _, tc := range tests {
		var f Flags
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		f.Bind(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := f.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
	var f Flags
	f.Bind(pflag.NewFlagSet("test", pflag.ContinueOnError))
	want := rail.Options{NodeRoot: "/", Strategy: rail.StrategyPCIOrder, SubnetPrefixLen: rail.DefaultSubnetPrefixLen}
	if got := f.Discoverer().Options; got != want {
		t.Errorf("default options %+v, want %+v", got, want)
	}
}
