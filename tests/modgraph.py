#!/usr/bin/env python3
"""The module graphs of agent/src and parse/src: fails on an import circle or an import
that runs against the data flow.

Every file is a module (`a/b.rs` and `a/b/mod.rs` are `crate::a::b`). An edge A → B is
any path A names that resolves to B: `use crate::…`, `crate::…` inside code, and
`super::…`. A module naming its own ancestor is not an edge (a room's files share its
`mod.rs`), and tests (`#[cfg(test)]` blocks, and the parsers' test builders behind
`#[cfg(any(test, feature = "testing"))]`, `*_tests.rs`, `golden.rs`) are left out: they
may reach anywhere.

Three checks:
  1. no cycle among modules (strongly connected components of more than one module);
  2. no cycle among rooms (top-level modules): two rooms that import each other, even
     through files that do not form a module cycle, are one tangle, not two rooms;
  3. the rooms import only rooms of a lower rank in ROOMS, so a leaf imports no stage
     and a stage never imports the one after it.

And one check of what a room's code does rather than imports:
  4. the aggregator thread never opens a file and keeps no process: the `aggregate` room's
     code (tests left out) names no file API (`std::fs`, `File`, `OpenOptions`, `read_dir`,
     `.exists()`, `/proc` paths), none of the crate's file readers (`os::procfs`,
     `os::openat2`, `workload::cgroup`, `workload::walk`, `process::fs`,
     `process::snapshot`) and not the process table (`ProcessTable`,
     `process::table::ProcessTable`): what a process is it asks of the process registry
     (`process::registry`), whose thread reads `/proc`.

Every file ranks with its room: no file is ranked apart from its folder (a sink's
settings live in the config room, which imports no stage; the sink converts them).

Each crate has its own rooms (CRATES); the parsers' crate (`parse/`, ember-parse) cannot
import the agent at all (cargo sees to that), so only its own order is checked here.

  tests/modgraph.py [--src agent/src | --src parse/src] [--dot] [--stats]
"""

import argparse
import os
import re
import sys
from collections import defaultdict

# The rooms in data-flow order: a room may import only rooms listed before it.
# Leaves first (they import no stage), then the stages, then what composes them.
ROOMS = [
    "proto", "push_proto", "os", "tls", "model", "config", "metrics",
    "workload",
    "capture", "process", "aggregate", "symbolize", "encode", "export",
    "readings",
    "server",
    "agent",
    "cli",
]
# Rooms that are leaves: they may import other leaves only (those before them in ROOMS).
# `model` holds the stage contracts, and metrics label some of its values.
LEAVES = {"proto", "push_proto", "model", "config", "metrics", "os", "tls"}


def room_of(mod):
    """The room a module ranks in: its top-level folder (or file)."""
    return mod[0]

# The parsers' crate: readers of plain formats first, then what builds on them (the symbol
# table, the DWARF reader and the libc decoder read objects through the ELF reader); the test builders of
# objects last.
PARSE_ROOMS = ["elf_file", "mountinfo", "perf_record", "jit", "unwind", "symbols", "dwarf", "libc",
               "python",
               "elf_builder"]

# Each crate's source folder (from the repository root), rooms and leaves.
CRATES = {
    "agent": (ROOMS, LEAVES),
    "parse": (PARSE_ROOMS, set()),
}

# Rooms whose code must not open files, and what counts as opening one.
NO_FILES = {"aggregate"}
FILE_APIS = re.compile(
    r"\bstd::fs\b|\bfs::|\bFile::|\bOpenOptions\b|\bread_dir\b|\.exists\(\)|\"/proc"
    r"|\bos::procfs\b|\bos::openat2\b|\bworkload::cgroup\b|\bworkload::walk\b"
    r"|\bprocess::fs\b|\bprocess::snapshot\b|\bProcessTable\b")

PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_RE = re.compile(r"\buse\s+(crate|super|self)::(\{.*?\}|[^;]*);", re.S)


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel in (["lib"], ["main"]):
        return ()
    return tuple(rel)


TEST_CFG_RE = re.compile(r'#\[cfg\((?:test|any\(test, feature = "testing"\))\)\]')


def strip_tests(text):
    """Drops test-only items (by brace matching) and comments."""
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    while True:
        m = TEST_CFG_RE.search(text, i)
        if m is None:
            out.append(text[i:])
            break
        j = m.start()
        out.append(text[i:j])
        k = m.end()
        semi, brace = text.find(";", k), text.find("{", k)
        if brace < 0 or (0 <= semi < brace):
            i = semi + 1
            continue
        depth, k = 0, brace
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1
    return "".join(out)


