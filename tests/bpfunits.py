#!/usr/bin/env python3
"""The BPF units' shape (issue "one house, part three"), checked from their text.

agent/bpf is one header per job, each including what it builds on:
  - no header over MAX_LINES lines;
  - the include graph between ember's own headers has no circle;
  - each header includes (directly or through what it includes) every header whose
    names it uses: a unit that used a name of a header that includes it would be a
    circle by text, the kind interp.bpf.h and python.bpf.h had.
Names are what a header defines at top level: functions, maps and globals, struct and
enum tags, enumerators and macros. `--self-test` checks the checker on small examples.
"""

import os
import re
import sys

ROOT = os.environ.get("EMBER_BPF_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent", "bpf")
MAX_LINES = 600

DEFINES = [
    re.compile(r"^(?=\w)(?:static\s+)?(?:__always_inline\s+|__noinline\s+)*[\w\s\*]+?\b(\w+)\s*\([^;]*$", re.M),
    re.compile(r"^\}\s*(\w+)\s+SEC\(\"\.maps\"\)", re.M),
    re.compile(r"^(?:const\s+volatile\s+)?(?:struct\s+\w+|enum\s+\w+|__u\d+|__s\d+)\s+(\w+)\s*=", re.M),
    re.compile(r"^(?:struct|enum)\s+(\w+)\s*\{", re.M),
    re.compile(r"^\s+([A-Z][A-Z0-9_]+)\s*=", re.M),
    re.compile(r"^#define\s+(\w+)", re.M),
    # Declarations: prototypes (extern kfuncs too) and forward-declared tags.
    re.compile(r"^(?=\w)(?:extern\s+)?[\w\s\*]+?\b(\w+)\s*\([^;{]*\)[\w\s]*;", re.M),
    re.compile(r"^(?:struct|enum)\s+(\w+)\s*;", re.M),
]
# What counts as a use: a call, a map's address, a tag, or an upper-case constant (a
# member's name, as in `w->running`, is no use of a function of that name).
USES = re.compile(r"(?<![.>\w])(\w+)\s*\(|&(\w+)\b|\b(?:struct|enum)\s+(\w+)|(?<![.>\w])([A-Z][A-Z0-9_]{2,})\b")
INCLUDE = re.compile(r'^#include\s+"([^"]+)"', re.M)
COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "SEC", "BPF_PROG"}


def names(text):
    text = COMMENTS.sub("", text)
    out = set()
    for rx in DEFINES:
        out.update(m for m in rx.findall(text) if m not in KEYWORDS)
    # A header's own include guard is no name another uses.
    return {n for n in out if not n.endswith("_H")}


def check(files):
    """files: {name: text}; returns the problems found."""
    problems = []
    incs = {f: INCLUDE.findall(t) for f, t in files.items()}
    for f, t in files.items():
        n = t.count("\n")
        if f.endswith(".h") and n > MAX_LINES:
            problems.append(f"{f}: {n} lines (at most {MAX_LINES})")
    # Circles of includes (ember's own headers only).
    state = {}

    def visit(f, path):
        if state.get(f) == 1:
            problems.append("include circle: " + " -> ".join(path[path.index(f):] + [f]))
            return
        if state.get(f) == 2 or f not in files:
            return
        state[f] = 1
        for g in incs[f]:
            visit(g, path + [f])
        state[f] = 2

    before = len(problems)
    for f in sorted(files):
        visit(f, [])
    if len(problems) > before:
        return problems  # uses are judged along includes: none to judge with a circle

    def closure(f, seen=None):
        seen = set() if seen is None else seen
        for g in incs.get(f, []):
            if g in files and g not in seen:
                seen.add(g)
                closure(g, seen)
        return seen

    owner = {}
    # Only headers own names: a .c file is a root that nothing includes.
    for f, t in files.items():
        if not f.endswith(".h"):
            continue
        for name in names(t):
            owner.setdefault(name, set()).add(f)
    for f, t in sorted(files.items()):
        reach = closure(f) | {f}
        used = {next(g for g in m if g) for m in USES.findall(COMMENTS.sub("", t))} - names(t)
        for name in sorted(used):
            where = owner.get(name, set())
            if where and not where & reach:
                problems.append(f"{f} uses {name} of {', '.join(sorted(where))} without including it")
    return problems


def load():
    files = {}
    for d, _, fs in os.walk(ROOT):
        for f in fs:
            if f.endswith((".h", ".c")):
                rel = os.path.relpath(os.path.join(d, f), ROOT)
                files[rel] = open(os.path.join(d, f)).read()
    # Includes are relative to agent/bpf or to the including header's directory.
    for f, t in list(files.items()):
        base = os.path.dirname(f)
        fixed = []
        for inc in INCLUDE.findall(t):
            cand = os.path.normpath(os.path.join(base, inc))
            fixed.append(cand if cand in files else inc)
        files[f] = INCLUDE.sub(lambda m, it=iter(fixed): f'#include "{next(it)}"', t)
    return files


def self_test():
    ok = {"a.h": '#include "b.h"\nstatic __always_inline int fa(void)\n{\n\treturn fb();\n}\n',
          "b.h": "static __always_inline int fb(void)\n{\n\treturn 1;\n}\n"}
    assert check(ok) == [], check(ok)
    circle = dict(ok)
    circle["b.h"] = '#include "a.h"\n' + ok["b.h"]
    assert any("circle" in p for p in check(circle)), check(circle)
    by_text = {"a.h": '#include "b.h"\nenum rt {\n\tRT_NONE = 0,\n};\n',
               "b.h": "static __always_inline int fb(void)\n{\n\treturn RT_NONE;\n}\n"}
    assert any("uses RT_NONE" in p for p in check(by_text)), check(by_text)
    big = {"c.h": "int x;\n" * (MAX_LINES + 1)}
    assert any("lines" in p for p in check(big)), check(big)
    print("bpfunits: self-test ok")


if __name__ == "__main__":
    if "--self-test" in sys.argv:
        self_test()
        sys.exit(0)
    found = check(load())
    for p in found:
        print("bpfunits:", p)
    if found:
        sys.exit(1)
    print("bpfunits: every header at most", MAX_LINES, "lines, no include circle, each includes what it uses")
