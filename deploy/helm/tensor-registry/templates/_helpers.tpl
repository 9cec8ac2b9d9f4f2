{{- define "tensor-registry.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tensor-registry.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tensor-registry.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tensor-registry.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "tensor-registry.fullname" .)) -}}
{{- end -}}

{{/* The registry's identity (security.registry_id), one for every API and worker pod: nodes pin
keys and alias state under it. secrets.registryId when given; else the value already in this
release's Secret (an upgrade keeps it); else generated once, at install. */}}
{{- define "tensor-registry.registryId" -}}
{{- $given := .Values.secrets.registryId -}}
{{- if $given -}}
{{- if not (regexMatch "^[A-Za-z0-9._-]{8,64}$" $given) -}}
{{- fail "secrets.registryId must be 8-64 characters of A-Z a-z 0-9 . _ -" -}}
{{- end -}}
{{- $given -}}
{{- else -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "tensor-registry.secretName" .) -}}
{{- $kept := "" -}}
{{- if $existing -}}
{{- $kept = index ($existing.data | default dict) "registry-id" | default "" | b64dec -}}
{{- end -}}
{{- $kept | default (printf "tr-%s" (randAlphaNum 32 | lower)) -}}
{{- end -}}
{{- end -}}

{{/* Environment shared by the API, the workers and the migration: settings of tensor_registry_server/settings.py. */}}
{{- define "tensor-registry.env" -}}
{{- $secret := include "tensor-registry.secretName" . -}}
- name: TENSOR_REGISTRY_PUBLIC_URL
  value: {{ required "publicUrl is required: the URL serving nodes reach the registry at" .Values.publicUrl | quote }}
- name: TENSOR_REGISTRY_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: TENSOR_REGISTRY_DATABASE__URL
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: database-url}}
- name: TENSOR_REGISTRY_SECURITY__SIGNING_KEY
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: signing-key}}
- name: TENSOR_REGISTRY_SECURITY__MASTER_KEY
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: master-key}}
- name: TENSOR_REGISTRY_SECURITY__MANIFEST_SIGNING_KEY
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: manifest-signing-key}}
- name: TENSOR_REGISTRY_SECURITY__REGISTRY_ID
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: registry-id}}
- name: TENSOR_REGISTRY_ADMIN_TOKEN
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: admin-token, optional: true}}
- name: TENSOR_REGISTRY_BROKER__URL
  value: {{ .Values.broker.url | quote }}
- name: TENSOR_REGISTRY_BROKER__REDIS_URL
  value: {{ .Values.broker.redisUrl | quote }}
- name: TENSOR_REGISTRY_STORAGE__DEFAULT_BACKEND
  value: s3
{{- with .Values.storage.s3.endpointUrl }}
- name: TENSOR_REGISTRY_STORAGE__S3__ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
- name: TENSOR_REGISTRY_STORAGE__S3__REGION
  value: {{ .Values.storage.s3.region | quote }}
- name: TENSOR_REGISTRY_STORAGE__S3__BUCKET
  value: {{ .Values.storage.s3.bucket | quote }}
- name: TENSOR_REGISTRY_STORAGE__S3__PREFIX
  value: {{ .Values.storage.s3.prefix | quote }}
- name: TENSOR_REGISTRY_STORAGE__S3__ADDRESSING_STYLE
  value: {{ .Values.storage.s3.addressingStyle | quote }}
- name: TENSOR_REGISTRY_STORAGE__S3__PRESIGN_DOWNLOADS
  value: {{ .Values.storage.s3.presignDownloads | quote }}
- name: TENSOR_REGISTRY_STORAGE__S3__ACCESS_KEY_ID
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: s3-access-key-id, optional: true}}
- name: TENSOR_REGISTRY_STORAGE__S3__SECRET_ACCESS_KEY
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: s3-secret-access-key, optional: true}}
{{- with .Values.sso }}
{{- if .issuer }}
- name: TENSOR_REGISTRY_SSO__ISSUER
  value: {{ .issuer | quote }}
- name: TENSOR_REGISTRY_SSO__CLIENT_ID
  value: {{ required "sso.clientId is required with sso.issuer" .clientId | quote }}
- name: TENSOR_REGISTRY_SSO__CLIENT_SECRET
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: sso-client-secret, optional: true}}
- name: TENSOR_REGISTRY_SSO__GROUPS_CLAIM
  value: {{ .groupsClaim | quote }}
- name: TENSOR_REGISTRY_SSO__ROLES
  value: {{ toJson .roles | quote }}
- name: TENSOR_REGISTRY_SSO__SESSION_SECONDS
  value: {{ .sessionSeconds | quote }}
- name: TENSOR_REGISTRY_SSO__RECHECK_SECONDS
  value: {{ .recheckSeconds | quote }}
{{- end }}
{{- end }}
{{- /* YAML reads 1000000000000 as a float: integers are written back as integers. */}}
{{- range $key, $name := dict "storageBytes" "STORAGE_BYTES" "uploadBytes" "UPLOAD_BYTES" "concurrentJobs" "CONCURRENT_JOBS" }}
{{- $value := index $.Values.limits $key }}
{{- if not (kindIs "invalid" $value) }}
- name: TENSOR_REGISTRY_LIMITS__{{ $name }}
  value: {{ $value | int64 | toString | quote }}
{{- end }}
{{- end }}
{{- if not (kindIs "invalid" .Values.limits.ratePerSecond) }}
- name: TENSOR_REGISTRY_LIMITS__RATE_PER_SECOND
  value: {{ .Values.limits.ratePerSecond | toString | quote }}
{{- end }}
- name: TENSOR_REGISTRY_LIMITS__RATE_BURST
  value: {{ .Values.limits.rateBurst | int64 | toString | quote }}
{{- with .Values.retention.defaultKeepLast }}
- name: TENSOR_REGISTRY_RETENTION__DEFAULT_KEEP_LAST
  value: {{ . | int64 | toString | quote }}
{{- end }}
- name: TENSOR_REGISTRY_RETENTION__DEFAULT_KEEP_DAYS
  value: {{ .Values.retention.defaultKeepDays | toString | quote }}
- name: TENSOR_REGISTRY_RETENTION__GC_INTERVAL_SECONDS
  value: {{ .Values.retention.gcIntervalSeconds | toString | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}
