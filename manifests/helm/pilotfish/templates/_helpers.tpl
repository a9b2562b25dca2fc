{{/*
Names, labels, images and the Redis connection settings shared by the templates.
*/}}

{{- define "pilotfish.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of every object name. Component suffixes (-controller, -xds, -redis) are at most 11
characters, so the prefix is cut to 52 to keep names within 63.
*/}}
{{- define "pilotfish.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pilotfish.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "root" $ "component" "xds"). */}}
{{- define "pilotfish.labels" -}}
helm.sh/chart: {{ include "pilotfish.chart" .root }}
{{ include "pilotfish.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: pilotfish
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select one component's pods; call with (dict "root" $ "component" "xds"). */}}
{{- define "pilotfish.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pilotfish.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "pilotfish.controller.fullname" -}}
{{ include "pilotfish.fullname" . }}-controller
{{- end }}

{{- define "pilotfish.xds.fullname" -}}
{{ include "pilotfish.fullname" . }}-xds
{{- end }}

{{- define "pilotfish.redis.fullname" -}}
{{ include "pilotfish.fullname" . }}-redis
{{- end }}

{{- define "pilotfish.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "pilotfish.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- else }}
{{- required "controller.serviceAccount.name must name an existing ServiceAccount when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pilotfish.controller.leaseName" -}}
{{- default (include "pilotfish.controller.fullname" .) .Values.controller.leaderElection.leaseName }}
{{- end }}

{{/* A Pilotfish image reference; call with (dict "root" $ "image" .Values.xds.image). */}}
{{- define "pilotfish.image" -}}
{{- $repository := .image.repository }}
{{- with .root.Values.image.registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}
{{- end }}
{{- if .image.digest }}
{{- printf "%s@%s" $repository .image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .root.Chart.AppVersion .root.Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret holding the Redis password, if any (bundled: generated or yours). */}}
{{- define "pilotfish.redis.passwordSecret" -}}
{{- if .Values.redis.bundled.enabled }}
{{- default (printf "%s-redis-auth" (include "pilotfish.fullname" .)) .Values.redis.bundled.auth.existingSecret }}
{{- else }}
{{- .Values.redis.external.existingSecret }}
{{- end }}
{{- end }}

{{- define "pilotfish.redis.passwordKey" -}}
{{- if .Values.redis.bundled.enabled }}
{{- .Values.redis.bundled.auth.existingSecretPasswordKey }}
{{- else }}
{{- .Values.redis.external.existingSecretPasswordKey }}
{{- end }}
{{- end }}

{{/*
The bundled Redis' maxmemory: room for every blob Redis can hold at once — the newest 5
retained, at most 5 superseded (shared/src/bus/redis: K and M), one being written — each at
most snapshots.maxBlobMiB and rounded up by the allocator (a quarter more at worst), plus
about two blobs of transfer buffers (a publish's query buffer, replies to replicas) and
64 MiB for the rest: 16 blobs + 64 MiB (tested with 1 MiB blobs in
bus_redis::endpoint_churn_cannot_fill_redis: 11 blobs peak near 30 MB). Endpoint churn cannot exceed it: superseded blobs beyond M are deleted at
once, whatever the publish rate. Independent of the replica count, so scaling the replicas
does not restart Redis.
*/}}
{{- define "pilotfish.redis.maxmemory" -}}
{{- if .Values.redis.bundled.maxmemory }}
{{- .Values.redis.bundled.maxmemory }}
{{- else }}
{{- printf "%dmb" (add (mul 16 (int .Values.snapshots.maxBlobMiB)) 64) }}
{{- end }}
{{- end }}

{{/* The Secret with the snapshot signing key (`signing-key.pem`). */}}
{{- define "pilotfish.signing.secretName" -}}
{{- default (printf "%s-snapshot-signing" (include "pilotfish.fullname" .)) .Values.snapshotSigning.existingSecret }}
{{- end }}

{{/* The ConfigMap with the public keys replicas verify snapshots with. */}}
{{- define "pilotfish.signing.verifyKeysName" -}}
{{- $signing := .Values.snapshotSigning }}
{{- if $signing.existingSecret }}
{{- required "snapshotSigning.existingVerifyKeysConfigMap must name the ConfigMap with the public key(s) of snapshotSigning.existingSecret" $signing.existingVerifyKeysConfigMap }}
{{- else if $signing.existingVerifyKeysConfigMap }}
{{- fail "snapshotSigning.existingVerifyKeysConfigMap needs snapshotSigning.existingSecret: the chart's generated key has its own public key (add more with snapshotSigning.extraVerifyKeys)" }}
{{- else }}
{{- printf "%s-snapshot-verify-keys" (include "pilotfish.fullname" .) }}
{{- end }}
{{- end }}

{{/*
What decides the verify keys' content, hashed into the pods' annotations so a change rolls
them (the binaries read the keys at start). The generated key itself never changes once
installed, so its content need not be part of it.
*/}}
{{- define "pilotfish.verifyKeysChecksum" -}}
{{- $s := .Values.snapshotSigning }}
{{- list $s.existingSecret $s.existingVerifyKeysConfigMap $s.extraVerifyKeys | toYaml | sha256sum }}
{{- end }}

{{- define "pilotfish.redis.image" -}}
{{- $image := .Values.redis.bundled.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository $image.tag }}
{{- end }}
{{- end }}

{{/*
The Redis URL both binaries use. Rejects the value combinations that cannot work, with a
message that says which value to change.
*/}}
{{- define "pilotfish.redis.url" -}}
{{- $external := .Values.redis.external }}
{{- if .Values.redis.bundled.enabled }}
{{- if or $external.url $external.existingSecret $external.tls.caSecret }}
{{- fail "redis.external.* is set while redis.bundled.enabled is true: set redis.bundled.enabled=false to use the external Redis" }}
{{- end }}
{{- printf "redis://%s.%s.svc.%s:6379" (include "pilotfish.redis.fullname" .) .Release.Namespace .Values.clusterDomain }}
{{- else }}
{{- $url := required "redis.external.url is required when redis.bundled.enabled is false (redis://host:6379 or rediss://host:6380)" $external.url }}
{{- if not (regexMatch "^(redis|rediss|unix)://" $url) }}
{{- fail (printf "redis.external.url %q: the scheme must be redis://, rediss:// (TLS) or unix://" $url) }}
{{- end }}
{{- if regexMatch "^rediss?://[^/@]*:[^/@]*@" $url }}
{{- fail "redis.external.url must not carry a password: put it in a Secret and name it in redis.external.existingSecret" }}
{{- end }}
{{- if and $external.tls.caSecret (not (hasPrefix "rediss://" $url)) }}
{{- fail "redis.external.tls.caSecret needs a rediss:// URL in redis.external.url" }}
{{- end }}
{{- $url }}
{{- end }}
{{- end }}

{{/* Environment of both binaries for Redis, snapshots, logging and identity. */}}
{{- define "pilotfish.commonEnv" -}}
- name: PILOTFISH_REPLICA_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: PILOTFISH_REDIS_URL
  value: {{ include "pilotfish.redis.url" . | quote }}
- name: PILOTFISH_REDIS_PREFIX
  value: {{ .Values.redis.prefix | quote }}
{{- if include "pilotfish.redis.passwordSecret" . }}
- name: PILOTFISH_REDIS_PASSWORD_FILE
  value: /etc/pilotfish/redis-password/password
{{- end }}
- name: PILOTFISH_MAX_BLOB_BYTES
  value: {{ mul (int .Values.snapshots.maxBlobMiB) 1048576 | quote }}
- name: PILOTFISH_VERIFY_KEYS
  value: /etc/pilotfish/verify-keys
{{- if and (not .Values.redis.bundled.enabled) .Values.redis.external.tls.caSecret }}
- name: PILOTFISH_REDIS_CA_FILE
  value: /etc/pilotfish/redis-ca/ca.crt
{{- end }}
- name: PILOTFISH_CLUSTER_DOMAIN
  value: {{ .Values.clusterDomain | quote }}
- name: PILOTFISH_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
- name: RUST_LOG
  value: {{ .Values.logging.level | quote }}
{{- end }}

{{/* Volume mounts of both binaries: the Redis password and CA when configured, the verify keys. */}}
{{- define "pilotfish.redisVolumeMounts" -}}
{{- if include "pilotfish.redis.passwordSecret" . }}
- name: redis-password
  mountPath: /etc/pilotfish/redis-password
  readOnly: true
{{- end }}
- name: verify-keys
  mountPath: /etc/pilotfish/verify-keys
  readOnly: true
{{- if and (not .Values.redis.bundled.enabled) .Values.redis.external.tls.caSecret }}
- name: redis-ca
  mountPath: /etc/pilotfish/redis-ca
  readOnly: true
{{- end }}
{{- end }}

{{- define "pilotfish.redisVolumes" -}}
{{- with include "pilotfish.redis.passwordSecret" . }}
- name: redis-password
  secret:
    secretName: {{ . }}
    defaultMode: 0440
    items:
      - key: {{ include "pilotfish.redis.passwordKey" $ }}
        path: password
{{- end }}
- name: verify-keys
  configMap:
    name: {{ include "pilotfish.signing.verifyKeysName" . }}
    defaultMode: 0444
{{- if and (not .Values.redis.bundled.enabled) .Values.redis.external.tls.caSecret }}
- name: redis-ca
  secret:
    secretName: {{ .Values.redis.external.tls.caSecret }}
    defaultMode: 0444
    items:
      - key: {{ .Values.redis.external.tls.caKey }}
        path: ca.crt
{{- end }}
{{- end }}

{{/* Pod security context of every pod: non-root (the images' user 65532), seccomp. */}}
{{- define "pilotfish.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container security context of every container. */}}
{{- define "pilotfish.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Annotations of a component's pods: Prometheus scraping of the admin port, then the user's.
Call with (dict "root" $ "extra" .Values.xds.podAnnotations); empty when there are none.
*/}}
{{- define "pilotfish.podAnnotations" -}}
{{- $annotations := dict }}
{{- if .root.Values.metrics.prometheusAnnotations }}
{{- $_ := set $annotations "prometheus.io/scrape" "true" }}
{{- $_ := set $annotations "prometheus.io/port" "15014" }}
{{- $_ := set $annotations "prometheus.io/path" "/metrics" }}
{{- end }}
{{- range $key, $value := .extra }}
{{- $_ := set $annotations $key $value }}
{{- end }}
{{- if $annotations }}
{{- toYaml $annotations }}
{{- end }}
{{- end }}

{{- define "pilotfish.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}
