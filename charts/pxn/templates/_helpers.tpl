{{- define "pxn.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Object names get a component suffix of up to 14 characters, hence 40. */}}
{{- define "pxn.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pxn.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "pxn.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pxn
{{- end -}}

{{/* pxn.selectorLabels: (dict "root" $ "component" "agent") */}}
{{- define "pxn.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pxn.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pxn.componentLabels" -}}
{{ include "pxn.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pxn.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* pxn.serviceAccountName: (dict "root" $ "component" "agent" "values" .Values.agent) */}}
{{- define "pxn.serviceAccountName" -}}
{{- if .values.serviceAccount.create -}}
{{- default (printf "%s-%s" (include "pxn.fullname" .root) .component) .values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The port of a host:port address. */}}
{{- define "pxn.port" -}}
{{- regexFind "[0-9]+$" . -}}
{{- end -}}

{{- define "pxn.railsConfigMap" -}}
{{- printf "%s-rails" (include "pxn.fullname" .) -}}
{{- end -}}

{{/* Where a staticTable ConfigMap key is mounted in a container. */}}
{{- define "pxn.railsMountPath" -}}/etc/pxn/rails{{- end -}}

{{/* pxn.railArgs: the rail discovery flags, from .Values.rails. */}}
{{- define "pxn.railArgs" -}}
{{- $r := .Values.rails -}}
- --rail-strategy={{ $r.strategy }}
{{- if eq $r.strategy "subnet" }}
- --subnet-prefix-len={{ $r.subnetPrefixLen }}
{{- end }}
{{- if eq $r.strategy "static" }}
{{- if $r.staticFile }}
- --static-file={{ $r.staticFile }}
{{- else }}
- --static-file={{ include "pxn.railsMountPath" . }}/rails.json
{{- end }}
{{- end }}
{{- end -}}

{{/* pxn.railsTable: the rails ConfigMap is mounted. */}}
{{- define "pxn.railsTable" -}}
{{- if and (eq .Values.rails.strategy "static") .Values.rails.staticTable -}}true{{- end -}}
{{- end -}}

{{/* Scheduling fields shared by both DaemonSets. */}}
{{- define "pxn.podScheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "pxn.updateStrategy" -}}
updateStrategy:
  type: RollingUpdate
  rollingUpdate:
    maxSurge: 0
    maxUnavailable: {{ .Values.updateStrategy.maxUnavailable }}
{{- end -}}


{{/*
pxn.verifyNodes: the nodes helm test checks, as a YAML list:
nodeValidation.nodes, or else every node that the chart's nodeSelector
selects, looked up when the chart is installed or upgraded (none under helm
template).
*/}}
{{- define "pxn.verifyNodes" -}}
{{- $nodes := .Values.nodeValidation.nodes -}}
{{- if not $nodes -}}
{{- $found := lookup "v1" "Node" "" "" -}}
{{- range $n := (get (default dict $found) "items" | default list) -}}
{{- $labels := default dict $n.metadata.labels -}}
{{- $match := true -}}
{{- range $k, $v := $.Values.nodeSelector -}}
{{- if ne (toString (get $labels $k)) (toString $v) }}{{ $match = false }}{{ end -}}
{{- end -}}
{{- if $match }}{{ $nodes = append $nodes $n.metadata.name }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toYaml $nodes -}}
{{- end -}}

{{- /*
Whether to render a node-restriction policy, for a component (dict: root,
enabled, who) whose RBAC lets it write objects of every node: "true" when
the chart grants that RBAC and rbac.nodeRestriction is on, where the API
server serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy or
the Kubernetes version is below the chart's oldest (helm template's default
without --kube-version, v1.20: an unknown cluster, which gets the policy).
Without the policy the install fails, saying why, unless
rbac.acknowledgeNoNodeRestriction is set.
*/ -}}
{{- define "pxn.nodeRestriction" -}}
{{- $root := .root -}}
{{- $rbac := $root.Values.rbac -}}
{{- if and $rbac.create .enabled -}}
{{- $version := $root.Capabilities.KubeVersion.Version -}}
{{- $served := or ($root.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (semverCompare ">=1.30.0-0" $version) (semverCompare "<1.28.0-0" $version) -}}
{{- if not $rbac.nodeRestriction -}}
{{- if not $rbac.acknowledgeNoNodeRestriction -}}
{{- fail (printf "rbac.nodeRestriction=false leaves %s with nothing confining it to its own node: set rbac.acknowledgeNoNodeRestriction=true as well to install without the policy" .who) -}}
{{- end -}}
{{- else if $served -}}
true
{{- else if not $rbac.acknowledgeNoNodeRestriction -}}
{{- fail (printf "Kubernetes %s does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (1.30 and later do), the node-restriction policy that confines %s to its own node: upgrade the cluster, or pass --api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy where it is served, or set rbac.acknowledgeNoNodeRestriction=true to install without it" $version .who) -}}
{{- end -}}
{{- end -}}
{{- end -}}
