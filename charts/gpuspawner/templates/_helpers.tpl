{{/* The hub's namespace: hub.namespace, else this release's namespace. */}}
{{- define "gpuspawner.hubNamespace" -}}
{{- default .Release.Namespace .Values.hub.namespace -}}
{{- end -}}

{{/* Name of the ClusterRole and its binding: gpuspawner:<namespace>:<serviceaccount>. */}}
{{- define "gpuspawner.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride -}}
{{- else -}}
{{- printf "gpuspawner:%s:%s" (include "gpuspawner.hubNamespace" .) .Values.hub.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpuspawner.labels" -}}
app.kubernetes.io/name: gpuspawner
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: hub-rbac
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- range $key, $value := .Values.commonLabels }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* Name of the monitoring objects (dashboard ConfigMap, PrometheusRule, ServiceMonitors). */}}
{{- define "gpuspawner.monitoringName" -}}
{{- printf "%s-gpuspawner" .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuspawner.monitoringLabels" -}}
app.kubernetes.io/name: gpuspawner
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: monitoring
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- range $key, $value := .Values.commonLabels }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* The per-pod GPU probe's DaemonSet, ServiceAccount, Roles and PodMonitor. */}}
{{- define "gpuspawner.probeName" -}}
{{- printf "%s-gpuspawner-probe" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The namespaces the probe may name pods in, comma-separated: probe.namespaces, else the hub's. */}}
{{- define "gpuspawner.probeNamespaces" -}}
{{- if .Values.probe.namespaces -}}
{{- join "," .Values.probe.namespaces -}}
{{- else -}}
{{- include "gpuspawner.hubNamespace" . -}}
{{- end -}}
{{- end -}}

{{- define "gpuspawner.probeLabels" -}}
app.kubernetes.io/name: gpuspawner
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: probe
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- range $key, $value := .Values.commonLabels }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end -}}
