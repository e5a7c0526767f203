"""Measures, inside the running interpreter, the offsets ember's `layout_for` tables claim.

Run by `parse/src/python/layout_tests.rs` under every CPython on the machine (3.8 to 3.13),
unchanged. Each offset is found by searching live objects' memory for a value known from
Python (an object's id, a length, a thread id), never taken from a table, then checked
through a second route where one exists. Prints one `name value` line per offset (`none`
for a field the version does not have); exits non-zero with a message when a check fails.

Memory is read with pread on /proc/self/mem: a wrong guess at a pointer reads nothing
instead of crashing the interpreter.
"""

import ctypes
import os
import struct
import sys
import threading

MEM = os.open("/proc/self/mem", os.O_RDONLY)
V = sys.version_info[:2]


def read(addr, n):
    try:
        b = os.pread(MEM, n, addr)
    except OSError:
        return None
    return b if len(b) == n else None


def word(addr):
    b = read(addr, 8)
    return None if b is None else struct.unpack("<Q", b)[0]


def u32(addr):
    b = read(addr, 4)
    return None if b is None else struct.unpack("<I", b)[0]


def fail(msg):
    sys.stderr.write("offsets.py: %s\n" % msg)
    sys.exit(1)


def only(what, hits):
    """The single hit of a search, or a failure naming the ambiguity."""
    if len(hits) != 1:
        fail("%s: expected one hit, found %r" % (what, hits))
    return hits[0]


def words_equal(base, span, value, step=8):
    return [i for i in range(0, span, step) if word(base + i) == value]


# PyTypeObject (x86-64, unchanged 3.8-3.13): tp_name @24, tp_basicsize @32, tp_members @240.
def check_type_header(t):
    name = read(word(id(t) + 24), len(t.__name__))
    if name is None or name.decode() != t.__name__.split(".")[-1][: len(name)]:
        fail("tp_name of %s" % t)
    if word(id(t) + 32) != t.__basicsize__:
        fail("tp_basicsize of %s" % t)


def members(t):
    """name -> offset from the type's PyMemberDef array (name, type, offset, flags, doc)."""
    out = {}
    at = word(id(t) + 240)
    for _ in range(256):
        name_ptr = word(at)
        if not name_ptr:
            break
        name = ctypes.string_at(name_ptr).decode()
        out[name] = struct.unpack("<q", read(at + 16, 8))[0]
        at += 40
    return out


def emit(name, value):
    print("%s %s" % (name, "none" if value is None else value))


CodeType = type(emit.__code__)
FrameType = type(sys._getframe())


def measure_code():
    check_type_header(CodeType)
    m = members(CodeType)
    co = measure_code.__code__
    checks = {"co_filename": id(co.co_filename), "co_name": id(co.co_name)}
    if "co_qualname" in m:
        checks["co_qualname"] = id(co.co_qualname)
    table = "co_linetable" if "co_linetable" in m else "co_lnotab"
    checks[table] = id(getattr(co, table))
    for name, want in checks.items():
        if word(id(co) + m[name]) != want:
            fail("%s at %d does not hold the object" % (name, m[name]))
    if struct.unpack("<i", read(id(co) + m["co_firstlineno"], 4))[0] != co.co_firstlineno:
        fail("co_firstlineno")
    emit("code_firstlineno", m["co_firstlineno"])
    emit("code_filename", m["co_filename"])
    emit("code_name", m["co_name"])
    emit("code_qualname", m.get("co_qualname"))
    emit("code_linetable", m[table])
    # 3.11+: the code units follow the fixed part; the frame check below confirms it.
    emit("code_adaptive", CodeType.__basicsize__ if V >= (3, 11) else None)
    emit("code_size", CodeType.__basicsize__)


