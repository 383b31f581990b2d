// SPDX-License-Identifier: Apache-2.0

package chart_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSchemaRejects feeds values that values.schema.json must refuse. want is
// a part of helm's message that names the offending value.
func TestSchemaRejects(t *testing.T) {
	h := newHelm(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"devices 0", []string{"--set", "devicePlugin.devices=0"}, "devices"},
		{"devices not a number", []string{"--set-string", "devicePlugin.devices=x"}, "devices"},
		{"devices fractional", []string{"--set-json", "devicePlugin.devices=1.5"}, "devices"},
		{"resync not a duration", []string{"--set", "agent.resync=abc"}, "resync"},
		{"pollInterval in words", []string{"--set", "agent.pollInterval=fast"}, "pollInterval"},
		{"gcGrace without unit", []string{"--set", "devicePlugin.gcGrace=5"}, "gcGrace"},
		{"gcInterval negative", []string{"--set", "devicePlugin.gcInterval=-1s"}, "gcInterval"},
		{"unknown top-level key", []string{"--set", "bogus=1"}, "bogus"},
		{"unknown agent key", []string{"--set", "agent.resyncPeriod=1m"}, "resyncPeriod"},
		{"pullPolicy Sometimes", []string{"--set", "image.pullPolicy=Sometimes"}, "pullPolicy"},
		{"rails strategy foo", []string{"--set", "rails.strategy=foo"}, "strategy"},
		{"per-component railStrategy (before rails:)", []string{"--set", "agent.railStrategy=subnet"}, "railStrategy"},
		{"subnetPrefixLen 33", []string{"--set", "rails.subnetPrefixLen=33"}, "subnetPrefixLen"},
		{"probe not an object", []string{"--set", "agent.livenessProbe=off"}, "livenessProbe"},
		{"plugin health address without port", []string{"--set", "devicePlugin.healthProbeBindAddress=localhost"}, "healthProbeBindAddress"},
		{"cleanup flag not a boolean", []string{"--set-string", "cleanup.removeNodeLabels=yes"}, "removeNodeLabels"},
		{"groupID with slash", []string{"--set", "devicePlugin.groupID=a/b"}, "groupID"},
		{"groupID dot-dot", []string{"--set", "devicePlugin.groupID=.."}, "groupID"},
		{"resourceName without domain", []string{"--set", "devicePlugin.resourceName=relay"}, "resourceName"},
		{"stateDir relative", []string{"--set", "devicePlugin.stateDir=run/pxn"}, "stateDir"},
		{"hostSysPath relative", []string{"--set", "hostSysPath=sys"}, "hostSysPath"},
		{"metrics address without port", []string{"--set", "agent.metricsBindAddress=localhost"}, "metricsBindAddress"},
		{"maxUnavailable 0", []string{"--set", "updateStrategy.maxUnavailable=0"}, "maxUnavailable"},
		{"nodeSelector value not a string", []string{"--set", "nodeSelector.gpu=true"}, "nodeSelector"},
		{"staticTable rail name of 49 bytes", []string{"--set", "rails.strategy=static", "--set", "rails.staticTable.mlx5_0=" + strings.Repeat("r", 49)}, "staticTable"},
		{"staticTable rail name with a space", []string{"--set", "rails.strategy=static", "--set", "rails.staticTable.mlx5_0=rail 0"}, "staticTable"},
		{"staticTable rail not a string", []string{"--set", "rails.strategy=static", "--set", "rails.staticTable.mlx5_0=3"}, "staticTable"},
		{"image digest malformed", []string{"--set", "image.digest=sha256:xyz"}, "digest"},
		{"serviceMonitor interval", []string{"--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.interval=often"}, "interval"},
		{"podMonitor scrapeTimeout", []string{"--set", "podMonitor.enabled=true", "--set", "podMonitor.scrapeTimeout=5"}, "scrapeTimeout"},
		{"rank metric label unknown", []string{"--set", "agent.rankMetrics.labels={node,gpu}"}, "labels"},
		{"rank metric labels empty", []string{"--set-json", "agent.rankMetrics.labels=[]"}, "labels"},
		{"rank metric label twice", []string{"--set", "agent.rankMetrics.labels={rail,rail}"}, "labels"},
		{"rank staleness not a duration", []string{"--set", "agent.rankMetrics.staleAfter=ten"}, "staleAfter"},
		{"dashboard namespace with capitals", []string{"--set", "grafanaDashboard.namespace=Monitoring"}, "namespace"},
		{"alert for not a Prometheus duration", []string{"--set", "prometheusRule.enabled=true", "--set", "prometheusRule.for.staleRelay=1.5m"}, "staleRelay"},
		{"alert window without unit", []string{"--set", "prometheusRule.fallbackWindow=10"}, "fallbackWindow"},
		{"alert threshold negative", []string{"--set", "prometheusRule.fallbackBytesPerSecond=-1"}, "fallbackBytesPerSecond"},
		{"validation node name with capitals", []string{"--set", "nodeValidation.nodes={GPU-1}"}, "nodes"},
		{"validation bytes without unit", []string{"--set", "nodeValidation.bytes=16"}, "bytes"},
		{"validation timeout in words", []string{"--set", "nodeValidation.timeout=long"}, "timeout"},
		{"alert severity with a space", []string{"--set", "prometheusRule.severity=very bad"}, "severity"},
		{"DRA groupID with slash", []string{"--set", "dra.groupID=a/b"}, "groupID"},
		{"unknown DRA key", []string{"--set", "dra.resyncPeriod=1m"}, "/dra/resyncPeriod"},
		{"DRA metrics address without port", []string{"--set", "dra.metricsBindAddress=localhost"}, "metricsBindAddress"},
		{"plugin shm dir relative", []string{"--set", "devicePlugin.shmDir=dev/shm"}, "shmDir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectFailure(t, h, tc.args, tc.want)
		})
	}
}

