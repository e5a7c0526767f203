{{/* Chart name, or nameOverride. */}}
{{- define "ember.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: fullnameOverride, else the release name (when it already
contains the chart name), else RELEASE-CHART; 63 characters at most. */}}
{{- define "ember.fullname" -}}
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

{{- define "ember.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Stable labels: the DaemonSet's selector, which cannot change after install. */}}
{{- define "ember.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ember.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ember.labels" -}}
helm.sh/chart: {{ include "ember.chart" . }}
{{ include "ember.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: agent
{{- with .Values.extraLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The metrics port, from config.server.metrics_listen ("0.0.0.0:9464", "[::]:9464"):
the listener with only /metrics and /healthz. Prometheus scrapes the pod IP, so it
must be set and must not be loopback. Profiles stay on
config.server.listen (the pod's loopback unless a token_file is set). */}}
{{- define "ember.port" -}}
{{- $server := .Values.config.server }}
{{- if not $server.enabled }}
{{- fail "config.server.enabled must be true: the probes use /healthz and /readyz" }}
{{- end }}
{{- $listen := required "config.server.metrics_listen is required" $server.metrics_listen }}
{{- if or (hasPrefix "127." $listen) (hasPrefix "localhost" $listen) (hasPrefix "[::1]" $listen) }}
{{- fail "config.server.metrics_listen must not be a loopback address in a pod: use 0.0.0.0:PORT" }}
{{- end }}
{{- splitList ":" $listen | last }}
{{- end }}

{{/* The health port, from config.server.health_listen ("0.0.0.0:9466"): the
listener with only /healthz and /readyz, for the kubelet's probes. It must be
set, must not be loopback (the kubelet probes the pod IP) and must differ from
the metrics port; the NetworkPolicy admits no pod to it. */}}
{{- define "ember.healthPort" -}}
{{- $listen := required "config.server.health_listen is required: the probes use it" .Values.config.server.health_listen }}
{{- if or (hasPrefix "127." $listen) (hasPrefix "localhost" $listen) (hasPrefix "[::1]" $listen) }}
{{- fail "config.server.health_listen must not be a loopback address in a pod: use 0.0.0.0:PORT" }}
{{- end }}
{{- $port := splitList ":" $listen | last }}
{{- if eq $port (include "ember.port" .) }}
{{- fail "config.server.health_listen must not use the metrics_listen port" }}
{{- end }}
{{- $port }}
{{- end }}

{{/* The memory limit: the sum of what the config's caps let ember hold plus a
baseline (the runtime, the process table, symbolizing a busy node's window),
so that the caps bite (counted drops) before the OOM killer does. */}}
{{- define "ember.memoryLimit" -}}
{{- $c := .Values.config }}
{{- $sinks := 0 }}
{{- if $c.sinks.pyroscope.enabled }}{{ $sinks = add $sinks 1 }}{{ end }}
{{- if $c.sinks.otlp.enabled }}{{ $sinks = add $sinks 1 }}{{ end }}
{{- $bytes := add $c.limits.sample_queue_bytes (mul 2 $c.limits.max_stack_bytes_per_window) $c.jit.max_total_bytes $c.sampling.unwind_max_bytes (mul 2 $c.sampling.ring_buffer_bytes) (mul $sinks $c.sinks.queue_bytes) }}
{{- $o := $c.offcpu }}
{{- if $o.enabled }}
{{- $bytes = add $bytes (mul 2304 $o.max_threads) (mul 320 $o.max_tasks) (mul 4864 $o.max_stacks) (mul 2 $o.ring_buffer_bytes) }}
{{- end }}
{{- printf "%dMi" (add (div (add $bytes 1048575) 1048576) .Values.memoryBaselineMi | int64) }}
{{- end }}

{{/* Kubernetes >= 1.30 has securityContext.appArmorProfile and recursiveReadOnly. */}}
{{- define "ember.modernKube" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}true{{ end }}
{{- end }}