def expand_use(head, body):
    """`{a::b, c::{d, e}}` → ['a::b', 'c::d', 'c::e'] (enough for module resolution)."""
    body = re.sub(r"\s+", "", body)
    paths = []

    def walk(prefix, s):
        if s.startswith("{") and s.endswith("}"):
            depth, cur = 0, ""
            for ch in s[1:-1] + ",":
                if ch == "," and depth == 0:
                    if cur:
                        walk(prefix, cur)
                    cur = ""
                    continue
                depth += ch == "{"
                depth -= ch == "}"
                cur += ch
            return
        m = re.match(r"^([^{]*?)::(\{.*\})$", s)
        if m:
            walk(prefix + [m.group(1)], m.group(2))
            return
        paths.append("::".join(prefix + [s.split(" as ")[0]]))

    walk([], body)
    return [(head, p) for p in paths]


def resolve(mod, head, rest, modules):
    if head == "crate":
        base = ()
    elif head == "self":
        base = mod
    else:
        base = mod[:-1]
        while rest.startswith("super::"):
            base, rest = base[:-1], rest[len("super::"):]
    parts = [p for p in rest.split("::") if p and p not in ("*", "self")]
    best = None
    for n in range(len(parts) + 1):
        cand = base + tuple(parts[:n])
        if cand in modules:
            best = cand
    return best


def file_opens(src):
    """`path: what` for each file API named by the non-test code of a NO_FILES room."""
    out = []
    for root, _, names in os.walk(src):
        for n in names:
            p = os.path.join(root, n)
            mod = module_of(src, p) if n.endswith(".rs") else ()
            if not mod or mod[0] not in NO_FILES or mod[-1].endswith("_tests") \
                    or mod[-1] in ("golden", "tests"):
                continue
            text = strip_tests(open(p, encoding="utf-8").read())
            for m in FILE_APIS.finditer(text):
                out.append(f"{os.path.relpath(p, src)}: the {mod[0]} thread opens no file, "
                           f"but names {m.group(0)}")
    return out


def graph(src):
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(root, n)
                files[module_of(src, p)] = p
    modules = set(files)
    edges = defaultdict(set)
    for mod, path in files.items():
        if not mod or mod[-1].endswith("_tests") or mod[-1] in ("golden", "tests"):
            continue
        text = strip_tests(open(path, encoding="utf-8").read())
        refs = []
        for m in USE_RE.finditer(text):
            refs += expand_use(m.group(1), m.group(2))
        for m in PATH_RE.finditer(USE_RE.sub("", text)):
            refs.append((m.group(1), m.group(2)[2:]))
        for head, rest in refs:
            target = resolve(mod, head, rest, modules)
            if target is None or target == mod:
                continue
            # Naming an ancestor shares its mod.rs.
            if mod[: len(target)] == target:
                continue
            if target[-1] in ("golden",) or target[-1].endswith("_tests"):
                continue
            edges[mod].add(target)
    return modules, edges


