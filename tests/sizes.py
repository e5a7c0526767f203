#!/usr/bin/env python3
"""The shape of ember's production Rust: fails on a file over MAX_FILE lines, a function
over MAX_FN lines, or a `Result<_, String>` — in production code only.

Production code is every `.rs` file under the given source folders except tests: files named
`tests.rs`, `*_tests.rs` or `golden*.rs`, and, inside a file, every `#[cfg(test)]` item. Why: a file of more than
a few hundred lines is doing more than one job, and a function that does not fit on two
screens hides its branches from review. A declarative table (a `macro_rules!` invocation, a
`const` array) is not a function and is not counted as one.

  tests/sizes.py [--self-test] [DIR ...]     (default: agent/src and every workspace crate's src)
"""

import argparse
import os
import re
import sys

MAX_FILE = 800
MAX_FN = 120

FN_RE = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:default\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
    r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)"
)
STRING_RESULT_RE = re.compile(r"Result<[^<>;]*,\s*String\s*>")


def is_test_file(path):
    name = os.path.basename(path)
    return name == "tests.rs" or name.endswith("_tests.rs") or name.startswith("golden")


def production_lines(text):
    """The lines outside `#[cfg(test)]` items (each dropped whole, by brace matching)."""
    lines = text.split("\n")
    out, i, in_block = [], 0, False
    while i < len(lines):
        if not lines[i].strip().startswith("#[cfg(test)]"):
            out.append(lines[i])
            i += 1
            continue
        depth, opened = 0, False
        i += 1
        while i < len(lines):
            code, in_block = blank_literals(lines[i], in_block)
            i += 1
            ended = False
            for ch in code:
                if ch == ";" and not opened:
                    ended = True
                    break
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if ended or (opened and depth <= 0):
                break
    return out


def blank_literals(line, in_block):
    """The line with comments, string and char literals blanked (so their braces do not
    count); carries whether a block comment is still open."""
    out, i, n = [], 0, len(line)
    while i < n:
        if in_block:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out), True
            i, in_block = j + 2, False
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            in_block, i = True, i + 2
            continue
        if c == '"' or (c == "r" and re.match(r'r#*"', line[i:])):
            m = re.match(r'r(#*)"', line[i:])
            if m:
                end = '"' + m.group(1)
                j = line.find(end, i + len(m.group(0)))
                i = n if j < 0 else j + len(end)
            else:
                j = i + 1
                while j < n and line[j] != '"':
                    j += 2 if line[j] == "\\" else 1
                i = j + 1
            out.append('""')
            continue
        if c == "'":
            m = re.match(r"'(\\.|[^\\'])'", line[i:]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", line[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
                continue
        out.append(c)
        i += 1
    return "".join(out), in_block


def long_functions(lines):
    """(name, first line, length) of every function whose body spans more than MAX_FN lines.
    Multi-line string literals are rare in ember; a brace inside one may skew a count."""
    clean, in_block = [], False
    for line in lines:
        text, in_block = blank_literals(line, in_block)
        clean.append(text)
    found = []
    i = 0
    while i < len(clean):
        m = FN_RE.match(clean[i])
        if not m:
            i += 1
            continue
        # The body opens at the first `{` after the signature; a `;` first means no body.
        depth, start, j = 0, i, i
        opened = False
        while j < len(clean):
            for ch in clean[j]:
                if not opened and ch == ";":
                    break
                if ch == "{":
                    depth += 1
                    opened = True
                elif ch == "}":
                    depth -= 1
            else:
                if opened and depth <= 0:
                    break
                j += 1
                continue
            break  # a `;` before the body: a declaration
        if opened:
            length = j - start + 1
            if length > MAX_FN:
                found.append((m.group(1), start + 1, length))
            # Nested functions are counted too: step inside, not over.
        i += 1
    return found


def check(dirs):
    problems = []
    for d in dirs:
        for root, _, names in os.walk(d):
            for n in sorted(names):
                path = os.path.join(root, n)
                if not n.endswith(".rs") or is_test_file(path):
                    continue
                lines = production_lines(open(path, encoding="utf-8").read())
                if len(lines) > MAX_FILE:
                    problems.append(f"{path}: {len(lines)} production lines (at most {MAX_FILE})")
                for name, line, length in long_functions(lines):
                    problems.append(f"{path}:{line}: fn {name} is {length} lines (at most {MAX_FN})")
                for k, line in enumerate(lines):
                    code = line.split("//")[0]
                    if STRING_RESULT_RE.search(code):
                        problems.append(f"{path}:{k + 1}: Result<_, String> (use a typed error)")
    return problems


def default_dirs(root):
    dirs = [os.path.join(root, "agent", "src")]
    for n in sorted(os.listdir(root)):
        src = os.path.join(root, n, "src")
        if n not in ("agent", "tests", "fuzz", "target") and os.path.isfile(os.path.join(root, n, "Cargo.toml")) and os.path.isdir(src):
            dirs.append(src)
    return dirs


def self_test():
    body = ["fn short() {", "    let s = \"}\";", "}"]
    assert long_functions(body) == [], long_functions(body)
    big = ["pub(crate) fn big(x: u8) -> u8 {"] + ["    x;"] * MAX_FN + ["}"]
    assert long_functions(big) == [("big", 1, MAX_FN + 2)], long_functions(big)
    decl = ["    fn declared(&self);", "fn after() {", "}"]
    assert long_functions(decl) == []
    chars = ["fn c() {", "    let b = '{';", "}"] + ["fn d() {"] + ["x"] * (MAX_FN + 1) + ["}"]
    assert [f[0] for f in long_functions(chars)] == ["d"], long_functions(chars)
    assert production_lines("a\n#[cfg(test)]\nmod tests {\n}\nb") == ["a", "b"]
    assert production_lines("#[cfg(test)]\nuse x;\nc") == ["c"]
    assert production_lines("#[cfg(test)]\nfn t() {\n  let s = \"}\";\n}\nd") == ["d"]
    assert STRING_RESULT_RE.search("fn f() -> Result<u8, String> {")
    assert not STRING_RESULT_RE.search("fn f() -> Result<u8, Error> {")
    print("sizes.py self-test ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return 0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(args.dirs or default_dirs(root))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} shape problem(s): split the file or function, type the error", file=sys.stderr)
        return 1
    print("production code shape ok: files ≤ %d lines, functions ≤ %d lines, no Result<_, String>" % (MAX_FILE, MAX_FN))
    return 0


if __name__ == "__main__":
    sys.exit(main())
