{{/*
pxn.daemon.dra-plugin: the DRA driver's own parts of its DaemonSet, as
pxn.daemon.agent's. Host folders are mounted at their host paths: the CDI
specs the driver writes name host paths (the claims' group folders) that the
runtime resolves on the host.
*/}}
{{- define "pxn.daemon.dra-plugin" -}}
{{- $v := .values -}}
{{- /* Its own folder of the kubelet's plugins folder, not the other
drivers' sockets beside it. */}}
{{- $dataDir := printf "%s/pxn.io" (trimSuffix "/" $v.kubeletPluginsDir) -}}
{{- if eq .part "args" }}
- --kubelet-plugins-dir={{ $v.kubeletPluginsDir }}
- --kubelet-registry-dir={{ $v.kubeletRegistryDir }}
- --cdi-dir={{ $v.cdiDir }}
{{ include "pxn.discoveryArgs" .root }}
- --state-dir={{ $v.stateDir }}
- --shm-dir={{ $v.shmDir }}
- --container-registry-root={{ $v.containerRegistryRoot }}
- --group-id={{ $v.groupID }}
{{- include "pxn.endpointArgs" . }}
- --rediscover-interval={{ $v.rediscoverInterval }}
{{- else if eq .part "mounts" }}
- name: kubelet-plugins
  mountPath: {{ $dataDir }}
- name: kubelet-registry
  mountPath: {{ $v.kubeletRegistryDir }}
- name: cdi
  mountPath: {{ $v.cdiDir }}
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
- name: kubelet-plugins
  hostPath:
    path: {{ $dataDir }}
    type: DirectoryOrCreate
- name: kubelet-registry
  hostPath:
    path: {{ $v.kubeletRegistryDir }}
    type: DirectoryOrCreate
- name: cdi
  hostPath:
    path: {{ $v.cdiDir }}
    type: DirectoryOrCreate
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
