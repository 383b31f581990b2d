{{/*
pxn.daemon.agent: the agent's own parts of its DaemonSet, one per .part (pod,
args, env, mounts, securityContext, volumes), for daemonsets.yaml. The rank
metrics read the node plugins' group folders and the owner records in them
(the device plugin's, named by pxn.devicePluginFolders, and the DRA driver's
when it is enabled).
*/}}
{{- define "pxn.daemon.agent" -}}
{{- $v := .values -}}
{{- $root := .root -}}
{{- $ranks := $v.rankMetrics.enabled -}}
{{- $p := include "pxn.devicePluginFolders" $root | fromYaml -}}
{{- $shmDirs := list $p.shmDir -}}
{{- if $root.Values.dra.enabled }}{{ $shmDirs = append $shmDirs $root.Values.dra.shmDir | uniq }}{{ end -}}
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
- --shm-dirs={{ join "," $shmDirs }}
- --pod-resources-socket={{ $p.podResourcesSocket }}
- --rank-metric-labels={{ join "," $v.rankMetrics.labels }}
- --rank-stale-after={{ $v.rankMetrics.staleAfter }}
{{- else }}
- --shm-dirs=
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
{{- /* At their host paths, as in the node plugins. */}}
{{- range $i, $dir := $shmDirs }}
- name: shm-{{ $i }}
  mountPath: {{ $dir }}
  readOnly: true
{{- end }}
- name: pod-resources
  mountPath: {{ $podResourcesDir }}
  readOnly: true
{{- end }}
{{- else if eq .part "securityContext" }}
{{- if $ranks }}
{{- /* Workloads of any uid write the registries (folders 0700, files 0600). */}}
runAsUser: 0
runAsGroup: 0
capabilities:
  drop: ["ALL"]
  add: ["DAC_READ_SEARCH"]
{{- else }}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: ["ALL"]
{{- end }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
{{- else if eq .part "volumes" }}
{{- if eq $v.nvml.mode "hostPath" }}
- name: nvml-lib
  hostPath:
    path: {{ $v.nvml.hostLibraryDir }}
    type: Directory
{{- end }}
{{- if $ranks }}
{{- range $i, $dir := $shmDirs }}
- name: shm-{{ $i }}
  hostPath:
    path: {{ $dir }}
    type: DirectoryOrCreate
{{- end }}
- name: pod-resources
  hostPath:
    path: {{ $podResourcesDir }}
    type: DirectoryOrCreate
{{- end }}
{{- end }}
{{- end -}}
