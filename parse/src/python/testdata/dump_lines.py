#!/usr/bin/env python3
"""Dump the line tables of a varied sample module as this interpreter compiles it, with
the interpreter's own answers, for ember's line-table decoders (parse/src/python/lines.rs).

Run by each interpreter (3.8-3.13): `python3.X dump_lines.py > lines-3.X.txt`. For every
code object (depth first, in co_consts order) it writes:

    code <qualname> first=<co_firstlineno> units=<len(co_code)//2> table=<hex>
    addr2line <runs>      PyCode_Addr2Line (the C decoder tracebacks use) per code unit
    colines <runs>        co_lines() (3.10+), or dis.findlinestarts expanded (<=3.9);
                          `=` when the same as addr2line

Runs are `start-end:line` over code units (end exclusive), `line` is `-` for none. The
table is co_lnotab (<=3.9) or co_linetable (3.10+).
"""

import ctypes
import dis
import sys
import types

# Sample source: loops, long bodies, jumps back, multi-line expressions, comprehensions,
# try/except/finally, with, lambdas, classes, generators, lines far apart and long lines.
PARTS = [
    '''\
import os

def simple(a, b):
    c = a + b
    return c * 2

def loops(n):
    total = 0
    for i in range(n):
        if i % 3 == 0:
            continue
        while total < i:
            total += 1
    else:
        total -= 1
    return total

def multiline(a, b, c):
    x = (a +
         b +
         c)
    y = func_call(
        a,
        b,
        c,
    )
    return [
        x,
        y,
    ]

def comprehensions(xs):
    a = [x * 2 for x in xs if x]
    b = {x: y for x, y in zip(xs,
                               xs)}
    c = {x for x in xs}
    d = sum(x
            for x in xs)
    return a, b, c, d

def exceptions(f):
    try:
        f()
    except ValueError as e:
        print(e)
    except (TypeError,
            KeyError):
        pass
    else:
        return 1
    finally:
        print("done")
    with open(f) as fh, \\
            open(f) as gh:
        return fh.read() + gh.read()

class Klass:
    attr = 1

    def method(self):
        return lambda y: (y +
                          self.attr)

    @staticmethod
    def gen(n):
        for i in range(n):
            yield i
            yield from range(i)

async def coro(x):
    await x
    async with x as y:
        async for z in y:
            pass
''',
    # A long function: more than 255 lines and far more than 127 between two lines.
    "def longfunc(x):\n"
    + "".join("    x = x + %d\n" % i for i in range(300))
    + "\n" * 300
    + "    return x\n",
    # Lines very far apart (multi-group varints) and back again.
    "def far(x):\n    y = x\n" + "\n" * 20000 + "    z = (y,\n" + "\n" * 9000 + "         x)\n    return z\n",
    # Long lines: wide columns and more bytecode than one table entry covers.
    "def wide(a):\n    return " + " + ".join("a[%d]" % i for i in range(120)) + "\n",
    "def deep(a):\n    return " + "(" * 40 + "a" + " + 1)" * 40 + "\n",
    # A negative jump: a loop whose test sits above its body.
    '''\
def backwards(n):
    i = 0
    while (i <
           n):
        i = (i
             + 1)
    return [i
            for j in range(n)
            if j]
''',
]

MATCH = '''\
def matcher(cmd):
    match cmd:
        case [x, y]:
            return x
        case {"k": v}:
            return v
        case _:
            return None
'''


def source():
    parts = list(PARTS)
    if sys.version_info >= (3, 10):
        parts.append(MATCH)
    return "\n".join(parts) + "\nsimple(1, 2)\n"


def runs(values):
    """Run-length encodes a per-unit list of lines as `start-end:line` items."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            v = values[start]
            out.append("%d-%d:%s" % (start, i, "-" if v is None else v))
            start = i
    return " ".join(out)


def addr2line(code, nunits):
    f = ctypes.pythonapi.PyCode_Addr2Line
    f.argtypes = [ctypes.py_object, ctypes.c_int]
    f.restype = ctypes.c_int
    out = []
    for u in range(nunits):
        line = f(code, 2 * u)
        out.append(None if line < 0 else line)
    return out


def colines(code, nunits):
    out = [None] * nunits
    if hasattr(code, "co_lines"):
        for start, end, line in code.co_lines():
            for u in range(start // 2, min(end // 2, nunits)):
                out[u] = line
        return out
    starts = list(dis.findlinestarts(code))
    for k, (off, line) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else 2 * nunits
        for u in range(off // 2, min(end // 2, nunits)):
            out[u] = line
    return out


def walk(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from walk(c)


def main():
    code = compile(source(), "sample.py", "exec")
    v = sys.version_info
    print("# python %d.%d.%d %s" % (v[0], v[1], v[2], sys.executable))
    for c in walk(code):
        nunits = len(c.co_code) // 2
        table = c.co_linetable if v >= (3, 10) else c.co_lnotab
        name = getattr(c, "co_qualname", c.co_name)
        print("code %s first=%d units=%d table=%s" % (name, c.co_firstlineno, nunits, table.hex()))
        a, b = runs(addr2line(c, nunits)), runs(colines(c, nunits))
        print("addr2line " + a)
        # The two agree on every interpreter seen so far: "=" keeps the files small.
        print("colines " + ("=" if a == b else b))


main()
