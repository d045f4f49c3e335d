{{/* The chart's name, or nameOverride. */}}
{{- define "tokenmill.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* RELEASE-NAME, or the release name alone when it already contains the chart's name. */}}
{{- define "tokenmill.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tokenmill.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tokenmill.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tokenmill.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tokenmill.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tokenmill
{{- end }}

{{- define "tokenmill.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tokenmill.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the database URL, or "" for SQLite on the state volume. */}}
{{- define "tokenmill.databaseSecret" -}}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecret }}
{{- else if .Values.database.url }}
{{- printf "%s-database" (include "tokenmill.fullname" .) }}
{{- end }}
{{- end }}

{{/* The Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "" (credentials from elsewhere, e.g. IAM). */}}
{{- define "tokenmill.s3Secret" -}}
{{- if .Values.storage.s3.existingSecret }}
{{- .Values.storage.s3.existingSecret }}
{{- else if .Values.storage.s3.accessKeyId }}
{{- printf "%s-s3" (include "tokenmill.fullname" .) }}
{{- end }}
{{- end }}

{{- define "tokenmill.apiKeySecret" -}}
{{- if .Values.apiKey.existingSecret }}
{{- .Values.apiKey.existingSecret }}
{{- else if .Values.apiKey.value }}
{{- printf "%s-api-key" (include "tokenmill.fullname" .) }}
{{- end }}
{{- end }}

{{- define "tokenmill.stateClaim" -}}
{{- default (printf "%s-state" (include "tokenmill.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}
