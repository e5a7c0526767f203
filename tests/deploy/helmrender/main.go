// Command helmrender renders a Helm chart the way `helm template` does, for the
// subset of Helm that ember's chart uses. Debian 12 packages no helm binary, and
// the tests may not download one, so this is built from Debian's packages:
// golang-github-masterminds-sprig-dev (Helm's template functions; imported without
// its /v3 suffix, which GOPATH mode cannot resolve) and
// golang-github-ghodss-yaml-dev (the JSON-round-trip YAML library that Helm's
// sigs.k8s.io/yaml was forked from, so values and toYaml behave as in Helm:
// numbers in values are float64, map keys come out sorted).
//
// Usage:
//
//	helmrender -chart DIR [-f VALUES.yaml]... [-name ember] [-namespace ember]
//	           [-api-versions a/v1,b/v1] [-notes FILE] [-strict]
//
// It prints every rendered template (not partials `_*`, not NOTES.txt) as one
// multi-document YAML stream, each document headed by `# Source: CHART/templates/FILE`
// like helm's; documents that render empty are left out. Every document must
// parse as YAML. With -strict a reference to a missing value is an error
// (helm's --strict / missingkey=error); otherwise it renders empty, as in helm.
//
// Supported: .Values (values.yaml deep-merged with each -f, null deletes a key),
// .Release.{Name,Namespace,Service,IsInstall,IsUpgrade,Revision},
// .Chart.{Name,Version,AppVersion,Description,Type}, .Capabilities.KubeVersion.{Version,Major,Minor},
// .Capabilities.APIVersions.Has, .Template.{Name,BasePath}, define/template/block,
// sprig's functions (less env/expandenv, as in helm), include, tpl, required,
// toYaml, fromYaml, toJson, .Files.Get, and values.schema.json: the merged values are
// checked against it before any template runs, with the library helm 3 (up to 3.17)
// validates with (github.com/xeipuuv/gojsonschema, Debian's
// golang-github-xeipuuv-gojsonschema-dev) and helm's error text. Not supported: other
// .Files methods, lookup, subcharts, hooks.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"github.com/ghodss/yaml"
	"github.com/xeipuuv/gojsonschema"
	yamlv3 "gopkg.in/yaml.v3"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// APIVersions mirrors helm's chartutil.VersionSet.
type APIVersions []string

// Has reports whether the API version (e.g. "monitoring.coreos.com/v1") is available.
func (a APIVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

// KubeVersion mirrors helm's chartutil.KubeVersion.
type KubeVersion struct{ Version, Major, Minor string }

func (k KubeVersion) String() string { return k.Version }

// GitVersion is the deprecated alias helm keeps.
func (k KubeVersion) GitVersion() string { return k.Version }

// Capabilities mirrors helm's chartutil.Capabilities (the part charts use).
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions APIVersions
}

// Chart mirrors the fields of helm's chart.Metadata that templates read.
type Chart struct {
	APIVersion  string `json:"apiVersion"`
	Name        string `json:"name"`
	Version     string `json:"version"`
	AppVersion  string `json:"appVersion"`
	Description string `json:"description"`
	Type        string `json:"type"`
}

func main() {
	var files listFlag
	chartDir := flag.String("chart", "", "chart directory")
	flag.Var(&files, "f", "values file merged over values.yaml (repeatable)")
	name := flag.String("name", "ember", "release name")
	namespace := flag.String("namespace", "ember", "release namespace")
	kubeVersion := flag.String("kube-version", "v1.37.0", "Capabilities.KubeVersion")
	apis := flag.String("api-versions", "", "extra Capabilities.APIVersions, comma separated")
	notes := flag.String("notes", "", "write the rendered NOTES.txt here")
	strict := flag.Bool("strict", false, "fail on references to missing values")
	flag.Parse()
	if *chartDir == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: helmrender -chart DIR [-f VALUES]... [-name N] [-namespace NS] [-api-versions LIST] [-notes FILE] [-strict]")
		os.Exit(2)
	}
	out, notesText, err := render(*chartDir, files, *name, *namespace, *kubeVersion, *apis, *strict)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helmrender:", err)
		os.Exit(1)
	}
	if *notes != "" {
		if err := os.WriteFile(*notes, []byte(notesText), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "helmrender:", err)
			os.Exit(1)
		}
	}
	os.Stdout.WriteString(out)
}

func readYAMLMap(file string) (map[string]interface{}, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return m, nil
}

