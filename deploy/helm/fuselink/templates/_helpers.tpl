{{/* Names, labels and small decisions shared by the templates. */}}

{{- define "fuselink.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fuselink.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fuselink.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fuselink.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fuselink.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "fuselink.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "fuselink.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fuselink.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "fuselink.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The probe kind (see probes.mode in values.yaml): http, tcp, grpc or exec. */}}
{{- define "fuselink.probeKind" -}}
{{- $mode := .Values.probes.mode -}}
{{- if eq $mode "auto" -}}
{{- if .Values.metrics.webConfig -}}tcp{{- else -}}http{{- end -}}
{{- else if and (has $mode (list "grpc" "exec")) .Values.tls.enabled -}}
{{- fail (printf "probes.mode=%s dials gRPC health without a client certificate, which mutual TLS refuses: use auto, http or tcp, or tls.enabled=false" $mode) -}}
{{- else if and (eq $mode "http") .Values.metrics.webConfig -}}
{{- fail "probes.mode=http: with metrics.webConfig the kubelet cannot scrape /metrics (no client certificate, no password): use auto or tcp" -}}
{{- else -}}
{{- $mode -}}
{{- end -}}
{{- end -}}

{{/* The agent's private runtime directory and its handle socket, inside hostDir. */}}
{{- define "fuselink.runtimeDir" -}}
{{- printf "%s/%s" .Values.handleSocket.hostDir .Values.handleSocket.runtimeSubdir -}}
{{- end -}}

{{- define "fuselink.handleSocket" -}}
{{- printf "%s/%s" (include "fuselink.runtimeDir" .) .Values.handleSocket.name -}}
{{- end -}}

{{/* The AccessPolicy as the agent reads it: protobuf JSON, the proto's field names. */}}
{{- define "fuselink.accessPolicyJson" -}}
{{- $bindings := list -}}
{{- range .Values.accessPolicy.bindings -}}
{{- $bindings = append $bindings (dict "identity" .identity "roles" .roles) -}}
{{- end -}}
{{- dict "peer_identity" .Values.accessPolicy.peerIdentity "bindings" $bindings | toPrettyJson -}}
{{- end -}}
