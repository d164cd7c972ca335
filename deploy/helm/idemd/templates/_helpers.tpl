{{/* The name of the chart's objects: the release name, with "idemd" unless it says so. */}}
{{- define "idemd.fullname" -}}
{{- if contains "idemd" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-idemd" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "idemd.selectorLabels" -}}
app.kubernetes.io/name: idemd
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "idemd.labels" -}}
{{ include "idemd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Whether the daemons run over Redis (a Deployment) or on the embedded store (a StatefulSet). */}}
{{- define "idemd.overRedis" -}}
{{- if or .Values.store.redis.url .Values.store.redis.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "idemd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "idemd.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "idemd.authSecret" -}}
{{- if .Values.auth.existingSecret -}}{{ .Values.auth.existingSecret }}{{- else -}}{{ include "idemd.fullname" . }}-auth{{- end -}}
{{- end -}}

{{/* Refuses values that would run idemd open without saying so, or say two things. */}}
{{- define "idemd.checkAuth" -}}
{{- if and .Values.auth.file .Values.auth.existingSecret }}
{{- fail "auth.file and auth.existingSecret exclude each other" }}
{{- end }}
{{- if and .Values.auth.open (or .Values.auth.file .Values.auth.existingSecret) }}
{{- fail "auth.open: true runs idemd without tokens, and excludes auth.file and auth.existingSecret" }}
{{- end }}
{{- if not (or .Values.auth.file .Values.auth.existingSecret .Values.auth.open) }}
{{- fail "idemd needs an auth file: make tokens with `idemctl token new` and give the file as auth.file (--set-file auth.file=auth.yaml) or a Secret as auth.existingSecret (docs/auth.md); or set auth.open=true to run it without tokens, where any pod reaching the Service can read, complete and purge any key" }}
{{- end }}
{{- range .Values.auth.allowedHosts }}
{{- if or (not .) (regexMatch "[:/\\[\\]@ ]" .) }}
{{- fail (printf "auth.allowedHosts: %q is not a host name; give names without scheme or port, such as idemd.internal" .) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The names an open daemon answers to: its Service's, and auth.allowedHosts. */}}
{{- define "idemd.allowedHosts" -}}
{{- $name := include "idemd.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list $name (printf "%s.%s" $name $ns) (printf "%s.%s.svc" $name $ns) (printf "%s.%s.svc.%s" $name $ns .Values.clusterDomain) -}}
{{- concat $names .Values.auth.allowedHosts | join "," -}}
{{- end -}}

{{- define "idemd.scheme" -}}
{{- if .Values.tls.existingSecret -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{/* The pod template, shared by the Deployment and the StatefulSet. */}}
{{- define "idemd.podTemplate" -}}
metadata:
  labels:
    {{- include "idemd.labels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if or .Values.auth.file .Values.podAnnotations }}
  annotations:
    {{- if .Values.auth.file }}
    # A changed auth file rolls the pods: idemd reads it only at start and on SIGHUP.
    checksum/auth: {{ .Values.auth.file | sha256sum }}
    {{- end }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
spec:
  serviceAccountName: {{ include "idemd.serviceAccountName" . }}
  automountServiceAccountToken: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ add .Values.config.shutdownTimeoutSeconds .Values.config.preStopSleepSeconds 5 }}
  securityContext:
    runAsNonRoot: true
    # The image's nonroot user.
    runAsUser: 65532
    runAsGroup: 65532
    fsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: idemd
      image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      # Every flag is set by its IDEMD_ variable.
      env:
        - name: IDEMD_LISTEN
          value: ":8080"
        {{- if include "idemd.overRedis" . }}
        - name: IDEMD_STORE
          {{- if .Values.store.redis.existingSecret }}
          valueFrom:
            secretKeyRef:
              name: {{ .Values.store.redis.existingSecret }}
              key: {{ .Values.store.redis.existingSecretKey }}
          {{- else }}
          value: {{ .Values.store.redis.url | quote }}
          {{- end }}
        - name: IDEMD_REDIS_REPLICA_ACKS
          value: {{ .Values.store.redis.replicaAcks | quote }}
        - name: IDEMD_REDIS_REPLICA_TIMEOUT
          value: {{ .Values.store.redis.replicaTimeout | quote }}
        - name: IDEMD_REQUIRE_NOEVICTION
          value: {{ .Values.store.redis.requireNoeviction | quote }}
        - name: IDEMD_REDIS_HASH_RECORDS
          value: {{ .Values.store.redis.hashRecords | quote }}
        - name: IDEMD_REDIS_RECORD_LAYOUT
          value: {{ .Values.store.redis.recordLayout | quote }}
        {{- else }}
        - name: IDEMD_DATA_DIR
          value: /data
        {{- end }}
        - name: IDEMD_RETENTION
          value: {{ .Values.config.retention | quote }}
        - name: IDEMD_MAX_RESPONSE_BYTES
          value: {{ .Values.config.maxResponseBytes | int64 | quote }}
        - name: IDEMD_LOG_LEVEL
          value: {{ .Values.config.logLevel | quote }}
        - name: IDEMD_SHUTDOWN_TIMEOUT
          value: "{{ .Values.config.shutdownTimeoutSeconds }}s"
        {{- if or .Values.auth.file .Values.auth.existingSecret }}
        - name: IDEMD_AUTH_FILE
          value: /etc/idemd/auth/{{ .Values.auth.existingSecretKey }}
        {{- else }}
        # Open: only the Service's names and IP literals reach the API (DNS rebinding).
        - name: IDEMD_ALLOWED_HOSTS
          value: {{ include "idemd.allowedHosts" . | quote }}
        {{- end }}
        {{- if .Values.tls.existingSecret }}
        - name: IDEMD_TLS_CERT
          value: /etc/idemd/tls/tls.crt
        - name: IDEMD_TLS_KEY
          value: /etc/idemd/tls/tls.key
        {{- end }}
        {{- $blobStore := .Values.blobStore.url }}
        {{- if and (not $blobStore) (not (include "idemd.overRedis" .)) }}
        {{- /* The embedded store keeps large results on its volume unless told none. */}}
        {{- $blobStore = "file:" }}
        {{- end }}
        {{- if eq $blobStore "none" }}
        - name: IDEMD_BLOB_STORE
          value: "none"
        {{- end }}
        {{- with (ne $blobStore "none" | ternary $blobStore "") }}
        {{- if and (hasPrefix "file:" .) (include "idemd.overRedis" $) }}
        {{- fail "blobStore.url: a file: blob store is one pod's directory; over Redis, every daemon must share an s3:// bucket" }}
        {{- end }}
        - name: IDEMD_BLOB_STORE
          value: {{ . | quote }}
        - name: IDEMD_BLOB_THRESHOLD
          value: {{ $.Values.blobStore.threshold | int64 | quote }}
        - name: IDEMD_MAX_BLOB_BYTES
          value: {{ $.Values.blobStore.maxBytes | int64 | quote }}
        {{- with $.Values.blobStore.credentials.existingSecret }}
        - name: AWS_ACCESS_KEY_ID
          valueFrom:
            secretKeyRef:
              name: {{ . }}
              key: {{ $.Values.blobStore.credentials.accessKeyIdKey }}
        - name: AWS_SECRET_ACCESS_KEY
          valueFrom:
            secretKeyRef:
              name: {{ . }}
              key: {{ $.Values.blobStore.credentials.secretAccessKeyKey }}
        {{- end }}
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: http
          containerPort: 8080
          protocol: TCP
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
          scheme: {{ include "idemd.scheme" . }}
        periodSeconds: 5
        timeoutSeconds: 3
        failureThreshold: 2
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
          scheme: {{ include "idemd.scheme" . }}
        periodSeconds: 10
        timeoutSeconds: 3
        failureThreshold: 3
      {{- if gt (int .Values.config.preStopSleepSeconds) 0 }}
      lifecycle:
        preStop:
          sleep:
            seconds: {{ .Values.config.preStopSleepSeconds }}
      {{- end }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: [ALL]
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      {{- if or (not (include "idemd.overRedis" .)) .Values.auth.file .Values.auth.existingSecret .Values.tls.existingSecret }}
      volumeMounts:
        {{- if not (include "idemd.overRedis" .) }}
        - name: data
          mountPath: /data
        {{- end }}
        {{- if or .Values.auth.file .Values.auth.existingSecret }}
        # Mounted whole, never with subPath, so that a restart reads the Secret's latest.
        - name: auth
          mountPath: /etc/idemd/auth
          readOnly: true
        {{- end }}
        {{- if .Values.tls.existingSecret }}
        - name: tls
          mountPath: /etc/idemd/tls
          readOnly: true
        {{- end }}
      {{- end }}
  {{- if or .Values.auth.file .Values.auth.existingSecret .Values.tls.existingSecret }}
  volumes:
    {{- if or .Values.auth.file .Values.auth.existingSecret }}
    - name: auth
      secret:
        secretName: {{ include "idemd.authSecret" . }}
        defaultMode: 0440
    {{- end }}
    {{- if .Values.tls.existingSecret }}
    - name: tls
      secret:
        secretName: {{ .Values.tls.existingSecret }}
        defaultMode: 0440
    {{- end }}
  {{- end }}
  {{- if .Values.topologySpread }}
  topologySpreadConstraints:
    - maxSkew: 1
      topologyKey: kubernetes.io/hostname
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "idemd.selectorLabels" . | nindent 10 }}
    - maxSkew: 1
      topologyKey: topology.kubernetes.io/zone
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "idemd.selectorLabels" . | nindent 10 }}
  {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