def measure_strings():
    ascii_s = "".join(chr(97 + i % 26) for i in range(98765))
    latin = "\xe9" + "".join(chr(97 + i % 26) for i in range(4321))
    ucs2 = "\u20ac" + "xyz" * 100
    ucs4 = "\U0001f600" + "xyz" * 100
    emit("unicode_length", only("str length", words_equal(id(ascii_s), 64, len(ascii_s))))
    head = ascii_s[:32].encode()
    emit("unicode_ascii_data", only("ascii data", [i for i in range(16, 128, 8) if read(id(ascii_s) + i, 32) == head]))
    compact = [i for i in range(16, 128, 8) if read(id(latin) + i, 32) == latin[:32].encode("latin-1")]
    compact = only("compact data", compact)
    emit("unicode_compact_data", compact)
    for s, enc in ((ucs2, "utf-16-le"), (ucs4, "utf-32-le")):
        if read(id(s) + compact, 16) != s[:16].encode(enc)[:16]:
            fail("compact data of a %s string" % enc)
    # state: interned:2, kind:3, compact:1, ascii:1.
    def fits(i):
        for s, kind, asc in ((ascii_s, 1, 1), (latin, 1, 0), (ucs2, 2, 0), (ucs4, 4, 0)):
            v = u32(id(s) + i)
            if v is None or (v >> 2) & 7 != kind or (v >> 5) & 1 != 1 or (v >> 6) & 1 != asc:
                return False
        return True
    emit("unicode_state", only("str state", [i for i in range(16, 64, 4) if fits(i)]))
    b = bytes(range(256)) * 77
    emit("bytes_size", only("bytes size", words_equal(id(b), 32, len(b))))
    data = bytes.__basicsize__ - 1
    if read(id(b) + data, 64) != b[:64]:
        fail("bytes data at tp_basicsize - 1")
    emit("bytes_data", data)


def tstate():
    f = ctypes.pythonapi.PyThreadState_Get
    f.restype = ctypes.c_void_p
    return f()


def iframe(frame):
    """3.11+: the _PyInterpreterFrame of a frame object (f_frame, the word after f_back)."""
    p = word(id(frame) + 24)
    # The interpreter frame points back at its frame object (frame_obj, somewhere in its head).
    if not words_equal(p, 64, id(frame)):
        fail("f_frame of a frame object")
    return p


