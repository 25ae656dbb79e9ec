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

{{/* Kubernetes' own gRPC probes exist from 1.24 on (beta, on by default). */}}
{{- define "fuselink.grpcProbes" -}}
{{- if eq .Values.probes.mode "grpc" -}}true
{{- else if eq .Values.probes.mode "exec" -}}
{{- else if semverCompare ">=1.24.0-0" .Capabilities.KubeVersion.Version -}}true
{{- end -}}
{{- end -}}

{{/* The secret holding the agent's certificate, key and CA. */}}
{{- define "fuselink.tlsSecret" -}}
{{- if .Values.tls.secretName -}}
{{- .Values.tls.secretName -}}
{{- else if include "fuselink.certManager" . -}}
{{- printf "%s-tls" (include "fuselink.fullname" .) -}}
{{- else -}}
{{- fail "tls.enabled: the cluster has no cert-manager Certificate CRD (or tls.certManager.enabled is false), so tls.secretName must name an existing kubernetes.io/tls secret" -}}
{{- end -}}
{{- end -}}

{{- define "fuselink.certManager" -}}
{{- if and .Values.tls.enabled .Values.tls.certManager.enabled (.Capabilities.APIVersions.Has "cert-manager.io/v1/Certificate") -}}true{{- end -}}
{{- end -}}

{{- define "fuselink.handleSocket" -}}
{{- printf "%s/%s" .Values.handleSocket.hostDir .Values.handleSocket.name -}}
{{- end -}}
