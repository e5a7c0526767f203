"""What deploy/seccomp/ember.json must refuse, tried from inside it (issue 58).

  seccomp_run.py deploy/seccomp/ember.json -- python3 seccomp_probe.py

Exits 0 when: unshare(CLONE_NEWUSER), unshare(CLONE_NEWNET), setns, clone with
CLONE_NEWUSER and socket(AF_PACKET) and socket(AF_NETLINK) fail with EPERM, clone3 fails
with ENOSYS (so libc falls back to clone, as under runtimes' default profiles), while a plain
fork (clone without namespace flags) and sockets of AF_UNIX, AF_INET and AF_INET6 work.
Prints one line per check; the first failure exits 1.
"""

import ctypes
import errno
import os
import socket
import sys

libc = ctypes.CDLL(None, use_errno=True)
SYS_CLONE3 = {"x86_64": 435, "aarch64": 435}[os.uname().machine]
SYS_CLONE = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIGCHLD = 17


def fails(name, want, call):
    r = call()
    e = ctypes.get_errno() if r == -1 else None
    ok = r == -1 and e == want
    print(f"{'ok  ' if ok else 'FAIL'} {name}: returned {r}, errno {e} (want {errno.errorcode[want]})")
    if not ok:
        if r == 0 and name.startswith("clone"):
            os._exit(0)  # the child of a clone that should not have happened
        sys.exit(1)


def sock(family, kind=socket.SOCK_STREAM):
    try:
        socket.socket(family, kind).close()
        return 0
    except OSError as e:
        ctypes.set_errno(e.errno)
        return -1


fails("unshare(CLONE_NEWUSER)", errno.EPERM, lambda: libc.unshare(CLONE_NEWUSER))
fails("unshare(CLONE_NEWNET)", errno.EPERM, lambda: libc.unshare(CLONE_NEWNET))
fails("setns(0, 0)", errno.EPERM, lambda: libc.setns(0, 0))
fails("clone(CLONE_NEWUSER)", errno.EPERM,
      lambda: libc.syscall(SYS_CLONE, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0))
fails("clone3", errno.ENOSYS, lambda: libc.syscall(SYS_CLONE3, 0, 0))
fails("socket(AF_PACKET)", errno.EPERM, lambda: sock(socket.AF_PACKET, socket.SOCK_RAW))
fails("socket(AF_NETLINK)", errno.EPERM, lambda: sock(socket.AF_NETLINK, socket.SOCK_RAW))
for fam in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6):
    if sock(fam) != 0:
        print(f"FAIL socket({fam!r}) refused: errno {ctypes.get_errno()}")
        sys.exit(1)
    print(f"ok   socket({fam!r}) works")
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print("ok   fork (clone without namespace flags) works")
