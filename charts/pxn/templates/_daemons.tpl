{{/*
pxn.nodeDaemonTable: the node daemons the chart installs, in the order they
are rendered. Every template that deals with the daemons as a set (their
DaemonSets, ServiceAccounts, metrics Services, the PodMonitor, validation,
NOTES) ranges over pxn.nodeDaemons, built from this table. Adding a daemon is
one entry here; beside it the daemon brings what is its own: the template
pxn.daemon.<name> of its DaemonSet's parts (see _agent.tpl), its block of
values (in values.schema.json, $defs.nodeDaemon and its own keys) and its
RBAC.
  name:   the component label, the suffix of its objects' names, the
          container's name
  key:    its block of values, .Values.<key>
  binary: the command in the image
*/}}
{{- define "pxn.nodeDaemonTable" -}}
- {name: agent, key: agent, binary: pxn-agent}
- {name: device-plugin, key: devicePlugin, binary: pxn-device-plugin}
- {name: dra-plugin, key: dra, binary: pxn-dra-plugin}
{{- end -}}

{{/*
pxn.nodeDaemons: pxn.nodeDaemonTable as YAML (read it with fromYamlArray),
each entry completed from its values: enabled, and the two endpoints'
addresses (metricsAddr, healthAddr) as the binary gets them, with metrics and
health true when the endpoint is served.
*/}}
{{- define "pxn.nodeDaemons" -}}
{{- $out := list -}}
{{- range $d := include "pxn.nodeDaemonTable" . | fromYamlArray -}}
{{- $v := index $.Values $d.key -}}
{{- $metricsAddr := include "pxn.endpointAddr" (hasKey $v "metricsAddr" | ternary $v.metricsAddr $v.metricsBindAddress) -}}
{{- $healthAddr := include "pxn.endpointAddr" $v.healthProbeBindAddress -}}
{{- $out = append $out (merge (dict "enabled" $v.enabled "metricsAddr" $metricsAddr "healthAddr" $healthAddr "metrics" (ne $metricsAddr "0") "health" (ne $healthAddr "0")) $d) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
pxn.endpointAddr: a --metrics-bind-address or --health-probe-bind-address
value from its value: "0" (or 0, or empty) turns the endpoint off and is
passed as 0. An endpoint is on exactly when this is not "0". (metricsAddr,
the device plugin's former name of metricsBindAddress, is read instead when
a values file sets it; pxn.nodeDaemons picks it.)
*/}}
{{- define "pxn.endpointAddr" -}}
{{- default "0" (toString .) -}}
{{- end -}}

{{/*
pxn.discoveryArgs: the flags of rail discovery, which every node daemon
takes: the host root where /host/sys is mounted, and .Values.rails.
*/}}
{{- define "pxn.discoveryArgs" -}}
- --host-root=/host
{{ include "pxn.railArgs" . }}
{{- end -}}

{{/*
pxn.endpointArgs: (dict "root" $ "daemon" $d "values" $v) --kubeconfig,
the two endpoints' addresses and, with metricsAuth, --metrics-secure, which
every node daemon takes.
*/}}
{{- define "pxn.endpointArgs" -}}
{{- with .values.kubeconfig }}
- --kubeconfig={{ . }}
{{- end }}
- --metrics-bind-address={{ .daemon.metricsAddr }}
- --health-probe-bind-address={{ .daemon.healthAddr }}
{{- if and .daemon.metrics .root.Values.metricsAuth.enabled }}
- --metrics-secure
{{- end }}
{{- end -}}

{{/*
pxn.sysfsFolders: the parts of the host's sysfs (below hostSysPath) that
rail discovery reads, each mounted read-only at the same place below
/host/sys. class holds the infiniband class (a folder of its own comes and
goes with ib_core: a bind mount of it would go stale when a driver container
reloads the module) and adds nothing devices does not show; bus/pci lists
the PCI functions and the nvidia driver's; devices is where every class and
bus link resolves. The rest of sysfs (fs, kernel, firmware, module, power)
stays out of the pods.
*/}}
{{- define "pxn.sysfsFolders" -}}
- {name: host-sys-class, path: class}
- {name: host-sys-bus-pci, path: bus/pci}
- {name: host-sys-devices, path: devices}
{{- end -}}

{{/*
pxn.securityContext: (dict "values" $v "own" <its template> "in" <that
template's context>) the container's securityContext: the daemon's
securityContext value when set, used as it is, else the least the daemon
needs, from part securityContext of its own template.
*/}}
{{- define "pxn.securityContext" -}}
{{- with .values.securityContext }}
{{- toYaml . }}
{{- else }}
{{- include .own (set .in "part" "securityContext") | trim }}
{{- end }}
{{- end -}}
