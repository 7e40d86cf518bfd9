{{/*
Names, labels and the pieces of the pod spec. The objects mirror sidecar/launcher/kube.py, which
`sleeve manifest` renders; tests/launcher/test_manifest.py compares the two.
*/}}

{{- define "sleeve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name, at most 52 characters: a StatefulSet's pods carry the label
controller-revision-hash=<name>-<10 characters>, and a label value has at most 63.
*/}}
{{- define "sleeve.fullname" -}}
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

{{- define "sleeve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sleeve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sleeve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sleeve.labels" -}}
{{ include "sleeve.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "sleeve.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "sleeve.image" -}}
{{- .Values.image.repository }}
{{- with .Values.image.tag }}:{{ . }}{{ end }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{- define "sleeve.tokenSecret" -}}
{{- default (printf "%s-tokens" (include "sleeve.fullname" .)) .Values.tokens.existingSecret }}
{{- end }}

{{/*
The container's variables, sorted by name (a template ranges over a map in key order). Later
sets win: extraEnv, then the settings, then what the pod's layout fixes.
*/}}
{{- define "sleeve.env" -}}
{{- $env := dict }}
{{- range $name, $value := .Values.extraEnv }}
{{- $_ := set $env $name (toString $value) }}
{{- end }}
{{- with .Values.sleeve.goal }}{{ $_ := set $env "SLEEVE_GOAL" . }}{{ end }}
{{- with .Values.sleeve.repo }}{{ $_ := set $env "SLEEVE_REPO" . }}{{ end }}
{{- with .Values.sidecar.restart }}{{ $_ := set $env "SIDECAR_RESTART" . }}{{ end }}
{{- with .Values.sidecar.inboxNotify }}{{ $_ := set $env "SIDECAR_INBOX_NOTIFY" . }}{{ end }}
{{- with .Values.sidecar.allowedOrigins }}{{ $_ := set $env "SIDECAR_ALLOWED_ORIGINS" . }}{{ end }}
{{- with .Values.sidecar.cliConfig }}{{ $_ := set $env "SIDECAR_CLI_CONFIG" . }}{{ end }}
{{- with .Values.sidecar.record }}{{ $_ := set $env "SIDECAR_RECORD" . }}{{ end }}
{{- $_ := set $env "SIDECAR_RECORD_MAX_MB" (toString .Values.sidecar.recordMaxMB) }}
{{- if not .Values.egress.open }}
{{- $_ := set $env "SIDECAR_EGRESS_ALLOW" (default "none" (join "," .Values.egress.allow)) }}
{{- end }}
{{- $_ := set $env "SLEEVE_NAME" (default (include "sleeve.fullname" .) .Values.sleeve.name) }}
{{- $_ := set $env "SLEEVE_CLI" .Values.sleeve.cli }}
{{- $_ := set $env "SIDECAR_STOP_GRACE" (toString .Values.sidecar.stopGrace) }}
{{- $_ := set $env "HOME" "/home/sleeve" }}
{{- $_ := set $env "SIDECAR_HOST" "0.0.0.0" }}
{{- $_ := set $env "SIDECAR_PORT" "8080" }}
{{- $_ := set $env "SIDECAR_WORKSPACE" "/workspace" }}
{{- $_ := set $env "SIDECAR_STATE_DIR" "/run/sidecar" }}
{{- $_ := set $env "SIDECAR_RECORD_DIR" "/var/lib/sleeve/recordings" }}
{{- $_ := set $env "SIDECAR_TOKEN_FILE" "/etc/sleeve/tokens/token" }}
{{- $_ := set $env "SIDECAR_VIEW_TOKEN_FILE" "/etc/sleeve/tokens/view-token" }}
{{- if .Values.secrets }}
{{- $_ := set $env "SIDECAR_SECRETS_FILE" "/etc/sleeve/secrets/secrets.yaml" }}
{{- end }}
{{- range .Values.secrets }}
{{- $_ := set $env (include "sleeve.secretVar" .) (dict "secretKeyRef" .secretKeyRef) }}
{{- if eq .name "github" }}
{{- /* git sends the placeholder as its Basic password (sidecar/launcher/secretopts.py git_env) */}}
{{- $key := "credential.https://github.com.helper" }}
{{- $_ := set $env "GIT_CONFIG_COUNT" "2" }}
{{- $_ := set $env "GIT_CONFIG_KEY_0" $key }}
{{- $_ := set $env "GIT_CONFIG_VALUE_0" "" }}
{{- $_ := set $env "GIT_CONFIG_KEY_1" $key }}
{{- $_ := set $env "GIT_CONFIG_VALUE_1" (printf "!f() { test \"$1\" = get || exit 0; echo username=x-access-token; echo \"password=$%s\"; }; f" .env) }}
{{- end }}
{{- end }}
{{- range $name, $value := $env }}
- name: {{ $name }}
{{- if kindIs "map" $value }}
  valueFrom:
    secretKeyRef:
      name: {{ $value.secretKeyRef.name }}
      key: {{ $value.secretKeyRef.key | quote }}
{{- else }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A secret's carrier variable in the sidecar's own environment (from_env): SLEEVE_SECRET_<NAME>,
upper-cased, - as _ (sidecar/launcher/secretopts.py `SecretArg.from_env`).
*/}}
{{- define "sleeve.secretVar" -}}
SLEEVE_SECRET_{{ .name | upper | replace "-" "_" }}
{{- end }}