// TestValidationRejects feeds values that pass the schema but contradict each
// other; templates/validate.yaml must fail naming the values.
func TestValidationRejects(t *testing.T) {
	h := newHelm(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"both components disabled", []string{"--set", "agent.enabled=false", "--set", "devicePlugin.enabled=false"},
			"agent.enabled, devicePlugin.enabled and dra.enabled are all false"},
		{"static without a table", []string{"--set", "rails.strategy=static"},
			"rails.strategy=static needs rails.staticFile or rails.staticTable"},
		{"static file and table", []string{"--set", "rails.strategy=static",
			"--set", "rails.staticFile=/etc/rails.json", "--set", "rails.staticTable.mlx5_0=rail0"},
			"rails.staticFile=/etc/rails.json and rails.staticTable are both set"},
		{"table without static", []string{"--set", "rails.staticTable.mlx5_0=rail0"},
			"rails.strategy=pci-order ignores them"},
		{"registry root relative", []string{"--set", "devicePlugin.containerRegistryRoot=run/pxn"},
			`devicePlugin.containerRegistryRoot="run/pxn" is not an absolute path`},
		{"registry root is /", []string{"--set", "devicePlugin.containerRegistryRoot=/"},
			"devicePlugin.containerRegistryRoot=/"},
		{"state dir equals shm dir", []string{"--set", "devicePlugin.stateDir=/dev/shm/pxn/"},
			"devicePlugin.stateDir and devicePlugin.shmDir are both /dev/shm/pxn/"},
		{"shm dir is host root", []string{"--set", "devicePlugin.shmDir=/"}, "devicePlugin.shmDir=/"},
		{"state dir is the kubelet's plugin dir", []string{"--set", "devicePlugin.stateDir=/var/lib/kubelet/device-plugins"},
			"devicePlugin.stateDir=/var/lib/kubelet/device-plugins is the kubelet's device plugin folder"},
		{"pod-resources socket is a folder", []string{"--set", "devicePlugin.podResourcesSocket=/var/lib/kubelet/pod-resources/"},
			"devicePlugin.podResourcesSocket=/var/lib/kubelet/pod-resources/ names a folder"},
		{"DRA registry root relative", []string{"--set", "dra.enabled=true", "--set", "dra.containerRegistryRoot=run/pxn"},
			`dra.containerRegistryRoot="run/pxn" is not an absolute path`},
		{"DRA CDI folder is the state folder", []string{"--set", "dra.enabled=true", "--set", "dra.cdiDir=/run/pxn-dra/"},
			"dra.cdiDir and dra.stateDir are both /run/pxn-dra/"},
		{"DRA shm dir is host root", []string{"--set", "dra.enabled=true", "--set", "dra.shmDir=/"}, "dra.shmDir=/"},
		{"DRA and device plugin share a shm dir", []string{"--set", "dra.enabled=true", "--set", "dra.shmDir=/dev/shm/pxn"},
			"dra.shmDir and devicePlugin.shmDir are both /dev/shm/pxn"},
		{"service monitor without metrics", []string{"--set", "serviceMonitor.enabled=true", "--set", "agent.metricsBindAddress=0",
			"--set", "devicePlugin.metricsBindAddress=0"}, "serviceMonitor.enabled=true but no enabled component serves metrics"},
		{"pod monitor without metrics", []string{"--set", "podMonitor.enabled=true", "--set", "agent.metricsBindAddress=0",
			"--set", "devicePlugin.metricsAddr="}, "podMonitor.enabled=true but no enabled component serves metrics"},
		{"pod monitor, the DRA driver alone without metrics", []string{"--set", "dra.enabled=true", "--set", "agent.enabled=false",
			"--set", "devicePlugin.enabled=false", "--set", "podMonitor.enabled=true", "--set", "dra.metricsBindAddress=0"},
			"podMonitor.enabled=true but no enabled component serves metrics (dra.metricsBindAddress=0)"},
		{"service monitor without the Services", []string{"--set", "serviceMonitor.enabled=true", "--set", "metricsService.enabled=false"},
			"set metricsService.enabled=true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectFailure(t, h, tc.args, tc.want)
		})
	}
}

