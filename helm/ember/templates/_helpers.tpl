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

{{/* The agent's image. Required: no image is published. */}}
{{- define "ember.image" -}}
{{- $repo := required "image.repository is required: no ember image is published. Build one from deploy/Dockerfile (docker build -f deploy/Dockerfile -t REGISTRY/ember:TAG .), push it, and install with --set image.repository=REGISTRY/ember (deploy/README.md, docs/kubernetes.md)" .Values.image.repository }}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Bytes of a Kubernetes quantity with a binary or decimal suffix ("64Mi", "1Gi", "500M"). */}}
{{- define "ember.quantityBytes" -}}
{{- $q := toString . }}
{{- $n := regexFind "^[0-9]+" $q }}
{{- $unit := trimPrefix $n $q }}
{{- $m := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 }}
{{- if or (not $n) (not (hasKey $m $unit)) }}
{{- fail (printf "dataSizeLimit %q is not a quantity such as 64Mi or 2Gi" $q) }}
{{- end }}
{{- mul ($n | int64) (get $m $unit) }}
{{- end }}

{{/* The data emptyDir's sizeLimit: what the config lets ember keep on it (windows, the
unwind cache, the debuginfod cache), so that a full volume, which evicts the pod, cannot
happen. An explicit dataSizeLimit below that fails the render; empty derives it. */}}
{{- define "ember.dataSizeLimit" -}}
{{- $c := .Values.config }}
{{- $need := $c.output.keep_bytes | int64 }}
{{- $parts := list (printf "output.keep_bytes %dMi" (div (add $need 1048575) 1048576)) }}
{{- if $c.sampling.unwind_cache_dir }}
{{- $need = add $need 25165824 }}
{{- $parts = append $parts "the unwind cache (sampling.unwind_cache_dir) 24Mi" }}
{{- end }}
{{- $s := $c.symbols }}
{{- if or $s.debuginfod_urls $s.debuginfod_urls_from_env }}
{{- $d := add $s.debuginfod_cache_bytes $s.debuginfod_max_file_bytes }}
{{- $need = add $need $d }}
{{- $parts = append $parts (printf "the debuginfod cache (symbols.debuginfod_cache_bytes + debuginfod_max_file_bytes, as debuginfod is on) %dMi" (div (add $d 1048575) 1048576)) }}
{{- end }}
{{- $needMi := div (add $need 1048575) 1048576 }}
{{- if .Values.dataSizeLimit }}
{{- $have := include "ember.quantityBytes" .Values.dataSizeLimit | int64 }}
{{- if lt $have (mul $needMi 1048576) }}
{{- fail (printf "dataSizeLimit %s is below what ember may keep on its data volume, %dMi: %s. A full volume evicts the pod: raise dataSizeLimit to at least %dMi, lower those caps, or leave dataSizeLimit empty to size the volume from them" .Values.dataSizeLimit $needMi (join ", " $parts) $needMi) }}
{{- end }}
{{- .Values.dataSizeLimit }}
{{- else }}
{{- printf "%dMi" (add $needMi 8) }}
{{- end }}
{{- end }}

{{/* Token and password files must be on a mounted volume (existingSecret or an extra
mount): the root filesystem is the image's, which holds no credentials. */}}
{{- define "ember.checkSecretFiles" -}}
{{- $c := .Values.config }}
{{- $mounts := list }}
{{- if .Values.existingSecret }}
{{- $mounts = append $mounts .Values.existingSecretMountPath }}
{{- end }}
{{- range .Values.extraVolumeMounts }}
{{- $mounts = append $mounts .mountPath }}
{{- end }}
{{- $files := dict "server.token_file" $c.server.token_file "sinks.pyroscope.basic_auth_password_file" $c.sinks.pyroscope.basic_auth_password_file "sinks.pyroscope.bearer_token_file" $c.sinks.pyroscope.bearer_token_file "sinks.otlp.bearer_token_file" $c.sinks.otlp.bearer_token_file }}
{{- range $key, $path := $files }}
{{- if $path }}
{{- $on := false }}
{{- range $mounts }}
{{- if hasPrefix (printf "%s/" (trimSuffix "/" .)) $path }}
{{- $on = true }}
{{- end }}
{{- end }}
{{- if not $on }}
{{- fail (printf "config.%s %s is on no mounted volume: set existingSecret (a Secret mounted at existingSecretMountPath, %s) or extraVolumes and extraVolumeMounts, and point it at a file there" $key $path $.Values.existingSecretMountPath) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The scrape job of the agents, as the Prometheus Operator names it. */}}
{{- define "ember.scrapeJob" -}}
{{- if .Values.prometheusRule.job }}
{{- .Values.prometheusRule.job }}
{{- else if .Values.podMonitor.enabled }}
{{- printf "%s/%s" .Release.Namespace (include "ember.fullname" .) }}
{{- else if .Values.serviceMonitor.enabled }}
{{- include "ember.fullname" . }}
{{- else }}
{{- fail "prometheusRule needs podMonitor.enabled or serviceMonitor.enabled, or prometheusRule.job (the scrape job of the agents) for EmberAgentDown" }}
{{- end }}
{{- end }}