{{/*
SIDECAR_SECRETS_FILE's text: names, variables and hosts, never a value (Helm's `toJson`
equals the launcher's compact JSON with sorted keys).
*/}}
{{- define "sleeve.secretsFile" -}}
{{- $entries := list }}
{{- range .Values.secrets }}
{{- $entries = append $entries (dict "name" .name "env" .env "from_env" (include "sleeve.secretVar" .) "hosts" .hosts) }}
{{- end }}
{{- dict "secrets" $entries | toJson }}
{{- end }}

{{- define "sleeve.containerSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
readOnlyRootFilesystem: {{ .Values.securityContext.readOnlyRootFilesystem }}
runAsNonRoot: true
{{- end }}

{{/*
Copies a seeded OAuth credentials file into the home volume once; later refreshes rewrite it.
*/}}
{{- define "sleeve.seedScript" -}}
set -eu
seed=/etc/sleeve/seed/credentials.json
dest=/home/sleeve/.claude/.credentials.json
if [ -f "$seed" ] && [ ! -e "$dest" ]; then
  mkdir -p -m 700 /home/sleeve/.claude
  install -m 600 "$seed" "$dest"
  echo "seeded $dest"
fi
{{ end }}

{{/*
The stop-grace rule (sidecar/core/contract.py `runtime_grace`, checked against this by
tests/test_chart.py): the pod's grace period holds the CLI's grace, rounded up, and the
sidecar's own shutdown after it (SHUTDOWN_MARGIN, 5 s).
*/}}
{{- define "sleeve.checks" -}}
{{- if and .Values.secrets .Values.egress.open }}
{{- fail "secrets need the egress allowlist (the sidecar's proxy is the only way a real value goes out): egress.open cannot be true with secrets" }}
{{- end }}
{{- $least := add (ceil (float64 .Values.sidecar.stopGrace)) 5 }}
{{- if lt (int64 .Values.terminationGracePeriodSeconds) $least }}
{{- fail (printf "terminationGracePeriodSeconds (%v s) must be at least %v s: sidecar.stopGrace (%v s) rounded up, + 5 s for the sidecar's shutdown after it, which the kubelet's SIGKILL would cut short" .Values.terminationGracePeriodSeconds $least .Values.sidecar.stopGrace) }}
{{- end }}
{{- end }}