// merge overlays src onto dst like helm's value coalescing: maps merge
// recursively, anything else replaces, and null removes the key.
func merge(dst, src map[string]interface{}) {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		sm, sok := v.(map[string]interface{})
		dm, dok := dst[k].(map[string]interface{})
		if sok && dok {
			merge(dm, sm)
		} else {
			dst[k] = v
		}
	}
}

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func render(chartDir string, files []string, name, namespace, kubeVersion, apis string, strict bool) (string, string, error) {
	var chart Chart
	data, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return "", "", err
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		return "", "", fmt.Errorf("Chart.yaml: %w", err)
	}
	if chart.APIVersion != "v2" || chart.Name == "" || chart.Version == "" {
		return "", "", errors.New("Chart.yaml: apiVersion v2, name and version are required")
	}
	values, err := readYAMLMap(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return "", "", err
	}
	for _, f := range files {
		over, err := readYAMLMap(f)
		if err != nil {
			return "", "", err
		}
		merge(values, over)
	}
	if err := validateSchema(chartDir, chart.Name, values); err != nil {
		return "", "", err
	}

	caps := Capabilities{KubeVersion: KubeVersion{Version: kubeVersion}, APIVersions: APIVersions{"v1", "apps/v1", "rbac.authorization.k8s.io/v1"}}
	if parts := strings.SplitN(strings.TrimPrefix(kubeVersion, "v"), ".", 3); len(parts) >= 2 {
		caps.KubeVersion.Major, caps.KubeVersion.Minor = parts[0], parts[1]
	}
	for _, a := range strings.Split(apis, ",") {
		if a = strings.TrimSpace(a); a != "" {
			caps.APIVersions = append(caps.APIVersions, a)
		}
	}

	// Templates are named CHART/templates/REL like helm's, all in one set so
	// that define/include work across files.
	tdir := filepath.Join(chartDir, "templates")
	var names []string
	sources := map[string]string{}
	err = filepath.Walk(tdir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(tdir, p)
		n := path.Join(chart.Name, "templates", filepath.ToSlash(rel))
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sources[n] = string(b)
		names = append(names, n)
		return nil
	})
	if err != nil {
		return "", "", err
	}
	sort.Strings(names)

	missing := "missingkey=zero"
	if strict {
		missing = "missingkey=error"
	}
	t := template.New("gotpl").Option(missing)
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	depth := map[string]int{}
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	funcs["toJson"] = func(v interface{}) string {
		b, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(b)
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		if depth[name] > 1000 {
			return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
		}
		depth[name]++
		defer func() { depth[name]-- }()
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, vals interface{}) (string, error) {
		c, err := t.Clone()
		if err != nil {
			return "", err
		}
		nt, err := c.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf strings.Builder
		if err := nt.Execute(&buf, vals); err != nil {
			return "", err
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	funcs["required"] = func(warn string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, errors.New(warn)
		}
		if s, ok := val.(string); ok && s == "" {
			return val, errors.New(warn)
		}
		return val, nil
	}
	t.Funcs(funcs)
	for _, n := range names {
		if _, err := t.New(n).Parse(sources[n]); err != nil {
			return "", "", err
		}
	}

	var out strings.Builder
	notesText := ""
	for _, n := range names {
		if strings.HasPrefix(path.Base(n), "_") {
			continue
		}
		top := map[string]interface{}{
			"Files":        Files{dir: chartDir},
			"Values":       values,
			"Chart":        chart,
			"Capabilities": caps,
			"Release": map[string]interface{}{
				"Name": name, "Namespace": namespace, "Service": "Helm",
				"IsInstall": true, "IsUpgrade": false, "Revision": 1,
			},
			"Template": map[string]interface{}{"Name": n, "BasePath": path.Join(chart.Name, "templates")},
		}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, n, top); err != nil {
			return "", "", err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if path.Base(n) == "NOTES.txt" {
			notesText = text
			continue
		}
		if strings.TrimSpace(text) == "" {
			continue
		}
		if err := checkYAML(n, text); err != nil {
			return "", "", err
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", n, strings.TrimRight(text, "\n"))
	}
	return out.String(), notesText, nil
}

// validateSchema checks values against the chart's values.schema.json, if it has one,
// as helm's chartutil.ValidateAgainstSchema does: one line per violation, naming its field.
func validateSchema(chartDir, chartName string, values map[string]interface{}) error {
	schema, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	doc, err := json.Marshal(values)
	if err != nil {
		return err
	}
	res, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema), gojsonschema.NewBytesLoader(doc))
	if err != nil {
		return fmt.Errorf("values.schema.json: %w", err)
	}
	if res.Valid() {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n", chartName)
	for _, e := range res.Errors() {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	return errors.New(b.String())
}

// Files is .Files: Get reads a file of the chart by its path inside the chart ("" when
// it is missing or the path leaves the chart).
type Files struct{ dir string }

// Get returns the file's text.
func (f Files) Get(name string) string {
	clean := path.Clean("/" + filepath.ToSlash(name))[1:]
	if clean == "" || clean != filepath.ToSlash(name) {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(f.dir, filepath.FromSlash(clean)))
	if err != nil {
		return ""
	}
	return string(b)
}

// checkYAML fails when a rendered template is not a YAML stream of mappings.
func checkYAML(name, text string) error {
	dec := yamlv3.NewDecoder(bytes.NewReader([]byte(text)))
	for {
		var doc interface{}
		err := dec.Decode(&doc)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: rendered output is not YAML: %w\n%s", name, err, text)
		}
		if _, ok := doc.(map[string]interface{}); doc != nil && !ok {
			return fmt.Errorf("%s: rendered document is not a mapping", name)
		}
	}
}
