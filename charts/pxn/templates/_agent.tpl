{{/*
pxn.daemon.agent: the agent's own parts of its DaemonSet, one per .part (pod,
args, env, mounts, volumes), for daemonsets.yaml. The rank metrics read the
device plugin's folders, named by pxn.devicePluginFolders.
*/}}
{{- define "pxn.daemon.agent" -}}
{{- $v := .values -}}
{{- $root := .root -}}
{{- $ranks := $v.rankMetrics.enabled -}}
{{- $p := include "pxn.devicePluginFolders" $root | fromYaml -}}
{{- $podResourcesDir := dir $p.podResourcesSocket -}}
{{- if eq .part "pod" }}
{{- if and (eq $v.nvml.mode "runtime") $v.nvml.runtimeClassName (not $root.Values.runtimeClassName) }}
runtimeClassName: {{ $v.nvml.runtimeClassName }}
{{- end }}
{{- else if eq .part "args" }}
- run
{{ include "pxn.discoveryArgs" $root }}
- --resync={{ $v.resync }}
- --poll-interval={{ $v.pollInterval }}
{{- include "pxn.endpointArgs" . }}
{{- if $ranks }}
- --shm-dir={{ $p.shmDir }}
- --state-dir={{ $p.stateDir }}
- --pod-resources-socket={{ $p.podResourcesSocket }}
- --resource-name={{ $p.resourceName }}
- --rank-metric-labels={{ join "," $v.rankMetrics.labels }}
- --rank-stale-after={{ $v.rankMetrics.staleAfter }}
{{- else }}
- --shm-dir=
{{- end }}
{{- else if eq .part "env" }}
{{- if eq $v.nvml.mode "runtime" }}
- name: NVIDIA_VISIBLE_DEVICES
  value: all
- name: NVIDIA_DRIVER_CAPABILITIES
  value: utility
{{- else if eq $v.nvml.mode "hostPath" }}
- name: LD_LIBRARY_PATH
  value: /usr/local/lib:/usr/local/nvidia/lib64
{{- end }}
{{- else if eq .part "mounts" }}
{{- if eq $v.nvml.mode "hostPath" }}
- name: nvml-lib
  mountPath: /usr/local/nvidia/lib64
  readOnly: true
{{- end }}
{{- if $ranks }}
{{- /* At their host paths, as in the device plugin. */}}
- name: shm
  mountPath: {{ $p.shmDir }}
  readOnly: true
- name: state
  mountPath: {{ $p.stateDir }}
  readOnly: true
- name: pod-resources
  mountPath: {{ $podResourcesDir }}
  readOnly: true
{{- end }}
{{- else if eq .part "volumes" }}
{{- if eq $v.nvml.mode "hostPath" }}
- name: nvml-lib
  hostPath:
    path: {{ $v.nvml.hostLibraryDir }}
    type: Directory
{{- end }}
{{- if $ranks }}
- name: shm
  hostPath:
    path: {{ $p.shmDir }}
    type: DirectoryOrCreate
- name: state
  hostPath:
    path: {{ $p.stateDir }}
    type: DirectoryOrCreate
- name: pod-resources
  hostPath:
    path: {{ $podResourcesDir }}
    type: DirectoryOrCreate
{{- end }}
{{- end }}
{{- end -}}
