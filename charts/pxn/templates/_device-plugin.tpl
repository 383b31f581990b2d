{{/*
pxn.daemon.device-plugin: the device plugin's own parts of its DaemonSet, as
pxn.daemon.agent's. Host folders are mounted at their host paths: the plugin
hands the kubelet host paths (slot links) that must also be valid inside it.
*/}}
{{- define "pxn.daemon.device-plugin" -}}
{{- $v := .values -}}
{{- $podResourcesDir := dir $v.podResourcesSocket -}}
{{- $podResourcesMounted := ne (clean $podResourcesDir) (clean $v.devicePluginDir) -}}
{{- if eq .part "args" }}
- --resource-name={{ $v.resourceName }}
- --devices={{ $v.devices }}
- --device-plugin-dir={{ $v.devicePluginDir }}
- --pod-resources-socket={{ $v.podResourcesSocket }}
{{ include "pxn.discoveryArgs" .root }}
- --state-dir={{ $v.stateDir }}
- --shm-dir={{ $v.shmDir }}
- --container-registry-root={{ $v.containerRegistryRoot }}
- --group-id={{ $v.groupID }}
{{- include "pxn.endpointArgs" . }}
- --gc-interval={{ $v.gcInterval }}
- --gc-grace={{ $v.gcGrace }}
- --rediscover-interval={{ $v.rediscoverInterval }}
- --pod-lookup-timeout={{ $v.podLookupTimeout }}
{{- else if eq .part "mounts" }}
- name: device-plugins
  mountPath: {{ $v.devicePluginDir }}
{{- if $podResourcesMounted }}
- name: pod-resources
  mountPath: {{ $podResourcesDir }}
  readOnly: true
{{- end }}
- name: state
  mountPath: {{ $v.stateDir }}
- name: shm
  mountPath: {{ $v.shmDir }}
{{- else if eq .part "securityContext" }}
{{- /* Root for the kubelet's folders; DAC_OVERRIDE and FOWNER to collect
group folders that workloads of any uid wrote in. */}}
runAsUser: 0
runAsGroup: 0
capabilities:
  drop: ["ALL"]
  add: ["DAC_OVERRIDE", "FOWNER"]
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
{{- else if eq .part "volumes" }}
- name: device-plugins
  hostPath:
    path: {{ $v.devicePluginDir }}
    type: DirectoryOrCreate
{{- if $podResourcesMounted }}
- name: pod-resources
  hostPath:
    path: {{ $podResourcesDir }}
    type: DirectoryOrCreate
{{- end }}
- name: state
  hostPath:
    path: {{ $v.stateDir }}
    type: DirectoryOrCreate
- name: shm
  hostPath:
    path: {{ $v.shmDir }}
    type: DirectoryOrCreate
{{- end }}
{{- end -}}

{{/*
pxn.devicePluginFolders: what the device plugin publishes on a node for
readers beside it, as YAML: its group folders with their owner records
(shmDir) and the kubelet's PodResources socket it asks (podResourcesSocket).
The agent's rank metrics read these.
*/}}
{{- define "pxn.devicePluginFolders" -}}
{{- $p := .Values.devicePlugin -}}
{{- toYaml (dict "shmDir" $p.shmDir "podResourcesSocket" $p.podResourcesSocket) -}}
{{- end -}}