func expectFailure(t *testing.T, h *helm, args []string, want string) {
	t.Helper()
	out, err := h.run(h.templateArgs(args)...)
	if err == nil {
		t.Fatalf("helm template %q succeeded, want an error naming %q; rendered %d bytes", args, want, len(out))
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("helm template %q failed without naming %q:\n%v", args, want, err)
	}
}

// TestSchemaSharedDaemonKeys: the node daemons' shared keys are defined once
// ($defs nodeDaemon and relayPlugin) and named once more in the lists that
// let unevaluatedProperties pass them (nodeDaemonKeys, relayPluginKeys); the
// two must name the same keys. A bad value of a shared key is reported alone,
// not with every other key of its block.
func TestSchemaSharedDaemonKeys(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	for _, def := range []string{"nodeDaemon", "relayPlugin"} {
		keys := slices.Sorted(maps.Keys(schema.Defs[def].Properties))
		names := slices.Sorted(maps.Keys(schema.Defs[def+"Keys"].Properties))
		if len(keys) == 0 || !slices.Equal(keys, names) {
			t.Errorf("$defs.%s defines %v, $defs.%sKeys names %v", def, keys, def, names)
		}
	}

	h := newHelm(t)
	for _, args := range [][]string{
		{"--set", "dra.enabled=yes"},
		{"--set", "devicePlugin.groupID=a/b"},
		{"--set", "agent.kubeconfig=relative"},
	} {
		out, err := h.run(h.templateArgs(args)...)
		if err == nil {
			t.Errorf("helm template %q succeeded; rendered %d bytes", args, len(out))
			continue
		}
		if key := args[1][:strings.Index(args[1], "=")]; !strings.Contains(err.Error(), "/"+strings.ReplaceAll(key, ".", "/")) ||
			strings.Count(err.Error(), "false schema") != 0 {
			t.Errorf("helm template %q: want an error at %s alone, got:\n%v", args, key, err)
		}
	}
}
