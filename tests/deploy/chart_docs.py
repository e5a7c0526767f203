"""The chart's README.md and values.schema.json, generated from helm/ember/values.yaml.

  chart_docs.py --write     rewrite helm/ember/README.md and helm/ember/values.schema.json
  chart_docs.py --check     exit 1 (saying which) when either differs from what values.yaml makes

Run by tests/deploy/check.sh (--check) with the venv's python (PyYAML comes with yamllint),
and by `make docs` (--write).

README: helm/ember/README.md.tmpl with `{{ values }}` replaced by a table of every key
outside `config` (the comment lines right above a key are its description) and one row
per `config` section (its keys are config/ember.yaml's, documented in docs/configuration.md).

Schema (JSON Schema draft-07, which helm validates values against before rendering): every
mapping of values.yaml is an object with exactly its keys (additionalProperties: false),
every value typed by its default (boolean, integer, number, string, array); the few keys
whose default says nothing of their type (empty maps and lists, Kubernetes objects) are
typed in OVERRIDES below. So a misspelt or mistyped key fails `helm install` with the key's
name, instead of a crash loop.
"""

import json
import os
import re
import sys

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CHART = os.path.join(ROOT, "helm", "ember")

STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
QUANTITY = {"type": ["string", "integer", "number"]}
K8S_OBJECTS = {"type": "array", "items": {"type": "object"}}
STRINGS = {"type": "array", "items": {"type": "string"}}

# Keys whose default does not tell their type (by dotted path; `*` matches one key).
OVERRIDES = {
    "image.repository": {"type": "string"},
    "imagePullSecrets": K8S_OBJECTS,
    "tolerations": K8S_OBJECTS,
    "extraEnv": K8S_OBJECTS,
    "extraVolumes": K8S_OBJECTS,
    "extraVolumeMounts": {"type": "array", "items": {"type": "object", "required": ["name", "mountPath"]}},
    "networkPolicy.from": K8S_OBJECTS,
    "extraCapabilities": STRINGS,
    "excludeCapabilities": STRINGS,
    "podAnnotations": STR_MAP,
    "extraLabels": STR_MAP,
    "nodeSelector": STR_MAP,
    "serviceMonitor.labels": STR_MAP,
    "podMonitor.labels": STR_MAP,
    "prometheusRule.labels": STR_MAP,
    "resources.requests": {"type": "object", "additionalProperties": QUANTITY},
    "resources.limits": {
        "type": "object",
        "properties": {"cpu": QUANTITY, "memory": QUANTITY},
        "additionalProperties": QUANTITY,
    },
    "dataSizeLimit": {"type": "string", "pattern": "^([0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?)?$"},
    "seccompProfile": {
        "type": "object",
        "properties": {
            "type": {"enum": ["Localhost", "RuntimeDefault", "Unconfined"]},
            "localhostProfile": {"type": "string"},
        },
        "required": ["type"],
        "additionalProperties": False,
    },
    "config.sampling.pids": {"type": "array", "items": {"type": "integer"}},
    "config.sinks.pyroscope.labels": STR_MAP,
    "config.sinks.*.headers": STR_MAP,
    "config.otlp_metrics.headers": STR_MAP,
}


def override(path):
    for pat, schema in OVERRIDES.items():
        if re.fullmatch(re.escape(pat).replace(r"\*", "[^.]+"), path):
            return schema
    return None


def comments(lines):
    """Dotted key path -> the comment lines right above the key."""
    out, stack, pending = {}, [], []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped[1:].strip())
            continue
        m = re.match(r"^( *)([A-Za-z_][A-Za-z0-9_.-]*):( |$)", line)
        if not m:
            pending = []
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        out[".".join(k for _, k in stack)] = pending
        pending = []
    return out


def schema_of(value, path, docs):
    s = override(path)
    if s is None:
        if isinstance(value, dict):
            s = {
                "type": "object",
                "properties": {k: schema_of(v, f"{path}.{k}" if path else k, docs) for k, v in value.items()},
                "additionalProperties": False,
            }
        elif isinstance(value, bool):
            s = {"type": "boolean"}
        elif isinstance(value, int):
            s = {"type": "integer"}
        elif isinstance(value, float):
            s = {"type": "number"}
        elif isinstance(value, str):
            s = {"type": "string"}
        elif isinstance(value, list):
            kinds = {type(v) for v in value}
            item = {str: "string", int: "integer", float: "number"}.get(kinds.pop()) if len(kinds) == 1 else None
            s = {"type": "array", "items": {"type": item or "string"}}
        else:
            sys.exit(f"{path}: no type for {value!r}: add it to OVERRIDES")
    s = dict(s)
    text = " ".join(docs.get(path, []))
    if text:
        s["description"] = text
    return s


def schema(values, docs):
    s = schema_of(values, "", docs)
    s = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "ember chart values", **s}
    s.pop("description", None)
    return json.dumps(s, indent=2) + "\n"


def cell(text):
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def default(value):
    if value == "" or value is None:
        return '`""`'
    return "`" + cell(json.dumps(value, separators=(", ", ": "))) + "`"


def readme(values, docs):
    rows = ["| key | default | description |", "|---|---|---|"]

    def walk(value, path):
        if path == "config":
            rows.append(f"| `config` | | {cell(' '.join(docs.get(path, [])))} |")
            for section in value:
                p = f"config.{section}"
                text = " ".join(docs.get(p, [])) or f"See [docs/configuration.md](../../docs/configuration.md#{section})."
                rows.append(f"| `{p}` | (section) | {cell(text)} |")
            return
        if isinstance(value, dict) and value and override(path) is None:
            if path and docs.get(path):
                rows.append(f"| `{path}` | | {cell(' '.join(docs[path]))} |")
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else k)
            return
        rows.append(f"| `{path}` | {default(value)} | {cell(' '.join(docs.get(path, [])))} |")

    walk(values, "")
    with open(os.path.join(CHART, "README.md.tmpl")) as f:
        tmpl = f.read()
    if "{{ values }}" not in tmpl:
        sys.exit("README.md.tmpl has no {{ values }}")
    return tmpl.replace("{{ values }}", "\n".join(rows))


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("--write", "--check"):
        sys.exit(__doc__)
    with open(os.path.join(CHART, "values.yaml")) as f:
        text = f.read()
    values = yaml.safe_load(text)
    docs = comments(text.split("\n"))
    want = {"README.md": readme(values, docs), "values.schema.json": schema(values, docs)}
    stale = []
    for name, content in want.items():
        path = os.path.join(CHART, name)
        if sys.argv[1] == "--write":
            with open(path, "w") as f:
                f.write(content)
            continue
        have = open(path).read() if os.path.exists(path) else None
        if have != content:
            stale.append(name)
    if stale:
        print(f"helm/ember/{' and '.join(stale)} differ from what values.yaml makes: "
              "run `python3 tests/deploy/chart_docs.py --write` (or `make docs`)")
        sys.exit(1)


if __name__ == "__main__":
    main()
