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

{{/* "true" when the state folder is a claim: persistence with one pod. Several replicas share nothing but
PostgreSQL, so each has an emptyDir (the scratch of the jobs it runs), and no claim needs ReadWriteMany. */}}
{{- define "tokenmill.stateOnClaim" -}}
{{- if and .Values.persistence.enabled (le (int .Values.replicas) 1) }}true{{ end }}
{{- end }}

{{/* What replicas >= 2 needs, refused with the value to change: PostgreSQL (SQLite is one process's file; the job
processes report to the database, so the replicas share nothing else), the Ray Jobs API (a job's driver on the
cluster, which any replica follows by its submission id) and no state claim (each pod's state folder is its own
emptyDir: see values.yaml, replicas); and, whatever the replicas, the Ray Jobs API needs PostgreSQL (its drivers on
the head report to the database). */}}
{{- define "tokenmill.checkReplicas" -}}
{{- $n := int .Values.replicas }}
{{- if gt $n 1 }}
{{- if not (include "tokenmill.databaseSecret" .) }}
{{- fail (printf "replicas: %d needs PostgreSQL: set database.url (postgresql+psycopg://...) or database.existingSecret; SQLite (database.url empty) is one process's file, so it runs with replicas: 1 only" $n) }}
{{- end }}
{{- if hasPrefix "sqlite" .Values.database.url }}
{{- fail (printf "replicas: %d needs PostgreSQL, not SQLite: database.url is %s; SQLite runs with replicas: 1 only" $n (splitList ":" .Values.database.url | first)) }}
{{- end }}
{{- if not .Values.ray.jobsUrl }}
{{- fail (printf "replicas: %d needs ray.jobsUrl (the Ray Jobs API): without it each job runs as a process of the leading pod, so a rolling update or a lost pod ends the running jobs (each resumed as a new attempt from its finished shards, failed after three losses in a row); through the Jobs API a job's driver runs on the Ray cluster and the next leader follows it by its submission id" $n) }}
{{- end }}
{{- if .Values.persistence.existingClaim }}
{{- fail (printf "replicas: %d gives each pod a state folder of its own (an emptyDir: the scratch of the jobs it runs; the replicas share the database, not this folder): leave persistence.existingClaim empty (it is %s), persistence is for replicas: 1" $n .Values.persistence.existingClaim) }}
{{- end }}
{{- end }}
{{- if and .Values.ray.jobsUrl (or (not (include "tokenmill.databaseSecret" .)) (hasPrefix "sqlite" .Values.database.url)) }}
{{- fail "ray.jobsUrl needs PostgreSQL (database.url or database.existingSecret): the jobs' drivers run on the Ray head and report to the database, and SQLite is a file in this pod the head cannot reach" }}
{{- end }}
{{- end }}

{{/* TOKENMILL_DATABASE_URL from the Secret named by the list's second item ("" for none: SQLite), under the key
the values say: the Deployment reads the release's Secret, the migration Job (a hook, before that exists) its own. */}}
{{- define "tokenmill.databaseEnv" -}}
{{- $ := index . 0 }}
{{- with index . 1 }}
- name: TOKENMILL_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ if $.Values.database.existingSecret }}{{ $.Values.database.existingSecretKey }}{{ else }}database-url{{ end }}
{{- end }}
{{- end }}

{{/* The migration Job's command: Database.migrate with the service's settings (TOKENMILL_DATABASE_URL,
TOKENMILL_DATABASE_SCHEMA), what `tokenmill serve` runs at start, without serving. */}}
{{- define "tokenmill.migrateCommand" -}}
command:
  - python
  - -c
  - >-
    from service.settings import Settings; from service.store.db import Database;
    s = Settings.from_env(); db = Database(s.db_url, schema=s.database_schema); db.migrate(); db.dispose()
{{- end }}