def frame_fields_objects(frame, caller):
    check_type_header(FrameType)
    m = members(FrameType)
    if word(id(frame) + m["f_back"]) != id(caller) or word(id(frame) + m["f_code"]) != id(frame.f_code):
        fail("f_back/f_code")
    # f_lasti: a member up to 3.9; 3.10 stores code units and exposes bytes via a getter.
    lasti = frame.f_lasti if V < (3, 10) else frame.f_lasti // 2
    hits = [i for i in range(48, 128, 4) if u32(id(frame) + i) == lasti and u32(id(caller) + i) == (caller.f_lasti if V < (3, 10) else caller.f_lasti // 2)]
    if "f_lasti" in m and m["f_lasti"] not in hits:
        fail("f_lasti member")
    emit("frame_code", m["f_code"])
    emit("frame_previous", m["f_back"])
    emit("frame_instr", only("f_lasti", hits))


def frame_fields_interp(frame, caller):
    p, q = iframe(frame), iframe(caller)
    code = only("frame code", words_equal(p, 72, id(frame.f_code)))
    emit("frame_code", code)
    emit("frame_previous", only("frame previous", words_equal(p, 72, q)))
    base = id(frame.f_code) + CodeType.__basicsize__
    instr = only("frame instr", [i for i in range(0, 72, 8) if (word(p + i) or 0) - base == frame.f_lasti])
    emit("frame_instr", instr)
    if (word(q + instr) or 0) - (id(caller.f_code) + CodeType.__basicsize__) != caller.f_lasti:
        fail("caller's instruction pointer")
    return p, q


def owner_fields(entry_frame):
    """3.11: the is_entry byte; 3.12+: the owner byte of the C-stack shim frame. Runs while
    `entry_frame`, a callback called from C, is live (its caller is Python)."""
    callee = iframe(entry_frame)
    caller = iframe(entry_frame.f_back)
    if V == (3, 11):
        normal = iframe(sys._getframe())
        hits = [i for i in range(60, 72) if read(callee + i, 1) == b"\x01" and read(normal + i, 1) == b"\x00"]
        return only("is_entry", hits), 0
    # The callee's previous is the shim the C call pushed; the shim's previous is the caller.
    prev = word(callee + 8)
    if prev == caller or word(prev + 8) != caller:
        fail("no C-stack frame between a callback and its caller")
    shim_code = word(prev)
    if V >= (3, 13):
        if shim_code != id(None):
            fail("3.13 shim executable is not None")
    elif word(shim_code + 8) != id(CodeType):
        fail("3.12 shim code is not a code object")
    hits = [i for i in range(60, 72) if read(prev + i, 1) == b"\x03" and read(callee + i, 1) == b"\x00"]
    return only("owner", hits), 3


def callback(x, out):
    if V >= (3, 11):
        out.append(owner_fields(sys._getframe(1)))
    return x


def frame_hits(ts):
    """Where the thread state leads to the current frame: (offset, None) for a word that
    is the frame, (offset, k) for a word pointing at one whose word k is. The frame is
    this function's while it runs no Python function, so the state and what its words
    point at are read with C calls only (a Python callee would leave its frame, whose
    `previous` is this one, past the top of the frame stack)."""
    me = sys._getframe()
    snap = os.pread(MEM, 256, ts)
    under = []
    for w in struct.unpack("<32Q", snap):
        try:
            under.append(os.pread(MEM, 24, w))
        except (OSError, OverflowError):
            under.append(b"")
    cur = id(me) if V < (3, 11) else iframe(me)
    hits = set()
    for i, w in enumerate(struct.unpack("<32Q", snap)):
        if w == cur:
            hits.add((i * 8, None))
        b = under[i]
        for k in range(0, len(b) - 7, 8):
            if struct.unpack_from("<Q", b, k)[0] == cur:
                hits.add((i * 8, k))
    return hits


def deeper(n):
    return frame_hits(tstate()) if n == 0 else deeper(n - 1)


def measure_frames():
    me = sys._getframe()
    caller = me.f_back
    if V < (3, 11):
        frame_fields_objects(caller, caller.f_back)
    else:
        frame_fields_interp(caller, caller.f_back)
    seen = []
    sorted([2, 1], key=lambda x: callback(x, seen))
    owner, cstack = seen[0] if seen else (0, 0)
    emit("frame_owner", owner)
    emit("owner_cstack", cstack)
    # Stale words can point at a frame by chance: keep what holds at three depths.
    hits = frame_hits(tstate()) & deeper(1) & deeper(5)
    direct = [h for h in hits if h[1] is None]
    i, k = only("tstate frame", direct or sorted(hits))
    emit("tstate_frame", i)
    emit("cframe_current", k)


def thread_ids(out):
    ts = tstate()
    out["thread_id"] = words_equal(ts, 256, threading.get_ident())
    native = getattr(threading, "get_native_id", None)
    out["native"] = words_equal(ts, 256, native()) if native else []


def measure_threads():
    main, other = {}, {}
    thread_ids(main)
    t = threading.Thread(target=thread_ids, args=(other,))
    t.start()
    t.join()
    emit("tstate_thread_id", only("thread_id", [i for i in main["thread_id"] if i in other["thread_id"]]))
    native = [i for i in main["native"] if i in other["native"]]
    emit("tstate_native_id", only("native_thread_id", native) if V >= (3, 11) else (native or [None])[0])


def measure_runtime():
    rt = ctypes.addressof(ctypes.c_void_p.in_dll(ctypes.pythonapi, "_PyRuntime"))
    libc = ctypes.CDLL(None)
    libc.pthread_getspecific.restype = ctypes.c_void_p
    libc.pthread_getspecific.argtypes = [ctypes.c_uint]
    gil = ctypes.pythonapi.PyGILState_GetThisThreadState
    gil.restype = ctypes.c_void_p
    me = gil()
    if me != tstate():
        fail("PyGILState_GetThisThreadState is not the thread state")
    # The key's value is often 0 or 1, so (1, key) pairs abound: a candidate is the key
    # only if PyGILState_GetThisThreadState follows it when its key is swapped for
    # another one holding a sentinel. Swapped in a forked child: a wrong candidate may
    # be anything, and may crash what it belongs to.
    k2 = ctypes.c_uint()
    if libc.pthread_key_create(ctypes.byref(k2), None) != 0:
        fail("pthread_key_create")
    libc.pthread_setspecific.argtypes = [ctypes.c_uint, ctypes.c_void_p]
    libc.pthread_setspecific(k2.value, 0x5151)
    hits = []
    for i in range(0, 0x2000, 4):
        init, key = u32(rt + i), u32(rt + i + 4)
        if init != 1 or key is None or key >= 1024 or libc.pthread_getspecific(key) != me:
            continue
        child = os.fork()
        if child == 0:
            ctypes.c_uint.from_address(rt + i + 4).value = k2.value
            os._exit(0 if gil() == 0x5151 else 1)
        if os.waitpid(child, 0)[1] == 0:
            hits.append(i)
    autotss = only("autoTSSkey", hits)
    key = u32(rt + autotss + 4)
    # The key maps each thread to its own state: check on a second thread.
    other = []
    t = threading.Thread(target=lambda: other.append((libc.pthread_getspecific(key), tstate())))
    t.start()
    t.join()
    if other[0][0] != other[0][1] or other[0][1] == me:
        fail("autoTSSkey on a second thread")
    emit("runtime_autotss", autotss)
    # gilstate.tstate_current (up to 3.11): the GIL holder, in the 64 bytes before the key.
    # Read with ctypes, which keeps the GIL (os.pread releases it: the field reads 0).
    near = [i for i in range(0, 64, 8) if ctypes.c_void_p.from_address(rt + autotss - 64 + i).value == me]
    emit("runtime_tstate_current", autotss - 64 + near[0] if len(near) == 1 else None)


def measure_chain():
    """Where the attach check finds the main thread's state: `_PyRuntime` -> newest
    interpreter -> newest thread state -> `next` ... -> the main thread's (the oldest).
    Measured with a second thread alive, so the newest state is not the main one."""
    rt = ctypes.addressof(ctypes.c_void_p.in_dll(ctypes.pythonapi, "_PyRuntime"))
    head = ctypes.pythonapi.PyInterpreterState_Head
    head.restype = ctypes.c_void_p
    interp = head()
    # interpreters.head, then interpreters.main: the same interpreter here.
    hits = words_equal(rt, 0x1000, interp)
    pairs = [i for i in hits if i + 8 in hits]
    if not pairs:
        fail("interpreters.head/main in _PyRuntime: %r" % hits)
    main_ts = tstate()
    ready, done, other = threading.Event(), threading.Event(), []

    def run():
        other.append(tstate())
        ready.set()
        done.wait()

    t = threading.Thread(target=run)
    t.start()
    ready.wait()
    newest = other[0]
    try:
        thread_head = ctypes.pythonapi.PyInterpreterState_ThreadHead
        thread_head.restype = ctypes.c_void_p
        thread_head.argtypes = [ctypes.c_void_p]
        if thread_head(interp) != newest:
            fail("the newest thread state is not the list's head")
        threads = words_equal(interp, 0x4000, newest)
        nxt = [i for i in words_equal(newest, 256, main_ts) if word(main_ts + i) == 0]
    finally:
        done.set()
        t.join()
    emit("runtime_interp_head", pairs[0])
    emit("interp_threads_head", threads[0] if threads else None)
    emit("tstate_next", only("tstate next", nxt))


def main():
    print("version %d.%d.%d" % sys.version_info[:3])
    measure_code()
    measure_strings()
    measure_frames()
    measure_threads()
    measure_runtime()
    measure_chain()


if __name__ == "__main__":
    main()