def sccs(nodes, edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def name(mod):
    return "::".join(mod) or "crate"


def self_test():
    """The check must fail on a circle and on a back-edge, and pass a clean tree."""
    import tempfile
    # label: (files, how many problems are wanted, a text one of them must hold)
    cases = {
        "clean": ({"lib.rs": "", "config/mod.rs": "", "capture/mod.rs": "use crate::config::X;",
                   "aggregate.rs": "use crate::{capture::Sample, config};"}, 0),
        "circle": ({"lib.rs": "", "workload/mod.rs": "", "workload/a.rs": "use super::b::X;",
                    "workload/b.rs": "fn f() { crate::workload::a::g() }"}, 1),
        "back-edge": ({"lib.rs": "", "capture/mod.rs": "", "encode/mod.rs": "",
                       "capture/x.rs": "use crate::encode::Y;"}, 1),
        "leaf imports a stage": ({"lib.rs": "", "metrics/mod.rs": "use crate::readings::Z;",
                                  "readings/mod.rs": ""}, 1),
        "test code is free": ({"lib.rs": "", "capture/mod.rs": "#[cfg(test)]\nmod t { use crate::encode::Y; }",
                               "encode/mod.rs": ""}, 0),
        "config reads a sink's settings from export": ({"lib.rs": "",
                                                         "config/mod.rs": "use crate::export::s::config::S;",
                                                         "config/values.rs": "", "export/mod.rs": "",
                                                         "export/s/mod.rs": "use config::S;",
                                                         "export/s/config.rs": "use crate::config::values::Url;"},
                                                        1, "import circle between rooms: config → export"),
        "export converts config's settings": ({"lib.rs": "", "config/mod.rs": "pub mod s;",
                                               "config/s.rs": "use super::values::Url;", "config/values.rs": "",
                                               "export/mod.rs": "", "export/s/mod.rs": "use crate::config::s::S;"},
                                              0),
        "rooms out of ROOMS in a circle": ({"lib.rs": "", "a/mod.rs": "", "a/x.rs": "use crate::b::y::Y;",
                                            "b/mod.rs": "", "b/y.rs": "", "b/z.rs": "use crate::a::w::W;",
                                            "a/w.rs": ""}, 1, "import circle between rooms: a → b"),
        "config reads other export files": ({"lib.rs": "", "config/mod.rs": "use crate::export::s::encode::E;",
                                             "export/mod.rs": "", "export/s/mod.rs": "",
                                             "export/s/encode.rs": ""}, 1),
        "the aggregator opens no file": ({"lib.rs": "", "aggregate.rs": "fn f(d: &Path) -> bool { d.exists() }"},
                                         1, "the aggregate thread opens no file"),
        "the aggregator reads no /proc": ({"lib.rs": "", "os/mod.rs": "", "os/procfs.rs": "",
                                           "aggregate/mod.rs": "", "aggregate/x.rs": "use crate::os::procfs::stat;"},
                                          1, "names os::procfs"),
        "aggregator tests may read files": ({"lib.rs": "",
                                             "aggregate.rs": "#[cfg(test)]\nmod t { fn f() { std::fs::read(\"x\"); } }"},
                                            0),
        "test builders are free": ({"lib.rs": "", "encode/mod.rs": "",
                                    "capture/mod.rs": '#[cfg(any(test, feature = "testing"))]\n'
                                                      "pub fn f() { crate::encode::y() }"}, 0),
    }
    for label, (files, want, *needle) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
                open(os.path.join(d, rel), "w").write(text)
            problems = problems_of(d)
            got = 1 if problems else 0
            if got != want or (needle and not any(needle[0] in p for p in problems)):
                print(f"modgraph self-test: {label}: got {got} {problems}, want {want} {needle}")
                return 1
    print(f"modgraph self-test: {len(cases)} cases ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", help="one crate's source folder (default: every crate in CRATES)")
    ap.add_argument("--dot", action="store_true", help="print the room graph as Graphviz")
    ap.add_argument("--stats", action="store_true", help="print counts, cycles and back-edges, never fail")
    ap.add_argument("--self-test", action="store_true", help="check the checker on small trees")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.join(os.path.dirname(__file__), "..")
    if args.src:
        crate = os.path.basename(os.path.dirname(os.path.abspath(args.src)))
        srcs = [(crate, args.src)]
    else:
        srcs = [(crate, os.path.join(root, crate, "src")) for crate in CRATES]
    failed = False
    for crate, src in srcs:
        rooms, leaves = CRATES.get(crate, CRATES["agent"])
        modules, edges = graph(src)
        problems, room_edges = check(modules, edges, rooms, leaves)
        problems += file_opens(src)
        if args.dot:
            print(f"digraph {crate}_rooms {{")
            for a in sorted(room_edges):
                for b in sorted(room_edges[a]):
                    print(f'  "{a}" -> "{b}";')
            print("}")
        n_edges = sum(len(t) for t in edges.values())
        print(f"modgraph {crate}: {len(modules) - 1} modules, {n_edges} edges, "
              f"{len({m[0] for m in modules if m})} rooms, {len(problems)} problems")
        for p in sorted(set(problems)):
            print(f"  {p}")
        failed |= bool(problems)
    return 0 if args.stats or not failed else 1


def problems_of(src, rooms=ROOMS, leaves=LEAVES):
    return check(*graph(src), rooms, leaves)[0] + file_opens(src)


def check(modules, edges, rooms=ROOMS, leaves=LEAVES):
    problems = []
    for comp in sccs(modules, edges):
        problems.append("import circle: " + " → ".join(name(m) for m in sorted(comp)))
    rank = {r: i for i, r in enumerate(rooms)}
    room_edges = defaultdict(set)
    for a, targets in edges.items():
        for b in targets:
            if room_of(a) != room_of(b):
                room_edges[room_of(a)].add(room_of(b))
    for comp in sccs({room_of(m) for m in modules if m}, room_edges):
        problems.append("import circle between rooms: " + " → ".join(sorted(comp)))
    for a, targets in edges.items():
        for b in targets:
            ra, rb = room_of(a), room_of(b)
            if ra == rb:
                continue
            if ra not in rank or rb not in rank:
                problems.append(f"{name(a)} → {name(b)}: room {ra if ra not in rank else rb} is not in ROOMS")
            elif ra in leaves and rb not in leaves:
                problems.append(f"{name(a)} → {name(b)}: the leaf {ra} imports the stage {rb}")
            elif rank[rb] > rank[ra]:
                problems.append(f"{name(a)} → {name(b)}: {ra} imports {rb}, which comes after it")
    return problems, room_edges


if __name__ == "__main__":
    sys.exit(main())
