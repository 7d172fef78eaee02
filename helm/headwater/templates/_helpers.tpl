{{- define "headwater.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "headwater.fullname" -}}
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

{{- define "headwater.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "headwater.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "headwater.selectorLabels" -}}
app.kubernetes.io/name: {{ include "headwater.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels and selector labels of one component: (dict "root" $ "component" "indexer"). */}}
{{- define "headwater.componentLabels" -}}
{{ include "headwater.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "headwater.componentSelector" -}}
{{ include "headwater.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "headwater.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The Secret and key each secret setting is read from: the user's own, or the chart's. */}}
{{- define "headwater.tokenSecret" -}}
{{ .Values.query.auth.existingSecret | default (include "headwater.fullname" .) }}
{{- end }}
{{- define "headwater.tokenKey" -}}
{{ ternary .Values.query.auth.existingSecretKey "http-token" (ne .Values.query.auth.existingSecret "") }}
{{- end }}
{{- define "headwater.graphSecret" -}}
{{ .Values.graph.existingSecret | default (include "headwater.fullname" .) }}
{{- end }}
{{- define "headwater.graphKey" -}}
{{ ternary .Values.graph.existingSecretKey "graph-password" (ne .Values.graph.existingSecret "") }}
{{- end }}
{{- define "headwater.saslSecret" -}}
{{ .Values.kafka.sasl.existingSecret | default (include "headwater.fullname" .) }}
{{- end }}
{{- define "headwater.saslKey" -}}
{{ ternary .Values.kafka.sasl.existingSecretKey "kafka-sasl-password" (ne .Values.kafka.sasl.existingSecret "") }}
{{- end }}

{{/* Where the services find their secret files and their state folder. */}}
{{- define "headwater.paths" -}}
token: /etc/headwater/http/token
saslPassword: /etc/headwater/kafka-sasl/password
tls: /etc/headwater/kafka-tls
home: /var/lib/headwater
{{- end }}

{{/* The graph password, from its Secret; every other setting is in the ConfigMap. */}}
{{- define "headwater.env" -}}
- name: HEADWATER_GRAPH_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "headwater.graphSecret" . }}
      key: {{ include "headwater.graphKey" . }}
{{- with .Values.store.s3 }}
{{- if and .uri (or .accessKeyId .existingSecret) }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | default (include "headwater.fullname" $) }}
      key: {{ .accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | default (include "headwater.fullname" $) }}
      key: {{ .secretAccessKeyKey }}
{{- end }}
{{- end }}
{{- end }}

{{/* The key capture signs black boxes' functions with, where query.narrowing names one. */}}
{{- define "headwater.narrowingEnv" -}}
{{- with .Values.query.narrowing }}
{{- if or .key .existingSecret }}
- name: HEADWATER_NARROWING_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | default (include "headwater.fullname" $) }}
      key: {{ ternary .existingSecretKey "narrowing-key" (ne .existingSecret "") }}
{{- end }}
{{- end }}
{{- end }}

{{/* Whether headwater narrow --follow runs: enabled, with a narrowing key and a shared store (it reads the batch log
and keeps each narrowing there). */}}
{{- define "headwater.narrowing" -}}
{{- if and .Values.narrow.enabled (or .Values.query.narrowing.key .Values.query.narrowing.existingSecret) (include "headwater.sharedStore" .) }}true{{ end }}
{{- end }}

{{/* Whether the store is shared by every replica and the query service: in S3, or on a shared claim. */}}
{{- define "headwater.sharedStore" -}}
{{- if or .Values.store.s3.uri .Values.store.sharedClaim }}true{{ end }}
{{- end }}

{{/* Volumes and mounts of the Kafka credentials, shared by both services. */}}
{{- define "headwater.kafkaVolumes" -}}
{{- if .Values.kafka.sasl.mechanism }}
- name: kafka-sasl
  secret:
    secretName: {{ include "headwater.saslSecret" . }}
    items:
      - key: {{ include "headwater.saslKey" . }}
        path: password
{{- end }}
{{- if .Values.kafka.ssl.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.ssl.existingSecret }}
{{- end }}
{{- end }}

{{- define "headwater.kafkaMounts" -}}
{{- $paths := include "headwater.paths" . | fromYaml }}
{{- if .Values.kafka.sasl.mechanism }}
- name: kafka-sasl
  mountPath: {{ dir $paths.saslPassword }}
  readOnly: true
{{- end }}
{{- if .Values.kafka.ssl.existingSecret }}
- name: kafka-tls
  mountPath: {{ $paths.tls }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
Changes when a secret value the chart holds changes, so the pods roll (a generated token
is kept, so it never does); a Secret of yours is yours to roll after.
*/}}
{{- define "headwater.secretChecksum" -}}
{{ list .Values.query.auth .Values.query.narrowing .Values.graph .Values.kafka.sasl .Values.store.s3 | toJson | sha256sum }}
{{- end }}
