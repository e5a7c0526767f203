package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// chart writes a throwaway chart and returns its directory.
func chart(t *testing.T, values string, templates map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name, text string) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Chart.yaml", "apiVersion: v2\nname: demo\nversion: 1.2.3\nappVersion: \"4.5\"\n")
	write("values.yaml", values)
	for name, text := range templates {
		write(filepath.Join("templates", name), text)
	}
	return dir
}

func TestHelmSemantics(t *testing.T) {
	dir := chart(t, "a:\n  b: 1\n  c: [x, y]\nbig: 268435456\ndrop: yes-please\nname: '{{ .Release.Name }}-x'\n",
		map[string]string{
			"_h.tpl":     `{{- define "demo.label" -}}app: {{ .Chart.Name }}-{{ .Chart.AppVersion }}{{- end }}`,
			"cm.yaml":    "kind: ConfigMap\nmetadata:\n  labels:\n    {{- include \"demo.label\" . | nindent 4 }}\ndata:\n  a: |\n    {{- toYaml .Values.a | nindent 4 }}\n  big: {{ .Values.big | quote }}\n  name: {{ tpl .Values.name . }}\n  ns: {{ .Release.Namespace }}\n  drop: {{ .Values.drop | default \"gone\" }}\n  sum: {{ include (print .Template.BasePath \"/_h.tpl\") . | sha256sum | trunc 8 }}\n  missing: \"{{ .Values.nope }}\"\n",
			"empty.yaml": "{{- if .Values.nope }}\nkind: Never\n{{- end }}\n",
			"NOTES.txt":  "installed {{ .Release.Name }}\n",
		})
	over := filepath.Join(t.TempDir(), "over.yaml")
	if err := os.WriteFile(over, []byte("a:\n  c: [z]\ndrop: null\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, notes, err := render(dir, []string{over}, "rel", "ns1", "v1.37.0", "", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# Source: demo/templates/cm.yaml\n",
		"    app: demo-4.5\n",
		"  a: |\n    b: 1\n    c:\n    - z\n", // maps merge, lists replace; toYaml as helm's
		"  big: \"2.68435456e+08\"\n",         // helm's float64 values, gotcha included
		"  name: rel-x\n",
		"  ns: ns1\n",
		"  drop: gone\n", // null in an override deletes the key
		"  missing: \"\"\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "empty.yaml") || strings.Contains(out, "installed") {
		t.Errorf("empty template or NOTES.txt in the output:\n%s", out)
	}
	if notes != "installed rel\n" {
		t.Errorf("notes = %q", notes)
	}
	if _, _, err := render(dir, nil, "rel", "ns1", "v1.37.0", "", true); err == nil ||
		!strings.Contains(err.Error(), "nope") {
		t.Errorf("strict mode: want an error naming the missing key, got %v", err)
	}
}

func TestRequiredAndCapabilities(t *testing.T) {
	dir := chart(t, "x: \"\"\n", map[string]string{
		"a.yaml": "kind: A\nv: {{ .Capabilities.KubeVersion.Minor }}\nhas: {{ .Capabilities.APIVersions.Has \"monitoring.coreos.com/v1\" }}\nnew: {{ semverCompare \">=1.30.0-0\" .Capabilities.KubeVersion.Version }}\n",
	})
	out, _, err := render(dir, nil, "r", "n", "v1.29.4", "monitoring.coreos.com/v1", true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "v: 29\nhas: true\nnew: false\n") {
		t.Errorf("capabilities:\n%s", out)
	}
	dir = chart(t, "x: \"\"\n", map[string]string{"a.yaml": "kind: A\nv: {{ required \"x is required\" .Values.x }}\n"})
	if _, _, err := render(dir, nil, "r", "n", "v1.37.0", "", true); err == nil || !strings.Contains(err.Error(), "x is required") {
		t.Errorf("required: got %v", err)
	}
	dir = chart(t, "{}\n", map[string]string{"a.yaml": "kind: A\nv: [unclosed\n"})
	if _, _, err := render(dir, nil, "r", "n", "v1.37.0", "", true); err == nil || !strings.Contains(err.Error(), "not YAML") {
		t.Errorf("invalid YAML output: got %v", err)
	}
}

func TestSchema(t *testing.T) {
	dir := chart(t, "a:\n  size: 1\n", map[string]string{"a.yaml": "kind: A\nn: {{ .Values.a.size }}\n"})
	schema := `{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": false,
	  "properties": {"a": {"type": "object", "additionalProperties": false, "properties": {"size": {"type": "integer"}}}}}`
	if err := os.WriteFile(filepath.Join(dir, "values.schema.json"), []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := render(dir, nil, "r", "n", "v1.37.0", "", true); err != nil {
		t.Fatalf("valid values refused: %v", err)
	}
	for over, want := range map[string]string{
		"a:\n  other: 1\n":  "- a: Additional property other is not allowed",
		"a:\n  size: x\n":   "- a.size: Invalid type. Expected: integer, given: string",
		"b: 1\n":            "- (root): Additional property b is not allowed",
		"a:\n  size: 1.5\n": "- a.size: Invalid type. Expected: integer, given: number",
	} {
		f := filepath.Join(t.TempDir(), "over.yaml")
		if err := os.WriteFile(f, []byte(over), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := render(dir, []string{f}, "r", "n", "v1.37.0", "", true)
		if err == nil || !strings.Contains(err.Error(), want) ||
			!strings.Contains(err.Error(), "values don't meet the specifications of the schema(s) in the following chart(s):\ndemo:\n") {
			t.Errorf("values %q: want an error with %q, got %v", over, want, err)
		}
	}
}
