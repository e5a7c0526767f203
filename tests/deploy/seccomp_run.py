"""Runs a command under a Kubernetes/OCI seccomp profile (JSON), as a container runtime would.

  seccomp_run.py PROFILE.json -- COMMAND [ARGS...]

Loads the profile's default action and its SCMP_ACT_ALLOW names with libseccomp
(python3-seccomp; names unknown on this architecture are skipped, as runtimes do), then
execs COMMAND. tests/deploy/check.sh uses it to run ember under deploy/seccomp/ember.json.
"""

import json
import os
import sys

import seccomp


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    profile = json.load(open(sys.argv[1]))
    if profile["defaultAction"] != "SCMP_ACT_ERRNO":
        sys.exit(f"unexpected defaultAction {profile['defaultAction']}")
    f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(profile.get("defaultErrnoRet", 1)))
    for rule in profile["syscalls"]:
        if rule["action"] != "SCMP_ACT_ALLOW" or rule.get("args"):
            sys.exit(f"unsupported rule {rule}")
        for name in rule["names"]:
            try:
                f.add_rule(seccomp.ALLOW, name)
            except (RuntimeError, ValueError):
                pass  # not a syscall on this architecture
    f.load()
    os.execvp(sys.argv[3], sys.argv[3:])


main()
