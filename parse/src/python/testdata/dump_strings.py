#!/usr/bin/env python3
"""Dump the memory of str objects as this interpreter lays them out, for ember's string
decoder (parse/src/python/unicode.rs). Run by each interpreter (3.8-3.13):

    python3.X dump_strings.py > strings-3.X.txt

First line: `# python X.Y.Z ascii=<PyASCIIObject size> compact=<PyCompactUnicodeObject size>`
(from sys.getsizeof), then one line per string:

    str <name> <code points, hex, comma-separated, or -> <object bytes, hex>
    head <name> <expected> <the first 80 bytes, hex>

`str` objects are read whole (header and characters); `head` ones only their header, for
long strings (expected `bytes=N` of characters) and strings the decoder must refuse
(`long`: over 4096 code points, `legacy`: non-compact).
"""

import ctypes
import sys


class Sub(str):
    """Instances of str subclasses are legacy (non-compact) strings."""


STRINGS = [
    ("empty", ""),
    ("one", "a"),
    ("ident", sys.intern("hello_world")),
    ("path", "/usr/lib/python3/dist-packages/some/module.py"),
    ("latin1", "caf\xe9 na\xefve \xff"),
    ("bmp", "\u0100\u0101 \u65e5\u672c\u8a9e \uffff"),
    ("astral", "a\U0001F600b\U0010FFFF"),
    ("surrogate2", "x\udc80y"),
    ("surrogate4", "\U0001F600\udcff"),
]

HEADS = [
    ("max_ascii", "bytes=4096", "z" * 4096),
    ("max_ucs4", "bytes=16384", "\U0001F600" * 4096),
    ("too_long", "long", "q" * 4097),
    ("too_long_ucs2", "long", "\u0100" * 5000),
    ("legacy", "legacy", Sub("abc")),
    ("legacy_ucs2", "legacy", Sub("\u0100bc")),
]


def main():
    v = sys.version_info
    ascii_size = sys.getsizeof("") - 1
    # A fresh string: literals may carry a cached UTF-8 copy, which getsizeof counts.
    compact_size = sys.getsizeof("".join(["\xe9", "x"])) - 3
    print("# python %d.%d.%d ascii=%d compact=%d" % (v[0], v[1], v[2], ascii_size, compact_size))
    for name, s in STRINGS:
        points = ",".join("%x" % ord(c) for c in s) or "-"
        raw = ctypes.string_at(id(s), sys.getsizeof(s))
        print("str %s %s %s" % (name, points, raw.hex()))
    for name, err, s in HEADS:
        print("head %s %s %s" % (name, err, ctypes.string_at(id(s), 80).hex()))


main()
