// SPDX-License-Identifier: Apache-2.0

package group

import (
	"testing"

	"github.com/pxn-project/pxn/pkg/contract"
)

func TestMemberEnvIsTheContract(t *testing.T) {
	m := Member{GroupID: "k8s", RegistryRoot: "/run/pxn"}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	railMap := `{"mlx5_0":"rail0"}`
	env := m.Env(railMap)
	if _, err := contract.ParseRailMap(env[contract.EnvRailMap]); err != nil {
		t.Fatalf("rail map the engine would refuse: %v", err)
	}
	want := map[string]string{
		contract.EnvEnable:       contract.EnableOn,
		contract.EnvRailMap:      railMap,
		contract.EnvGroupID:      "k8s",
		contract.EnvRegistryRoot: "/run/pxn",
	}
	if len(env) != len(want) {
		t.Fatalf("env %v, want %v", env, want)
	}
	for k, v := range want {
		if env[k] != v {
			t.Fatalf("%s=%q, want %q", k, env[k], v)
		}
	}
	if got := m.Mount("/dev/shm/pxn/groups/0123456789abcdef"); got.ContainerPath != "/run/pxn" || got.ReadOnly {
		t.Fatalf("mount %+v", got)
	}
}

func TestMemberValidateNamesValue(t *testing.T) {
	for _, m := range []Member{{GroupID: "", RegistryRoot: "/run/pxn"}, {GroupID: "k8s", RegistryRoot: "relative"}} {
		if err := m.Validate(); err == nil {
			t.Fatalf("%+v accepted", m)
		}
	}
}
