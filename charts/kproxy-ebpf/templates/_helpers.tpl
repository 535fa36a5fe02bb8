{{- define "kproxy-ebpf.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kproxy-ebpf.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kproxy-ebpf.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kproxy-ebpf.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kproxy-ebpf.labels" -}}
{{ include "kproxy-ebpf.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kproxy-ebpf.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kproxy-ebpf.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kproxy-ebpf.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Where the container sees the node's cgroup v2 root and its config. */}}
{{- define "kproxy-ebpf.cgroupMount" -}}/run/kproxy-ebpf/cgroup{{- end -}}
{{- define "kproxy-ebpf.configDir" -}}/etc/kproxy-ebpf{{- end -}}

{{/* Where the container sees the program cache (the agent's default). */}}
{{- define "kproxy-ebpf.programCache" -}}/var/cache/kproxy-ebpf/programs{{- end -}}

{{/* Settings this agent version cannot honour yet: refuse them instead of ignoring them. */}}
{{- define "kproxy-ebpf.checkDatapath" -}}
{{- if .Values.datapath.nodePortRange -}}
{{- fail "datapath.nodePortRange: not a setting of this kproxy-ebpf version (NodePorts are whatever the API server allocated)" -}}
{{- end -}}
{{- end -}}
